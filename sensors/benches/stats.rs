//! Stats engine speed: records ingested per second into a 100k window (one
//! core), and the cost of any percentile query on a full 100k window.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use qosd_sensors::stats::Window;
use rand::{Rng, SeedableRng};

const WINDOW: usize = 100_000;

/// Latencies spread like a real service: mostly tens of µs, a long tail.
fn latencies(n: usize) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    (0..n)
        .map(|_| {
            let u: f64 = rng.gen_range(0.0001..1.0);
            (20_000.0 / u.powf(0.7)) as u64
        })
        .collect()
}

fn full_window() -> Window {
    let mut w = Window::new(WINDOW);
    for (i, v) in latencies(WINDOW).into_iter().enumerate() {
        w.push(i as u64 * 10_000, v);
    }
    w
}

fn ingest(c: &mut Criterion) {
    let batch = latencies(1 << 20);
    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(batch.len() as u64));
    g.bench_function("push 1M records into a full 100k window", |b| {
        b.iter_batched_ref(
            full_window,
            |w| {
                for (i, &v) in batch.iter().enumerate() {
                    w.push(i as u64, v);
                }
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn query(c: &mut Criterion) {
    let w = full_window();
    let mut g = c.benchmark_group("query");
    for p in [50.0, 99.0, 99.9] {
        g.bench_function(format!("p{p} of a 100k window"), |b| {
            b.iter(|| black_box(w.percentile(black_box(p))))
        });
    }
    g.bench_function("mean of a 100k window", |b| b.iter(|| black_box(w.mean())));
    g.bench_function("rps of a 100k window", |b| {
        b.iter(|| black_box(w.rps(black_box(1_000_000_000))))
    });
    g.finish();
}

criterion_group!(benches, ingest, query);
criterion_main!(benches);
