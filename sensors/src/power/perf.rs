//! perf_event_open for the two things the power sensor wants from perf:
//! a hardware cycle counter per CPU (read by the sched BPF program) and the
//! RAPL energy counters of the `power` PMU (`power/energy-pkg/` etc.), used
//! when powercap sysfs is missing.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::rapl::SocketEnergy;
use super::topology::{read_cpu_list, read_trimmed, CpuPackages};
use super::PowerError;

/// `struct perf_event_attr` up to PERF_ATTR_SIZE_VER0 (64 bytes): the
/// kernel accepts any published size and zero-extends. libc does not define
/// it; the layout is the uapi one.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64, // disabled, inherit, pinned, ... bit fields
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}
const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 64);
const _: () = assert!(std::mem::offset_of!(PerfEventAttr, flags) == 40);

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// Opens a counting event on one CPU for every task (pid -1).
fn open_cpu_event(type_: u32, config: u64, cpu: u32) -> io::Result<OwnedFd> {
    let attr = PerfEventAttr {
        type_,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid, initialised perf_event_attr of the size it
    // declares and outlives the call; the other arguments are plain ints.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            -1 as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new file descriptor that nothing else
    // owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Reads a counting event's 64-bit value (read_format 0).
pub fn read_counter(fd: &OwnedFd) -> io::Result<u64> {
    let mut v = 0u64;
    // SAFETY: reads at most 8 bytes into `v`, which lives across the call.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    match n {
        8 => Ok(v),
        n if n < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "short perf read",
        )),
    }
}

/// One hardware cycle counter per possible CPU, or why there are none.
/// Offline CPUs are skipped (their slot stays empty; nothing runs there).
pub fn open_cycle_counters(topo: &CpuPackages) -> Result<Vec<Option<OwnedFd>>, String> {
    let mut fds = Vec::with_capacity(topo.cpus.len());
    for (cpu, c) in topo.cpus.iter().enumerate() {
        if !c.online {
            fds.push(None);
            continue;
        }
        match open_cpu_event(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, cpu as u32) {
            Ok(fd) => fds.push(Some(fd)),
            Err(e) => {
                let why = match e.raw_os_error() {
                    Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) => {
                        "no hardware PMU (a VM without PMU passthrough?)".to_owned()
                    }
                    _ => e.to_string(),
                };
                return Err(format!("perf_event_open(cycles) on CPU {cpu}: {e}: {why}"));
            }
        }
    }
    Ok(fds)
}

/// One event of the `power` PMU as sysfs describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct PowerEvent {
    pub pmu_type: u32,
    pub config: u64,
    /// Joules per count (`<event>.scale`).
    pub scale: f64,
}

/// Reads `<root>/sys/bus/event_source/devices/power/events/<name>`
/// (`event=0x02`) with its scale; `Ok(None)` when the event is absent.
pub fn power_event(root: &Path, name: &str) -> Result<Option<PowerEvent>, PowerError> {
    let pmu = root.join("sys/bus/event_source/devices/power");
    let ev = pmu.join("events").join(name);
    if !ev.exists() {
        return Ok(None);
    }
    let bad = |path: &Path, what: String| PowerError::Parse {
        path: path.to_owned(),
        what,
    };
    let type_path = pmu.join("type");
    let t = read_trimmed(&type_path)?;
    let pmu_type = t
        .parse()
        .map_err(|_| bad(&type_path, format!("PMU type {t:?}")))?;
    let spec = read_trimmed(&ev)?;
    let config = spec
        .split(',')
        .find_map(|kv| kv.trim().strip_prefix("event="))
        .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
        .ok_or_else(|| bad(&ev, format!("event spec {spec:?}")))?;
    let scale_path = pmu.join("events").join(format!("{name}.scale"));
    let s = read_trimmed(&scale_path)?;
    let scale = s
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or_else(|| bad(&scale_path, format!("scale {s:?}")))?;
    Ok(Some(PowerEvent {
        pmu_type,
        config,
        scale,
    }))
}

struct EnergyCounter {
    fd: OwnedFd,
    scale: f64,
    last: u64,
}

impl EnergyCounter {
    fn delta_j(&mut self) -> io::Result<f64> {
        let cur = read_counter(&self.fd)?;
        // 64-bit counts of ~2^-32 J: no wrap within the life of a machine.
        let d = cur.wrapping_sub(self.last);
        self.last = cur;
        Ok(d as f64 * self.scale)
    }
}

/// RAPL through the perf `power` PMU: energy-pkg (and energy-cores,
/// energy-ram where present) opened on one CPU of each socket
/// (the PMU's `cpumask`).
pub struct PerfEnergy {
    sockets: Vec<[Option<EnergyCounter>; 3]>, // pkg, cores, ram
    pub domains: Vec<String>,
}

impl PerfEnergy {
    /// `Ok(None)` when there is no `power/energy-pkg/` event.
    pub fn detect(root: &Path, topo: &CpuPackages) -> Result<Option<PerfEnergy>, PowerError> {
        let Some(_) = power_event(root, "energy-pkg")? else {
            return Ok(None);
        };
        let mask_path = root.join("sys/bus/event_source/devices/power/cpumask");
        let cpus = read_cpu_list(&mask_path)?;
        let mut sockets: Vec<[Option<EnergyCounter>; 3]> = Vec::new();
        sockets.resize_with(topo.sockets.len(), Default::default);
        let mut domains = Vec::new();
        for (k, name) in ["energy-pkg", "energy-cores", "energy-ram"]
            .iter()
            .enumerate()
        {
            let Some(ev) = power_event(root, name)? else {
                continue;
            };
            for &cpu in &cpus {
                let s = topo.socket_of(cpu as usize);
                let fd = open_cpu_event(ev.pmu_type, ev.config, cpu).map_err(|e| {
                    PowerError::Energy(format!("perf_event_open(power/{name}/) on CPU {cpu}: {e}"))
                })?;
                let last = read_counter(&fd)
                    .map_err(|e| PowerError::Energy(format!("reading power/{name}/: {e}")))?;
                sockets[s][k] = Some(EnergyCounter {
                    fd,
                    scale: ev.scale,
                    last,
                });
                domains.push(format!("power/{name}/ socket {}", topo.sockets[s]));
            }
        }
        Ok(Some(PerfEnergy { sockets, domains }))
    }

    /// Energy per socket since the previous read.
    pub fn read(&mut self) -> Result<Vec<SocketEnergy>, PowerError> {
        let mut out = Vec::with_capacity(self.sockets.len());
        for s in &mut self.sockets {
            let mut j = [None; 3];
            for (k, c) in s.iter_mut().enumerate() {
                if let Some(c) = c {
                    j[k] = Some(c.delta_j().map_err(|e| {
                        PowerError::Energy(format!("reading a power/ perf counter: {e}"))
                    })?);
                }
            }
            out.push(SocketEnergy {
                package_j: j[0].unwrap_or(0.0),
                core_j: j[1],
                dram_j: j[2],
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn power_pmu_events_parse_from_sysfs() {
        let d = tempfile::tempdir().unwrap();
        let ev = d.path().join("sys/bus/event_source/devices/power/events");
        fs::create_dir_all(&ev).unwrap();
        fs::write(ev.join("../type"), "23\n").unwrap();
        fs::write(ev.join("energy-pkg"), "event=0x02\n").unwrap();
        fs::write(
            ev.join("energy-pkg.scale"),
            "2.3283064365386962890625e-10\n",
        )
        .unwrap();
        fs::write(ev.join("energy-pkg.unit"), "Joules\n").unwrap();
        let e = power_event(d.path(), "energy-pkg").unwrap().unwrap();
        assert_eq!(e.pmu_type, 23);
        assert_eq!(e.config, 2);
        assert_eq!(e.scale, 2f64.powi(-32));
        assert_eq!(power_event(d.path(), "energy-ram").unwrap(), None);
        fs::write(ev.join("energy-pkg.scale"), "lots\n").unwrap();
        let err = power_event(d.path(), "energy-pkg").unwrap_err().to_string();
        assert!(err.contains("energy-pkg.scale"), "{err}");
    }

    #[test]
    fn this_machine_reports_why_cycles_are_missing_or_opens_them() {
        let topo = CpuPackages::read(&qosd_core::sys::Root::default()).unwrap();
        let has_pmu = Path::new("/sys/bus/event_source/devices/cpu").exists()
            || Path::new("/sys/bus/event_source/devices/cpu_core").exists();
        match open_cycle_counters(&topo) {
            Ok(fds) => {
                assert!(has_pmu, "cycles opened without a cpu PMU in sysfs");
                let fd = fds.iter().flatten().next().unwrap();
                read_counter(fd).unwrap();
            }
            // Without root perf_event_paranoid refuses (EACCES) even with a
            // PMU, so only check the message when there is no PMU at all.
            Err(why) => {
                assert!(why.contains("CPU 0"), "{why}");
                if !has_pmu {
                    assert!(why.contains("no hardware PMU"), "{why}");
                }
            }
        }
    }
}
