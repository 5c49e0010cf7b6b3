//! Owner of the sched BPF program (`bpf/sched.bpf.c`): loads and attaches
//! it, fills its per-CPU sibling and cycle-counter slots, and reads the
//! cumulative per-thread, per-CPU counters (open slices included) with
//! typed operations. Threads are listed by tid in `thread_slots`; their
//! figures sit in slots of the per-CPU array `threads`. Exited threads'
//! slots are freed right after being read.

use std::collections::HashMap;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, OwnedFd};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject};
use qosd_core::clock::monotonic_ns;

use super::perf::{open_cycle_counters, read_counter};
use super::sched_abi::skel::{SchedSkel, SchedSkelBuilder};
use super::sched_abi::{
    as_bytes, from_bytes, CNT_CYCLES_ERR, CNT_NO_CLOCK, CNT_SWITCHES, CNT_TABLE_FULL, CNT_UNMATCHED,
};
pub use super::sched_abi::{CpuState, ThreadStats, NO_SIBLING, THR_DEAD};
use super::topology::CpuPackages;
use super::PowerError;

/// Cumulative figures of a thread on one CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuCum {
    pub on_ns: u64,
    pub sib_busy_ns: u64,
    pub cycles: u64,
    pub nr_switches: u64,
}

/// One thread's cumulative figures, for the CPUs it ran on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ThreadCum {
    pub tgid: u32,
    /// (cpu, figures), CPUs where it ran only.
    pub per_cpu: Vec<(u32, CpuCum)>,
    /// The thread has exited; its entry is gone from the map after this read.
    pub exited: bool,
}

/// Event counters of the program since it was loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct SchedCounters {
    pub switches: u64,
    /// Switches not accounted because the thread table was full.
    pub table_full: u64,
    /// Cycle counter reads that failed in the kernel.
    pub cycles_err: u64,
    /// Switches whose outgoing thread was not the one recorded as running:
    /// a switch the tracepoint never reported. The outgoing thread gets the
    /// kernel's runtime of its slice, the recorded one the rest of the gap.
    pub unmatched: u64,
    /// Switches not accounted because the CPU's rq clock was not reachable
    /// through the outgoing task.
    pub no_clock: u64,
}

/// Everything read at one instant.
#[derive(Debug, Clone, Default)]
pub struct SchedReading {
    /// CLOCK_MONOTONIC of the read, ns: interval lengths. (Thread and CPU
    /// times are in the scheduler's clock, which runs at the same rate.)
    pub now_ns: u64,
    pub threads: HashMap<u32, ThreadCum>,
    /// Cumulative non-idle time per CPU, ns.
    pub cpu_busy_ns: Vec<u64>,
    pub counters: SchedCounters,
}

/// The loaded and attached sched program.
pub struct Sched {
    // Dropped first: destroys the links and closes the BPF object.
    skel: SchedSkel<'static>,
    cycle_fds: Vec<Option<OwnedFd>>,
    use_cycles: bool,
    nr_cpus: usize,
    /// Why cycles are not used (no PMU, disabled in config), if they are not.
    pub cycles_note: Option<String>,
}

fn bpf_err(what: &str) -> impl Fn(libbpf_rs::Error) -> PowerError + '_ {
    move |e| PowerError::Bpf(format!("{what}: {e}"))
}

/// The maps' starting content: each CPU's SMT sibling, every thread slot
/// free, and the cycle counters' file descriptors.
fn fill_maps(
    skel: &SchedSkel<'static>,
    topo: &CpuPackages,
    nr_cpus: usize,
    nr_threads_max: u32,
    cycle_fds: &[Option<OwnedFd>],
) -> Result<(), PowerError> {
    for cpu in 0..nr_cpus {
        let st = CpuState {
            sibling: topo
                .cpus
                .get(cpu)
                .and_then(|c| c.sibling)
                .filter(|s| (*s as usize) < nr_cpus)
                .unwrap_or(NO_SIBLING),
            ..Default::default()
        };
        skel.maps
            .cpus
            .update(&(cpu as u32).to_ne_bytes(), as_bytes(&st), MapFlags::ANY)
            .map_err(bpf_err("writing the cpus map"))?;
    }
    // Every slot starts free (the program only pops them).
    for slot in 0..nr_threads_max {
        skel.maps
            .free_slots
            .update(&[], &slot.to_ne_bytes(), MapFlags::ANY)
            .map_err(bpf_err("filling the free_slots queue"))?;
    }
    for (cpu, fd) in cycle_fds.iter().enumerate().take(nr_cpus) {
        if let Some(fd) = fd {
            skel.maps
                .cycles
                .update(
                    &(cpu as u32).to_ne_bytes(),
                    &(fd.as_raw_fd() as u32).to_ne_bytes(),
                    MapFlags::ANY,
                )
                .map_err(bpf_err("writing the cycles perf event array"))?;
        }
    }
    Ok(())
}

/// Cumulative busy time of a CPU at `now` (the C `busy_until`).
fn busy_until(s: &CpuState, now: u64) -> u64 {
    let open = if s.tid != 0 && s.start_ns != 0 && now > s.start_ns {
        now - s.start_ns
    } else {
        0
    };
    s.busy_acc_ns + open
}

impl Sched {
    /// Loads and attaches the program. `want_cycles`: use hardware cycle
    /// counters if every online CPU has one.
    pub fn open(
        topo: &CpuPackages,
        nr_threads_max: u32,
        want_cycles: bool,
    ) -> Result<Sched, PowerError> {
        let mut s = Sched::load(topo, nr_threads_max, want_cycles)?;
        s.skel
            .attach()
            .map_err(bpf_err("attaching tp_btf/sched_switch"))?;
        Ok(s)
    }

    /// Loads the program and fills its maps, without attaching it.
    fn load(
        topo: &CpuPackages,
        nr_threads_max: u32,
        want_cycles: bool,
    ) -> Result<Sched, PowerError> {
        let nr_cpus = libbpf_rs::num_possible_cpus().map_err(bpf_err("counting CPUs"))?;
        let (cycle_fds, cycles_note) = if !want_cycles {
            (
                Vec::new(),
                Some("cycles disabled in config (power.use_cycles)".to_owned()),
            )
        } else {
            match open_cycle_counters(topo) {
                Ok(fds) => (fds, None),
                Err(why) => (Vec::new(), Some(why)),
            }
        };
        let use_cycles = !cycle_fds.is_empty();

        // The skeleton borrows its OpenObject storage for its whole life.
        // Leaking one Box per load gives it 'static storage without unsafe;
        // only the storage leaks (one pointer-sized OpenObject): the BPF
        // object it points to is closed when the skeleton drops.
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = SchedSkelBuilder::default()
            .open(storage)
            .map_err(bpf_err("opening the sched BPF object"))?;
        // One slot per thread; its tid index and free list as large.
        open.maps
            .threads
            .set_max_entries(nr_threads_max)
            .map_err(bpf_err("sizing the threads map"))?;
        open.maps
            .thread_slots
            .set_max_entries(nr_threads_max)
            .map_err(bpf_err("sizing the thread_slots map"))?;
        open.maps
            .free_slots
            .set_max_entries(nr_threads_max)
            .map_err(bpf_err("sizing the free_slots map"))?;
        open.maps
            .cpus
            .set_max_entries(nr_cpus as u32)
            .map_err(bpf_err("sizing the cpus map"))?;
        open.maps
            .clocks
            .set_max_entries(nr_cpus as u32)
            .map_err(bpf_err("sizing the clocks map"))?;
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.use_cycles = use_cycles as u32;
            ro.nr_cpus = nr_cpus as u32;
        }
        let skel = open
            .load()
            .map_err(bpf_err("loading the sched BPF program (needs root)"))?;
        let vs = skel.maps.threads.value_size() as usize;
        if vs != size_of::<ThreadStats>() {
            return Err(PowerError::Bpf(format!(
                "thread_stats is {vs} bytes in the kernel, {} in Rust",
                size_of::<ThreadStats>()
            )));
        }
        fill_maps(&skel, topo, nr_cpus, nr_threads_max, &cycle_fds)?;
        Ok(Sched {
            skel,
            cycle_fds,
            use_cycles,
            nr_cpus,
            cycles_note,
        })
    }

    /// True when threads are weighed by cycles, false for on-CPU time.
    pub fn uses_cycles(&self) -> bool {
        self.use_cycles
    }

    /// Number of possible CPUs (the index range of every per-CPU figure).
    pub fn nr_cpus(&self) -> usize {
        self.nr_cpus
    }

    /// True while the thread has a slot in the kernel's thread table.
    pub fn has_thread(&self, tid: u32) -> bool {
        matches!(self.slot_of(tid), Ok(Some(_)))
    }

    /// The thread's slot in `threads`, if it has one.
    fn slot_of(&self, tid: u32) -> Result<Option<u32>, PowerError> {
        let v = self
            .skel
            .maps
            .thread_slots
            .lookup(&tid.to_ne_bytes(), MapFlags::ANY)
            .map_err(bpf_err("reading the thread_slots map"))?;
        Ok(v.and_then(|b| b.as_slice().try_into().ok().map(u32::from_ne_bytes)))
    }

    /// Forgets an exited thread: its tid, then its slot, zeroed on every
    /// CPU, back on the free list. Only while the tid still names `slot`
    /// (a new thread with the same tid may have taken it over meanwhile).
    fn free_slot(&self, tid: u32, slot: u32) {
        if !matches!(self.slot_of(tid), Ok(Some(s)) if s == slot) {
            return;
        }
        let m = &self.skel.maps;
        let _ = m.thread_slots.delete(&tid.to_ne_bytes());
        let zero = vec![as_bytes(&ThreadStats::default()).to_vec(); self.nr_cpus];
        if m.threads
            .update_percpu(&slot.to_ne_bytes(), &zero, MapFlags::ANY)
            .is_ok()
        {
            let _ = m.free_slots.update(&[], &slot.to_ne_bytes(), MapFlags::ANY);
        }
    }

    fn cpu_states(&self) -> Result<Vec<CpuState>, PowerError> {
        (0..self.nr_cpus).map(|cpu| self.cpu_state(cpu)).collect()
    }

    fn counters(&self) -> Result<SchedCounters, PowerError> {
        let sum = |idx: u32| -> Result<u64, PowerError> {
            let v = self
                .skel
                .maps
                .counters
                .lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY)
                .map_err(bpf_err("reading the counters map"))?;
            Ok(v.unwrap_or_default()
                .iter()
                .filter_map(|b| b.as_slice().try_into().ok().map(u64::from_ne_bytes))
                .sum())
        };
        Ok(SchedCounters {
            switches: sum(CNT_SWITCHES)?,
            table_full: sum(CNT_TABLE_FULL)?,
            cycles_err: sum(CNT_CYCLES_ERR)?,
            unmatched: sum(CNT_UNMATCHED)?,
            no_clock: sum(CNT_NO_CLOCK)?,
        })
    }

    /// Every CPU's rq clock now (the clock of `start_ns`), via the
    /// snapshot program.
    fn rq_clocks(&self) -> Result<Vec<u64>, PowerError> {
        self.skel
            .progs
            .qosd_clock_snapshot
            .test_run(libbpf_rs::ProgramInput::default())
            .map_err(bpf_err("running the clock snapshot"))?;
        let mut out = Vec::with_capacity(self.nr_cpus);
        for cpu in 0..self.nr_cpus as u32 {
            let v = self
                .skel
                .maps
                .clocks
                .lookup(&cpu.to_ne_bytes(), MapFlags::ANY)
                .map_err(bpf_err("reading the clocks map"))?;
            out.push(
                v.and_then(|b| b.as_slice().try_into().ok().map(u64::from_ne_bytes))
                    .unwrap_or(0),
            );
        }
        Ok(out)
    }

    fn cpu_state(&self, cpu: usize) -> Result<CpuState, PowerError> {
        let v = self
            .skel
            .maps
            .cpus
            .lookup(&(cpu as u32).to_ne_bytes(), MapFlags::ANY)
            .map_err(bpf_err("reading the cpus map"))?;
        Ok(v.as_deref().and_then(from_bytes).unwrap_or_default())
    }

    /// One thread's figures, decoded, with its slot; `None` if it has none.
    fn thread(&self, tid: u32) -> Result<Option<(u32, ThreadCum)>, PowerError> {
        let Some(slot) = self.slot_of(tid)? else {
            return Ok(None);
        };
        let Some(slots) = self
            .skel
            .maps
            .threads
            .lookup_percpu(&slot.to_ne_bytes(), MapFlags::ANY)
            .map_err(bpf_err("reading the threads map"))?
        else {
            return Ok(None);
        };
        let mut t = ThreadCum::default();
        for (cpu, b) in slots.iter().enumerate() {
            let Some(s) = from_bytes::<ThreadStats>(b) else {
                continue;
            };
            t.exited |= s.flags & THR_DEAD != 0;
            t.tgid = t.tgid.max(s.tgid);
            if s.on_ns != 0 || s.nr_switches != 0 {
                t.per_cpu.push((
                    cpu as u32,
                    CpuCum {
                        on_ns: s.on_ns,
                        sib_busy_ns: s.sib_busy_ns,
                        cycles: s.cycles,
                        nr_switches: s.nr_switches,
                    },
                ));
            }
        }
        Ok(Some((slot, t)))
    }

    /// Reads every thread's cumulative figures, adds the slices still open
    /// on each CPU, and deletes the entries of exited threads.
    ///
    /// A running thread's entry is read again between two reads of its
    /// CPU's state; only when that state did not change in between (no
    /// switch) is its open slice, up to the CPU's rq clock, added, so a
    /// slice is never counted both closed and open. After three changed
    /// attempts the open slice is left to the next reading. A busy CPU's rq
    /// clock lags by at most one scheduler tick; the next reading has it.
    pub fn read(&mut self) -> Result<SchedReading, PowerError> {
        let keys: Vec<u32> = self
            .skel
            .maps
            .thread_slots
            .keys()
            .filter_map(|k| k.as_slice().try_into().ok().map(u32::from_ne_bytes))
            .collect();
        let mut threads: HashMap<u32, ThreadCum> = HashMap::with_capacity(keys.len() + 8);
        let mut slots: HashMap<u32, u32> = HashMap::with_capacity(keys.len() + 8);
        for tid in keys {
            if let Some((slot, t)) = self.thread(tid)? {
                threads.insert(tid, t);
                slots.insert(tid, slot);
            }
        }
        // Clocks first: a slice open in a state read after them was open
        // at their time too.
        let clocks = self.rq_clocks()?;
        let now = monotonic_ns();
        let states = self.cpu_states()?;
        let mut cpu_busy_ns = Vec::with_capacity(states.len());
        for (cpu, first) in states.iter().enumerate() {
            let clock = clocks.get(cpu).copied().unwrap_or(0);
            let mut st = *first;
            let mut busy = busy_until(&st, clock);
            for _attempt in 0..3 {
                if st.tid == 0 || st.start_ns == 0 {
                    break;
                }
                let fresh = self.thread(st.tid)?.map(|(slot, t)| {
                    slots.insert(st.tid, slot);
                    t
                });
                let cycles_now = match self.cycle_fds.get(cpu).and_then(Option::as_ref) {
                    Some(fd) if self.use_cycles => read_counter(fd).ok(),
                    _ => None,
                };
                let again = self.cpu_state(cpu)?;
                if again.start_ns != st.start_ns || again.tid != st.tid {
                    st = again; // switched meanwhile: try with the new slice
                    continue;
                }
                let slice = clock.saturating_sub(st.start_ns);
                let overlap = states
                    .get(st.sibling as usize)
                    .map(|sib| {
                        busy_until(sib, clock)
                            .saturating_sub(st.sib_busy_at_start)
                            .min(slice)
                    })
                    .unwrap_or(0);
                let mut t = fresh.unwrap_or_else(|| ThreadCum {
                    tgid: st.tgid,
                    ..Default::default()
                });
                let add = CpuCum {
                    on_ns: slice,
                    sib_busy_ns: overlap,
                    cycles: cycles_now.map_or(0, |c| c.saturating_sub(st.start_cycles)),
                    nr_switches: 0,
                };
                match t.per_cpu.iter_mut().find(|(c, _)| *c == cpu as u32) {
                    Some((_, c)) => {
                        c.on_ns += add.on_ns;
                        c.sib_busy_ns += add.sib_busy_ns;
                        c.cycles += add.cycles;
                    }
                    None => t.per_cpu.push((cpu as u32, add)),
                }
                threads.insert(st.tid, t);
                busy = busy_until(&st, clock);
                break;
            }
            cpu_busy_ns.push(busy);
        }
        for (tid, t) in &threads {
            if let (true, Some(&slot)) = (t.exited, slots.get(tid)) {
                // The thread will not run again: its figures are final.
                self.free_slot(*tid, slot);
            }
        }
        Ok(SchedReading {
            now_ns: now,
            threads,
            cpu_busy_ns,
            counters: self.counters()?,
        })
    }
}

#[cfg(test)]
#[path = "sched_tests.rs"]
mod tests;
