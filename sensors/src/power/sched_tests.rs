//! Tests of the sched program's owner (`sched.rs`): open-slice arithmetic
//! and, as root, the records and slot bookkeeping through the kernel maps.

use super::*;

#[test]
fn open_slice_counts_towards_busy_time() {
    let s = CpuState {
        start_ns: 100,
        busy_acc_ns: 50,
        tid: 9,
        ..Default::default()
    };
    assert_eq!(busy_until(&s, 130), 80);
    assert_eq!(busy_until(&CpuState { tid: 0, ..s }, 130), 50, "idle");
    assert_eq!(busy_until(&s, 90), 50, "clock behind the start");
}

/// Writes every field of both records through the kernel maps of a
/// loaded (not attached) program and reads them back: the kernel's value
/// sizes and our encoding and decoding agree.
#[test]
fn root_records_round_trip_through_the_kernel() {
    let topo = CpuPackages::read(&qosd_core::sys::Root::default()).unwrap();
    let s = Sched::load(&topo, 1024, false).expect("load the sched program (root)");
    assert_eq!(s.skel.maps.cpus.max_entries() as usize, s.nr_cpus());
    let st = CpuState {
        start_ns: 1,
        start_cycles: 2,
        busy_acc_ns: 3,
        sib_busy_at_start: 4,
        tid: 5,
        tgid: 6,
        sibling: 7,
        pad: 8,
        rq: 9,
    };
    let key = 0u32.to_ne_bytes();
    s.skel
        .maps
        .cpus
        .update(&key, as_bytes(&st), MapFlags::ANY)
        .unwrap();
    let b = s
        .skel
        .maps
        .cpus
        .lookup(&key, MapFlags::ANY)
        .unwrap()
        .unwrap();
    let r: CpuState = from_bytes(&b).unwrap();
    assert_eq!(
        (
            r.start_ns,
            r.start_cycles,
            r.busy_acc_ns,
            r.sib_busy_at_start
        ),
        (1, 2, 3, 4)
    );
    assert_eq!((r.tid, r.tgid, r.sibling, r.pad, r.rq), (5, 6, 7, 8, 9));

    let tid = 4242u32;
    let vals: Vec<Vec<u8>> = (0..s.nr_cpus())
        .map(|cpu| {
            let t = ThreadStats {
                on_ns: 11 + cpu as u64,
                sib_busy_ns: 12,
                cycles: 13,
                nr_switches: 14,
                tgid: 15,
                flags: 16,
            };
            as_bytes(&t).to_vec()
        })
        .collect();
    // Take a slot off the free list as the program does.
    let pop = || {
        s.skel
            .maps
            .free_slots
            .lookup_and_delete(&[])
            .unwrap()
            .map(|b| u32::from_ne_bytes(b.as_slice().try_into().unwrap()))
    };
    let slot = pop().expect("free slots are filled at load");
    s.skel
        .maps
        .thread_slots
        .update(&tid.to_ne_bytes(), &slot.to_ne_bytes(), MapFlags::ANY)
        .unwrap();
    let m = &s.skel.maps.threads;
    m.update_percpu(&slot.to_ne_bytes(), &vals, MapFlags::ANY)
        .unwrap();
    let back = m
        .lookup_percpu(&slot.to_ne_bytes(), MapFlags::ANY)
        .unwrap()
        .unwrap();
    assert_eq!(back.len(), s.nr_cpus());
    for (cpu, b) in back.iter().enumerate() {
        let r: ThreadStats = from_bytes(b).unwrap();
        assert_eq!(
            (
                r.on_ns,
                r.sib_busy_ns,
                r.cycles,
                r.nr_switches,
                r.tgid,
                r.flags
            ),
            (11 + cpu as u64, 12, 13, 14, 15, 16)
        );
    }
    assert!(s.has_thread(tid));
    let (got_slot, t) = s.thread(tid).unwrap().unwrap();
    assert_eq!((got_slot, t.tgid, t.exited), (slot, 15, false));
    assert_eq!(t.per_cpu.len(), s.nr_cpus());

    // Freeing zeroes the slot on every CPU and hands it back to the
    // kernel's free list.
    s.free_slot(tid, slot);
    assert!(!s.has_thread(tid));
    let zeroed = m
        .lookup_percpu(&slot.to_ne_bytes(), MapFlags::ANY)
        .unwrap()
        .unwrap();
    assert!(zeroed.iter().all(|b| b.iter().all(|&x| x == 0)));
    let free: Vec<u32> = std::iter::from_fn(pop).collect();
    assert_eq!(free.len(), 1024, "every slot is free again");
    assert_eq!(free.last(), Some(&slot));
}
