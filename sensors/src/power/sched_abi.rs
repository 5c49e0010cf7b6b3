//! The contract with bpf/sched.bpf.c: the skeleton, its record types
//! (`bpf/sched.h`) with size/offset assertions mirroring the C
//! `_Static_assert`s, the header's constants, and plain-bytes conversion.

use std::mem::{offset_of, size_of};

#[allow(clippy::all, dead_code, non_camel_case_types, unused_qualifications)]
#[allow(clippy::undocumented_unsafe_blocks)]
pub(super) mod skel {
    include!(concat!(env!("OUT_DIR"), "/sched.skel.rs"));
}

/// `struct thread_stats` of bpf/sched.h, from the skeleton.
pub type ThreadStats = skel::types::thread_stats;
/// `struct cpu_state` of bpf/sched.h, from the skeleton.
pub type CpuState = skel::types::cpu_state;

// The C side pins these with _Static_assert in bpf/sched.h. Sizes equal to
// the sum of the fields also prove there is no padding (see `as_bytes`).
const _: () = {
    assert!(size_of::<ThreadStats>() == 40);
    assert!(offset_of!(ThreadStats, on_ns) == 0);
    assert!(offset_of!(ThreadStats, sib_busy_ns) == 8);
    assert!(offset_of!(ThreadStats, cycles) == 16);
    assert!(offset_of!(ThreadStats, nr_switches) == 24);
    assert!(offset_of!(ThreadStats, tgid) == 32);
    assert!(offset_of!(ThreadStats, flags) == 36);
    assert!(size_of::<CpuState>() == 56);
    assert!(offset_of!(CpuState, start_ns) == 0);
    assert!(offset_of!(CpuState, start_cycles) == 8);
    assert!(offset_of!(CpuState, busy_acc_ns) == 16);
    assert!(offset_of!(CpuState, sib_busy_at_start) == 24);
    assert!(offset_of!(CpuState, tid) == 32);
    assert!(offset_of!(CpuState, tgid) == 36);
    assert!(offset_of!(CpuState, sibling) == 40);
    assert!(offset_of!(CpuState, pad) == 44);
    assert!(offset_of!(CpuState, rq) == 48);
};

/// bpf/sched.h constants.
pub const NO_SIBLING: u32 = 0xffff_ffff;
pub const THR_DEAD: u32 = 1;
pub(super) const CNT_SWITCHES: u32 = 0;
pub(super) const CNT_TABLE_FULL: u32 = 1;
pub(super) const CNT_CYCLES_ERR: u32 = 2;
pub(super) const CNT_UNMATCHED: u32 = 3;
pub(super) const CNT_NO_CLOCK: u32 = 4;

/// The record types: `#[repr(C)]`, integer fields only, no padding.
///
/// # Safety
/// Implementors must have every bit pattern valid and no padding bytes.
pub(super) unsafe trait Plain: Copy {}
// SAFETY: integer fields only; size == sum of fields (asserted above).
unsafe impl Plain for ThreadStats {}
// SAFETY: integer fields only; size == sum of fields (asserted above).
unsafe impl Plain for CpuState {}

pub(super) fn from_bytes<T: Plain>(b: &[u8]) -> Option<T> {
    // SAFETY: the length is checked, T accepts any bit pattern (Plain), and
    // read_unaligned has no alignment requirement.
    (b.len() == size_of::<T>()).then(|| unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) })
}

pub(super) fn as_bytes<T: Plain>(v: &T) -> &[u8] {
    // SAFETY: `v` is a valid T of size_of::<T>() bytes with no padding
    // (Plain), so every byte is initialised; the slice borrows `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast(), size_of::<T>()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_bytes() {
        let t = ThreadStats {
            on_ns: 1,
            sib_busy_ns: 2,
            cycles: 3,
            nr_switches: 4,
            tgid: 5,
            flags: 6,
        };
        let b = as_bytes(&t);
        assert_eq!(&b[32..36], &5u32.to_ne_bytes());
        let back: ThreadStats = from_bytes(b).unwrap();
        assert_eq!(
            (back.on_ns, back.cycles, back.tgid, back.flags),
            (1, 3, 5, 6)
        );
        assert!(from_bytes::<ThreadStats>(&b[1..]).is_none());
        let c = CpuState {
            start_ns: 7,
            sibling: NO_SIBLING,
            pad: 9,
            ..Default::default()
        };
        let back: CpuState = from_bytes(as_bytes(&c)).unwrap();
        assert_eq!((back.start_ns, back.sibling, back.pad), (7, NO_SIBLING, 9));
    }
}
