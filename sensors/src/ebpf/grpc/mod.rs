//! Finding a process's gRPC server library and where to put the uprobes of
//! `bpf/grpc.bpf.c`: grpc-go in the executable (`/proc/PID/exe`), or gRPC
//! C-core in a shared object the process maps (`/proc/PID/maps`) or in the
//! executable itself. What cannot be probed (a stripped binary, a Go too old
//! for the register ABI, a library without symbols) is said in one sentence
//! that names the file, so the caller can warn and fall back.

mod elf;
mod go;

use std::fmt;
use std::path::{Path, PathBuf};

use elf::{Elf, Symbols};

/// The four programs of grpc.bpf.c.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prog {
    GoStreamHandOff,
    GoHandleStream,
    GoWriteStatus,
    CcoreStreamNew,
    CcoreStreamClosed,
}

/// One uprobe to attach: program, file (a path through /proc/PID, so the
/// process's own file is probed even in another mount namespace or after
/// being replaced on disk), file offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Site {
    pub prog: Prog,
    pub path: PathBuf,
    pub offset: u64,
    pub symbol: String,
}

/// What [`discover`] found in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Discovery {
    /// No gRPC server library anywhere in the process.
    NotGrpc,
    /// A gRPC server library with the symbols: attach these.
    Probes { stack: String, sites: Vec<Site> },
    /// gRPC is there but cannot be probed; the reason names the file.
    Unusable(String),
}

/// `grpc_chttp2_stream::grpc_chttp2_stream(grpc_chttp2_transport*,
/// grpc_stream_refcount*, const void* server_data, ...)`, complete (C1) or
/// base (C2) constructor. The argument prefix pins `server_data` to RCX.
const CCORE_CTOR: [&str; 2] = [
    "_ZN18grpc_chttp2_streamC1EP21grpc_chttp2_transportP20grpc_stream_refcountPKv",
    "_ZN18grpc_chttp2_streamC2EP21grpc_chttp2_transportP20grpc_stream_refcountPKv",
];
/// `grpc_chttp2_mark_stream_closed(grpc_chttp2_transport*,
/// grpc_chttp2_stream*, int close_reads, int close_writes, error)`.
const CCORE_CLOSED: &str =
    "_Z30grpc_chttp2_mark_stream_closedP21grpc_chttp2_transportP18grpc_chttp2_streamii";

impl fmt::Display for Prog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Prog::GoStreamHandOff => "go_stream_handoff",
            Prog::GoHandleStream => "go_handle_stream",
            Prog::GoWriteStatus => "go_write_status",
            Prog::CcoreStreamNew => "ccore_stream_new",
            Prog::CcoreStreamClosed => "ccore_stream_closed",
        })
    }
}

/// Looks for a gRPC server library in `pid`.
pub(crate) fn discover(pid: u32) -> Discovery {
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let real_exe = std::fs::read_link(&exe).unwrap_or_else(|_| exe.clone());
    if let Ok(elf) = Elf::open(&exe) {
        if let Some((go, modinfo)) = elf.go_build_info() {
            let d = go::discovery(&elf, &exe, &real_exe, &go, &modinfo);
            if d != Discovery::NotGrpc {
                return d;
            }
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut unusable = None;
    // The executable first: a C++ server may link C-core statically.
    let candidates = std::iter::once(real_exe.clone()).chain(grpc_libraries(&maps));
    for file in candidates {
        let attach = if file == real_exe {
            exe.clone()
        } else {
            Path::new(&format!("/proc/{pid}/root")).join(file.strip_prefix("/").unwrap_or(&file))
        };
        let Ok(elf) = Elf::open(&attach) else {
            continue;
        };
        let Ok(syms) = elf.functions(is_ccore_symbol) else {
            continue;
        };
        match ccore_sites(&syms, &attach) {
            Ok(mut sites) => {
                for site in &mut sites {
                    let skip = elf.read_at(site.offset, 8).map_or(0, |c| past_endbr(&c));
                    site.offset += skip;
                }
                return Discovery::Probes {
                    stack: format!(
                        "gRPC C-core in {} (grpc_chttp2_stream constructor .. \
                         grpc_chttp2_mark_stream_closed)",
                        file.display()
                    ),
                    sites,
                };
            }
            Err(missing) if file != real_exe => {
                unusable.get_or_insert(format!(
                    "{} (gRPC C-core) has no {}{}: per-call latency of multiplexed \
                     gRPC streams cannot be traced in pid {pid}",
                    file.display(),
                    missing,
                    if syms.has_symtab {
                        ""
                    } else {
                        " (it is stripped: no symbol table)"
                    },
                ));
            }
            Err(_) => {}
        }
    }
    unusable.map_or(Discovery::NotGrpc, Discovery::Unusable)
}

/// Shared objects mapped by the process whose file name says gRPC
/// (libgrpc.so, libgrpc_unsecure.so, Python's cygrpc*.so, Ruby's grpc_c.so).
pub(crate) fn grpc_libraries(maps: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        // addr perms offset dev inode path (the path may hold spaces)
        let Some(path) = line.splitn(6, char::is_whitespace).nth(5).map(str::trim) else {
            continue;
        };
        let path = path.strip_suffix(" (deleted)").unwrap_or(path);
        if !path.starts_with('/') {
            continue;
        }
        let p = PathBuf::from(path);
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        if name.contains("grpc") && name.contains(".so") && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

fn is_ccore_symbol(name: &str) -> bool {
    name.starts_with(CCORE_CLOSED) || CCORE_CTOR.iter().any(|c| name.starts_with(c))
}

/// 4 when `code` opens with `endbr64` followed by a `push` (of any
/// register), else 0. The kernel single-steps an `endbr64` under a uprobe
/// but emulates a `push`: one trap instead of two per hit (about 12 µs
/// against 1 µs on this project's VMs), with every argument register as at
/// the entry.
pub(crate) fn past_endbr(code: &[u8]) -> u64 {
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    let is_push = |b: Option<&u8>| b.is_some_and(|b| (0x50..=0x57).contains(b));
    let push = is_push(code.get(4)) || (code.get(4) == Some(&0x41) && is_push(code.get(5)));
    if code.starts_with(&ENDBR64) && push {
        4
    } else {
        0
    }
}

/// The C-core sites, or the name of what is missing.
fn ccore_sites(syms: &Symbols, attach: &Path) -> Result<Vec<Site>, &'static str> {
    let site = |prog, (name, off): (&String, &u64)| Site {
        prog,
        path: attach.to_path_buf(),
        offset: *off,
        symbol: name.clone(),
    };
    let mut ctors: Vec<Site> = Vec::new();
    for (name, off) in &syms.offsets {
        // C1 and C2 are usually one function under two names: probe it once.
        if CCORE_CTOR.iter().any(|c| name.starts_with(c)) && !ctors.iter().any(|s| s.offset == *off)
        {
            ctors.push(site(Prog::CcoreStreamNew, (name, off)));
        }
    }
    if ctors.is_empty() {
        return Err("symbol for the grpc_chttp2_stream constructor");
    }
    let closed = syms
        .offsets
        .iter()
        .find(|(n, _)| n.starts_with(CCORE_CLOSED))
        .ok_or("symbol for grpc_chttp2_mark_stream_closed")?;
    ctors.push(site(Prog::CcoreStreamClosed, closed));
    Ok(ctors)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn syms(names: &[&str]) -> Symbols {
        Symbols {
            has_symtab: true,
            offsets: names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), i as u64 * 16))
                .collect(),
        }
    }

    #[test]
    fn finds_grpc_libraries_in_maps() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libgrpc.so.29.0.0
7f0000001000-7f0000002000 r-xp 00001000 08:01 1234 /usr/lib/x86_64-linux-gnu/libgrpc.so.29.0.0
7f0000003000-7f0000004000 r-xp 00000000 08:01 99 /opt/py/site-packages/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so (deleted)
7f0000005000-7f0000006000 r-xp 00000000 08:01 98 /usr/lib/libc.so.6
7f0000007000-7f0000008000 rw-p 00000000 00:00 0 [heap]
7f0000009000-7f000000a000 r-xp 00000000 08:01 97 /srv/my grpc app/libgrpc++.so.1
";
        assert_eq!(
            grpc_libraries(maps),
            vec![
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libgrpc.so.29.0.0"),
                PathBuf::from(
                    "/opt/py/site-packages/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so"
                ),
                PathBuf::from("/srv/my grpc app/libgrpc++.so.1"),
            ]
        );
    }

    #[test]
    fn ccore_needs_both_symbols_and_probes_an_aliased_constructor_once() {
        let ctor1 = format!("{}PN9grpc_core5ArenaE", CCORE_CTOR[0]);
        let ctor2 = format!("{}PN9grpc_core5ArenaE", CCORE_CTOR[1]);
        let closed = format!("{CCORE_CLOSED}N4absl6StatusE");
        let mut s = syms(&[&ctor1, &closed]);
        s.offsets.insert(ctor2.clone(), s.offsets[&ctor1]);
        let sites = ccore_sites(&s, Path::new("/x")).unwrap();
        assert_eq!(
            sites
                .iter()
                .filter(|s| s.prog == Prog::CcoreStreamNew)
                .count(),
            1
        );
        assert_eq!(
            sites
                .iter()
                .filter(|s| s.prog == Prog::CcoreStreamClosed)
                .count(),
            1
        );
        assert!(ccore_sites(&syms(&[&ctor1]), Path::new("/x")).is_err());
        assert!(ccore_sites(&syms(&[&closed]), Path::new("/x")).is_err());
    }

    #[test]
    fn skips_endbr64_only_before_a_push() {
        assert_eq!(past_endbr(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55]), 4);
        assert_eq!(past_endbr(&[0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57]), 4);
        assert_eq!(past_endbr(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x89, 0xe5]), 0);
        assert_eq!(past_endbr(&[0x41, 0x55, 0x4d, 0x89, 0xc5]), 0);
        assert_eq!(past_endbr(&[0xf3, 0x0f, 0x1e]), 0);
    }

    #[test]
    fn a_process_without_grpc_is_not_grpc() {
        // This test binary: Rust, no gRPC library mapped.
        assert_eq!(discover(std::process::id()), Discovery::NotGrpc);
    }
}
