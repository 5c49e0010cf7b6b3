//! The one clock that kernel and user space share: CLOCK_MONOTONIC in ns.
//! BPF programs stamp events with `bpf_ktime_get_ns()`, which reads this very
//! clock, so a stamp from a ring-buffer record, a window of the net sensor,
//! a sched reading and the load generator's send and receive instants can be
//! compared and subtracted directly. Read it here, nowhere else.

/// Now on CLOCK_MONOTONIC, in ns: the clock of `bpf_ktime_get_ns()`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec that we own; CLOCK_MONOTONIC
    // is always supported on Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_forward_at_least_as_far_as_a_sleep() {
        // A sleep lasts at least its length on CLOCK_MONOTONIC (what
        // nanosleep measures), so this cannot fail on a loaded machine.
        let a = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = monotonic_ns();
        assert!(b >= a + 20_000_000, "slept 20 ms, clock moved {} ns", b - a);
    }
}
