//! The contract with `bpf/requests.h`: its constants, the layout of the
//! record and map types the skeletons generate (pinned here with const
//! asserts, as the C side pins them with `_Static_assert`s), and the
//! byte views that read and write them. The tracer thread, the kernel
//! histograms and the per-target statistics all take them from here.

use std::mem::{offset_of, size_of};

use super::hooks::{sock_skel, sys_skel};

use sock_skel::types::sock_state;
use sys_skel::types::{conn_key, conn_state, port_key, req_record, target_cfg};

// Constants of bpf/requests.h.
pub(super) const REC_TURN: u8 = 1;
pub(super) const REC_CONN: u8 = 2;
pub(super) const REC_GRPC: u8 = 3;
pub(super) const REC_H2: u8 = 4;
pub(super) const EMIT_TURN: u8 = 1;
pub(super) const EMIT_CONN: u8 = 2;
pub(super) const EMIT_H2: u8 = 4;
pub(super) const CNT_LOST: u32 = 0;
pub(super) const CNT_GAVE_UP: u32 = 2;
pub(super) const CNT_BY_TURNS: u32 = 3;
pub(super) const TGID_WORDS: u32 = 65536;
pub(super) const ST_IDLE: u8 = 0;
pub(super) const ST_RESPONDING: u8 = 2;
/// sock_state.by_reply: requests end at their own replies (replies.h).
pub(super) const BY_REPLY_ON: u8 = 1;
/// conn_id of connections seeded from /proc (see requests.bpf.c).
pub(super) const SEEDED_ID_BIT: u64 = 1 << 63;

// The layout of bpf/requests.h, pinned on this side too (the C side has
// _Static_asserts with the same figures).
const _: () = {
    assert!(size_of::<req_record>() == 48);
    assert!(size_of::<req_record>() as u32 + 8 == super::RECORD_FOOTPRINT);
    assert!(offset_of!(req_record, start_ns) == 0);
    assert!(offset_of!(req_record, end_ns) == 8);
    assert!(offset_of!(req_record, conn_id) == 16);
    assert!(offset_of!(req_record, tgid) == 24);
    assert!(offset_of!(req_record, fd) == 28);
    assert!(offset_of!(req_record, turns) == 32);
    assert!(offset_of!(req_record, kind) == 36);
    assert!(offset_of!(req_record, nreq) == 38);
    assert!(offset_of!(req_record, arrive_ns) == 40);
    assert!(size_of::<sock_state>() == 120);
    assert!(offset_of!(sock_state, by_reply) == 112);
    assert!(size_of::<sock_skel::types::reply_fifo>() == 816);
    assert!(offset_of!(sock_state, nlater) == 70);
    assert!(offset_of!(sock_state, read_arrive_ns) == 88);
    assert!(offset_of!(sock_state, nreq) == 68);
    assert!(offset_of!(sock_state, tgid) == 56);
    assert!(offset_of!(sock_state, state) == 66);
    assert!(size_of::<sock_skel::types::req_record>() == 48);
    assert!(size_of::<conn_key>() == 8);
    assert!(size_of::<conn_state>() == 64);
    assert!(offset_of!(conn_state, nreq) == 40);
    assert!(offset_of!(conn_state, state) == 38);
    assert!(size_of::<target_cfg>() == 8);
    assert!(offset_of!(target_cfg, root) == 4);
    assert!(size_of::<port_key>() == 8);
};

/// Views a plain-old-data BPF type as bytes for map updates.
pub(super) fn bytes_of<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: T is one of the #[repr(C)] integer-only skeleton types; every
    // byte is initialised (explicit padding fields) and the slice borrows v.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

/// Reads a plain-old-data BPF type from bytes (unaligned).
pub(crate) fn read_pod<T: Copy + Default>(data: &[u8]) -> Option<T> {
    if data.len() < size_of::<T>() {
        return None;
    }
    let mut v = T::default();
    // SAFETY: T is #[repr(C)] made of integers (any bit pattern is valid),
    // and data holds at least size_of::<T>() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            data.as_ptr(),
            (&mut v as *mut T).cast::<u8>(),
            size_of::<T>(),
        )
    };
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_through_bytes() {
        let r = req_record {
            start_ns: 1,
            end_ns: 2,
            conn_id: 3,
            tgid: 4,
            fd: 5,
            turns: 6,
            kind: REC_CONN,
            pad: 0,
            nreq: 8,
            arrive_ns: 7,
        };
        let back: req_record = read_pod(bytes_of(&r)).unwrap();
        assert_eq!(
            (
                back.start_ns,
                back.end_ns,
                back.conn_id,
                back.tgid,
                back.fd,
                back.turns,
                back.kind,
                back.arrive_ns,
                back.nreq
            ),
            (1, 2, 3, 4, 5, 6, REC_CONN, 7, 8)
        );
        assert!(read_pod::<req_record>(&[0u8; 47]).is_none());
    }

    #[test]
    fn ring_sized_from_the_records_it_must_hold() {
        use super::super::ringbuf_bytes_for;
        assert_eq!(ringbuf_bytes_for(1170), 64 * 1024); // 65 520 bytes
        assert_eq!(ringbuf_bytes_for(1171), 128 * 1024);
        assert_eq!(ringbuf_bytes_for(1200), 128 * 1024);
        assert_eq!(ringbuf_bytes_for(0), 4096);
        assert_eq!(ringbuf_bytes_for(u32::MAX), super::super::MAX_RINGBUF_BYTES);
    }
}
