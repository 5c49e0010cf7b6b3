//! RAPL energy through powercap sysfs (`<root>/sys/class/powercap`):
//! package zones `intel-rapl:N` (name `package-N`, also `package-N-die-M`)
//! with their `core`/`dram` subzones; AMD exposes the same tree on recent
//! kernels. Counters wrap at `max_energy_range_uj`.

use std::path::{Path, PathBuf};

use super::topology::{read_trimmed, CpuPackages};
use super::PowerError;

/// Energy used over one interval on one socket, J.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SocketEnergy {
    pub package_j: f64,
    /// Cores only (RAPL PP0); `None` where the domain does not exist.
    pub core_j: Option<f64>,
    pub dram_j: Option<f64>,
}

/// Growth of a counter that wraps to 0 after `max_range` (the counter
/// takes values 0..max_range): one wrap at most between two reads, which
/// holds for any read interval under ~an hour at hundreds of watts.
pub fn wrap_delta(prev: u64, cur: u64, max_range: u64) -> u64 {
    if cur >= prev {
        cur - prev
    } else if max_range > prev {
        max_range - prev + cur
    } else {
        // No usable range: the counter was reset; count from zero.
        cur
    }
}

#[derive(Debug)]
struct Counter {
    path: PathBuf,
    max_range_uj: u64,
    last_uj: u64,
}

impl Counter {
    fn open(zone: &Path) -> Result<Counter, PowerError> {
        let path = zone.join("energy_uj");
        let range_path = zone.join("max_energy_range_uj");
        let range = read_trimmed(&range_path)?;
        let max_range_uj = range.parse().map_err(|_| PowerError::Parse {
            path: range_path,
            what: format!("energy range {range:?}"),
        })?;
        let mut c = Counter {
            path,
            max_range_uj,
            last_uj: 0,
        };
        c.last_uj = c.read_raw()?;
        Ok(c)
    }

    fn read_raw(&self) -> Result<u64, PowerError> {
        let s = read_trimmed(&self.path)?;
        s.parse().map_err(|_| PowerError::Parse {
            path: self.path.clone(),
            what: format!("energy counter {s:?}"),
        })
    }

    /// Microjoules since the previous read.
    fn delta_uj(&mut self) -> Result<u64, PowerError> {
        let cur = self.read_raw()?;
        let d = wrap_delta(self.last_uj, cur, self.max_range_uj);
        self.last_uj = cur;
        Ok(d)
    }
}

#[derive(Debug, Default)]
struct SocketCounters {
    package: Vec<Counter>, // one per die
    core: Vec<Counter>,
    dram: Vec<Counter>,
}

/// The powercap RAPL counters of every socket.
#[derive(Debug)]
pub struct Powercap {
    sockets: Vec<SocketCounters>,
    /// Domains found, e.g. `package-0`, `package-0/core`, `package-0/dram`.
    pub domains: Vec<String>,
}

/// Socket number in a zone name `package-N` or `package-N-die-M`.
fn package_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("package-")?;
    rest.split('-').next()?.parse().ok()
}

fn sum_uj(cs: &mut [Counter]) -> Result<Option<f64>, PowerError> {
    if cs.is_empty() {
        return Ok(None);
    }
    let mut uj = 0u64;
    for c in cs {
        uj += c.delta_uj()?;
    }
    Ok(Some(uj as f64 / 1e6))
}

impl Powercap {
    /// Finds the package zones under `root`; `Ok(None)` when there are none
    /// (no powercap, or no RAPL driver). Reads every counter once so that
    /// the first [`Powercap::read`] covers the time since detection.
    pub fn detect(root: &Path, topo: &CpuPackages) -> Result<Option<Powercap>, PowerError> {
        let dir = root.join("sys/class/powercap");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(None);
        };
        let mut zones: Vec<(String, PathBuf)> = entries
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            // Top-level RAPL zones only: `intel-rapl:0`, not `intel-rapl:0:1`
            // nor `intel-rapl-mmio:0` (a second view of the same package).
            .filter(|(n, _)| {
                n.strip_prefix("intel-rapl:")
                    .is_some_and(|r| !r.contains(':'))
            })
            .collect();
        zones.sort();
        let mut sockets: Vec<SocketCounters> = Vec::new();
        sockets.resize_with(topo.sockets.len(), Default::default);
        let mut domains = Vec::new();
        for (zname, zpath) in zones {
            let name = read_trimmed(&zpath.join("name"))?;
            // `psys` (whole platform) and others are not per socket.
            let Some(pkg) = package_of(&name) else {
                continue;
            };
            let Some(s) = topo.socket_index(pkg) else {
                tracing::warn!("powercap {zname}: {name} matches no socket in the CPU topology");
                continue;
            };
            sockets[s].package.push(Counter::open(&zpath)?);
            domains.push(name.clone());
            let mut subs: Vec<PathBuf> = std::fs::read_dir(&zpath)
                .map_err(|source| PowerError::Io {
                    path: zpath.clone(),
                    source,
                })?
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{zname}:"))
                })
                .map(|e| e.path())
                .collect();
            subs.sort();
            for sub in subs {
                let sname = read_trimmed(&sub.join("name"))?;
                let list = match sname.as_str() {
                    "core" => &mut sockets[s].core,
                    "dram" => &mut sockets[s].dram,
                    _ => continue, // uncore (graphics): not attributed
                };
                list.push(Counter::open(&sub)?);
                domains.push(format!("{name}/{sname}"));
            }
        }
        if sockets.iter().all(|s| s.package.is_empty()) {
            return Ok(None);
        }
        Ok(Some(Powercap { sockets, domains }))
    }

    /// Energy per socket since the previous read (index = socket index).
    pub fn read(&mut self) -> Result<Vec<SocketEnergy>, PowerError> {
        let mut out = Vec::with_capacity(self.sockets.len());
        for s in &mut self.sockets {
            out.push(SocketEnergy {
                package_j: sum_uj(&mut s.package)?.unwrap_or(0.0),
                core_j: sum_uj(&mut s.core)?,
                dram_j: sum_uj(&mut s.dram)?,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::power::topology::tests::fake_cpus;
    use std::fs;

    /// Writes a powercap zone (`sub` = None: top-level `intel-rapl:P`).
    pub fn fake_zone(root: &Path, pkg: u32, sub: Option<u32>, name: &str, uj: u64, range: u64) {
        let top = format!("intel-rapl:{pkg}");
        let mut d = root.join("sys/class/powercap").join(&top);
        if let Some(s) = sub {
            d = d.join(format!("{top}:{s}"));
        }
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("name"), format!("{name}\n")).unwrap();
        fs::write(d.join("max_energy_range_uj"), format!("{range}\n")).unwrap();
        set_energy(root, pkg, sub, uj);
    }

    pub fn set_energy(root: &Path, pkg: u32, sub: Option<u32>, uj: u64) {
        let top = format!("intel-rapl:{pkg}");
        let mut d = root.join("sys/class/powercap").join(&top);
        if let Some(s) = sub {
            d = d.join(format!("{top}:{s}"));
        }
        fs::write(d.join("energy_uj"), format!("{uj}\n")).unwrap();
    }

    #[test]
    fn wrap_delta_cases() {
        assert_eq!(wrap_delta(100, 250, 1000), 150);
        // 900 -> wraps at 1000 -> 50: 100 + 50.
        assert_eq!(wrap_delta(900, 50, 1000), 150);
        assert_eq!(wrap_delta(900, 50, 0), 50, "no range: a reset");
    }

    #[test]
    fn counters_advance_at_a_known_rate_through_a_wrap() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        fake_cpus(root, 2, 1, 1);
        let range = 262_143_328_850u64; // a real Skylake max_energy_range_uj
        fake_zone(root, 0, None, "package-0", range - 30_000_000, range);
        fake_zone(root, 0, Some(0), "core", 5_000_000, range);
        fake_zone(root, 0, Some(1), "uncore", 0, range);
        fake_zone(root, 1, None, "package-1", 0, range);
        fake_zone(root, 1, Some(0), "dram", 7, range);
        // psys is platform-wide, not a socket: ignored.
        fake_zone(root, 2, None, "psys", 0, range);
        let topo = CpuPackages::read(&qosd_core::sys::Root::new(root)).unwrap();
        let mut p = Powercap::detect(root, &topo).unwrap().unwrap();
        assert_eq!(
            p.domains,
            vec!["package-0", "package-0/core", "package-1", "package-1/dram"]
        );
        // 80 J on package 0 (through the wrap), 25 J on its cores, 40 J on
        // package 1 and 3 J on its DRAM.
        set_energy(root, 0, None, 50_000_000);
        set_energy(root, 0, Some(0), 30_000_000);
        set_energy(root, 1, None, 40_000_000);
        set_energy(root, 1, Some(0), 3_000_007);
        let e = p.read().unwrap();
        assert_eq!(e[0].package_j, 80.0);
        assert_eq!(e[0].core_j, Some(25.0));
        assert_eq!(e[0].dram_j, None);
        assert_eq!(e[1].package_j, 40.0);
        assert_eq!(e[1].core_j, None);
        assert_eq!(e[1].dram_j, Some(3.0));
        // Nothing moved: zero.
        assert_eq!(p.read().unwrap()[0].package_j, 0.0);
    }

    #[test]
    fn no_powercap_is_none() {
        let d = tempfile::tempdir().unwrap();
        fake_cpus(d.path(), 1, 2, 1);
        let topo = CpuPackages::read(&qosd_core::sys::Root::new(d.path())).unwrap();
        assert!(Powercap::detect(d.path(), &topo).unwrap().is_none());
    }
}
