//! The procfs sensor's cost per monitoring tick (`scenarios/bench/procfs.sh`):
//! one `sample` of a target holding N processes, N = 1, 10, 100, 1000
//! (`sleep`s this program starts, and kills when it ends), the sizes
//! interleaved round by round with a pause between ticks (a daemon's ticks
//! are 100 ms apart: no tick finds the last one's lines in the cache).
//! Prints a markdown table: µs per tick on this thread's CPU clock and on
//! the wall clock (median, quartiles), and the share of one CPU at one tick
//! every 100 ms. Usage: `procfs_tick [ROUNDS] [PAUSE_MS]` (100, 20).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qosd_core::control::Tick;
use qosd_core::measure::quantile;
use qosd_sensors::sensor::procfs::ProcfsSensor;
use qosd_sensors::sensor::{Sensor, Target};

const SIZES: [usize; 4] = [1, 10, 100, 1000];
/// The daemon's monitoring tick, ms.
const TICK_MS: f64 = 100.0;

/// The processes read; killed and reaped on drop (a panic too).
struct Sleepers(Vec<Child>);

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// This thread's CPU time, µs.
fn thread_cpu_us() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; every Linux has the clock.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
}

fn main() -> anyhow::Result<()> {
    let arg = |i: usize, d: u64| std::env::args().nth(i).map_or(Ok(d), |s| s.parse());
    let (rounds, pause_ms) = (arg(1, 100)?, arg(2, 20)?);
    // Bounded: a sleeper outlives a killed run by this much at most.
    let secs = (rounds * SIZES.len() as u64 * (pause_ms + 20) / 1000 + 60).to_string();
    let n_max = SIZES[SIZES.len() - 1];
    let mut sleepers = Sleepers(Vec::with_capacity(n_max));
    for _ in 0..n_max {
        let c = Command::new("sleep")
            .arg(&secs)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        sleepers.0.push(c);
    }
    let pids: Vec<i32> = sleepers.0.iter().map(|c| c.id() as i32).collect();
    // One sensor per size, each primed (a pid's first reading has no delta).
    let mut sensors: Vec<ProcfsSensor> = SIZES.iter().map(|_| ProcfsSensor::new("/")).collect();
    let tick = Tick {
        now_ms: 0,
        dt_s: TICK_MS / 1000.0,
        decide: false,
    };
    let target = |n: usize| Target {
        name: "app",
        pids: &pids[..n],
        ports: &[],
        serves: false,
    };
    for (s, &n) in sensors.iter_mut().zip(&SIZES) {
        s.sample(&tick, &[target(n)])?;
    }
    let mut cpu_us: Vec<Vec<f64>> = vec![Vec::new(); SIZES.len()];
    let mut wall_us: Vec<Vec<f64>> = vec![Vec::new(); SIZES.len()];
    for r in 0..rounds as usize {
        // Each round starts one size further on: no size always follows
        // the largest.
        for k in 0..SIZES.len() {
            let i = (r + k) % SIZES.len();
            std::thread::sleep(Duration::from_millis(pause_ms));
            let t = [target(SIZES[i])];
            let (c0, w0) = (thread_cpu_us(), Instant::now());
            let m = sensors[i].sample(&tick, &t)?;
            let (c1, w1) = (thread_cpu_us(), w0.elapsed());
            // Every process was read: the figure is the cost of N reads.
            let read = m.apps[0].cpu_by_pid.as_ref().map_or(0, Vec::len);
            anyhow::ensure!(read == SIZES[i], "{read} of {} pids read", SIZES[i]);
            cpu_us[i].push(c1 - c0);
            wall_us[i].push(w1.as_secs_f64() * 1e6);
        }
    }
    drop(sleepers);
    println!("| pids | CPU µs/tick: median (quartiles) | wall µs/tick: median (quartiles) | µs per pid | share of one CPU at {TICK_MS:.0} ms ticks |");
    println!("|---|---|---|---|---|");
    for (i, &n) in SIZES.iter().enumerate() {
        let q = |v: &[f64], p: f64| quantile(v, p).unwrap_or(f64::NAN);
        let (c, w) = (&cpu_us[i], &wall_us[i]);
        println!(
            "| {n} | {:.1} ({:.1}–{:.1}) | {:.1} ({:.1}–{:.1}) | {:.2} | {:.3} % |",
            q(c, 0.5),
            q(c, 0.25),
            q(c, 0.75),
            q(w, 0.5),
            q(w, 0.25),
            q(w, 0.75),
            q(c, 0.5) / n as f64,
            q(c, 0.5) / (TICK_MS * 1000.0) * 100.0
        );
    }
    println!();
    println!(
        "({rounds} rounds, {pause_ms} ms between ticks; one target holding N `sleep` processes)"
    );
    Ok(())
}
