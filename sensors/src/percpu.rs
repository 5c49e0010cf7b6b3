//! Counters that BPF programs keep in a per-CPU array (one u64 per CPU
//! per slot, so that no two CPUs write one cache line), read from
//! userspace as one sum per slot.

use libbpf_rs::{MapCore, MapFlags};

/// The sum over CPUs of each of the first `n` u64 slots of a per-CPU
/// array map; a slot the map does not hold reads 0.
pub fn sum_u64_slots(map: &impl MapCore, n: usize) -> libbpf_rs::Result<Vec<u64>> {
    (0..n as u32)
        .map(|i| {
            let per_cpu = map
                .lookup_percpu(&i.to_ne_bytes(), MapFlags::ANY)?
                .unwrap_or_default();
            Ok(per_cpu
                .iter()
                .filter_map(|b| b.as_slice().try_into().ok().map(u64::from_ne_bytes))
                .sum())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use libbpf_rs::{MapHandle, MapType};

    use super::*;

    /// A real per-CPU array (root): each slot is the sum of what every
    /// CPU holds in it.
    #[test]
    fn slots_are_summed_over_cpus() {
        let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>()
                as libbpf_rs::libbpf_sys::size_t,
            ..Default::default()
        };
        let map = MapHandle::create(MapType::PercpuArray, Some("qosd_t_percpu"), 4, 8, 3, &opts)
            .expect("creating a per-CPU array (needs root)");
        let cpus = libbpf_rs::num_possible_cpus().unwrap();
        let per_cpu: Vec<Vec<u8>> = (0..cpus)
            .map(|c| (10 * c as u64 + 1).to_ne_bytes().to_vec())
            .collect();
        map.update_percpu(&1u32.to_ne_bytes(), &per_cpu, MapFlags::ANY)
            .unwrap();
        let want: u64 = (0..cpus).map(|c| 10 * c as u64 + 1).sum();
        assert_eq!(sum_u64_slots(&map, 3).unwrap(), vec![0, want, 0]);
    }
}
