//! grpc-go: which functions of a Go executable mark a call's start and end,
//! and which register holds the stream there (Go's register ABI on amd64).
//!
//! Start: the callback `(*Server).serveStreams` gives the transport, which
//! the transport's reader goroutine calls with each new stream right after
//! decoding its HEADERS (a closure `serveStreams.funcN(stream)`, stream in
//! RAX). Everything after that, the wait for a free stream slot and for the
//! Go scheduler to run the handler goroutine included, is the server's
//! time. The closure's number differs between versions, so it is the one
//! closure of serveStreams that has a nested closure (the handler goroutine
//! body `funcN.1`); if that is not exactly one, the start falls back to
//! `(*Server).handleStream(stream RDI)`, which leaves out that wait.
//! End: `(*http2Server).WriteStatus` (< 1.69) or `writeStatus` (>= 1.69),
//! stream in RBX: the status (trailers) handed to the writer.
//!
//! Each probe sits on the `push %rbp` right after the function's stack
//! check when the prologue is one Go's compiler emits (else on the entry).
//! The argument registers are untouched there; the kernel emulates a push
//! where it single-steps the `lea`/`cmp` of the check out of line (one trap
//! per hit instead of two: about 1 µs against 10 µs on this project's
//! VMs); and a call that grows its stack re-runs the check but passes the
//! push once.

use std::path::Path;

use super::elf::{go_minor_version, module_version, Elf, Symbols};
use super::{Discovery, Prog, Site};

pub(crate) const GO_HANDLE_STREAM: &str = "google.golang.org/grpc.(*Server).handleStream";
const GO_SERVE_STREAMS_FUNC: &str = "google.golang.org/grpc.(*Server).serveStreams.func";
/// grpc-go < 1.69.
pub(crate) const GO_WRITE_STATUS_OLD: &str =
    "google.golang.org/grpc/internal/transport.(*http2Server).WriteStatus";
/// grpc-go >= 1.69.
pub(crate) const GO_WRITE_STATUS_NEW: &str =
    "google.golang.org/grpc/internal/transport.(*http2Server).writeStatus";
const GRPC_GO_MODULE: &str = "google.golang.org/grpc";
/// First Go release whose amd64 functions take their arguments in registers.
const GO_REGABI_MINOR: u32 = 17;

fn wanted(n: &str) -> bool {
    n == GO_HANDLE_STREAM
        || n == GO_WRITE_STATUS_OLD
        || n == GO_WRITE_STATUS_NEW
        || n.starts_with(GO_SERVE_STREAMS_FUNC)
}

/// The end-of-call symbol present in `syms`: `writeStatus` (grpc-go >=
/// 1.69) or `WriteStatus` (older).
pub(crate) fn end_symbol(syms: &Symbols) -> Option<&'static str> {
    [GO_WRITE_STATUS_NEW, GO_WRITE_STATUS_OLD]
        .into_iter()
        .find(|n| syms.offsets.contains_key(*n))
}

/// The start-of-call symbol and its program: the stream hand-off closure
/// when it can be told apart, else `handleStream`.
pub(crate) fn start_symbol(syms: &Symbols) -> Option<(String, Prog)> {
    let closures: Vec<&String> = syms
        .offsets
        .keys()
        .filter(|n| {
            n.strip_prefix(GO_SERVE_STREAMS_FUNC)
                .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    let with_body: Vec<&&String> = closures
        .iter()
        .filter(|n| syms.offsets.contains_key(&format!("{n}.1")))
        .collect();
    if let [one] = with_body.as_slice() {
        return Some((one.to_string(), Prog::GoStreamHandOff));
    }
    syms.offsets
        .contains_key(GO_HANDLE_STREAM)
        .then(|| (GO_HANDLE_STREAM.to_string(), Prog::GoHandleStream))
}

fn short(sym: &str) -> &str {
    sym.strip_prefix("google.golang.org/grpc.(*Server).")
        .or_else(|| sym.rsplit('.').next())
        .unwrap_or(sym)
}

/// Offset of the `push %rbp` that follows a Go amd64 stack-check prologue
/// at the start of `code`, or 0 (probe the entry) for any other code.
///   cmp 0x10(%r14),%rsp                       49 3b 66 10
/// or
///   lea -N(%rsp),%r12                         4c 8d 64 24 d8 | 4c 8d a4 24 d32
///   cmp 0x10(%r14),%r12                       4d 3b 66 10
/// then
///   jbe morestack                             76 d8 | 0f 86 d32
///   push %rbp                                 55
pub(crate) fn past_stack_check(code: &[u8]) -> u64 {
    let mut at = if code.starts_with(&[0x49, 0x3b, 0x66, 0x10]) {
        4
    } else {
        let lea = if code.starts_with(&[0x4c, 0x8d, 0x64, 0x24]) {
            5
        } else if code.starts_with(&[0x4c, 0x8d, 0xa4, 0x24]) {
            8
        } else {
            return 0;
        };
        if code.get(lea..lea + 4) != Some(&[0x4d, 0x3b, 0x66, 0x10]) {
            return 0;
        }
        lea + 4
    };
    at += match code.get(at) {
        Some(0x76) => 2,
        Some(0x0f) if code.get(at + 1) == Some(&0x86) => 6,
        _ => return 0,
    };
    if code.get(at) == Some(&0x55) {
        at as u64
    } else {
        0
    }
}

/// What to probe in a Go executable with build info `go`, `modinfo`.
pub(crate) fn discovery(elf: &Elf, exe: &Path, real: &Path, go: &str, modinfo: &str) -> Discovery {
    let grpc_version = module_version(modinfo, GRPC_GO_MODULE);
    let syms = match elf.functions(wanted) {
        Ok(s) => s,
        Err(e) => return Discovery::Unusable(format!("{}: {e}", real.display())),
    };
    let with = grpc_version
        .as_deref()
        .map_or(String::new(), |v| format!(" {v}"));
    if grpc_version.is_none() && !syms.offsets.contains_key(GO_HANDLE_STREAM) {
        return Discovery::NotGrpc;
    }
    let who = format!("{} (Go {go}, grpc-go{with})", real.display());
    if !syms.has_symtab {
        return Discovery::Unusable(format!(
            "{who} is stripped (no symbol table): the gRPC uprobes cannot be placed; \
             build it without -ldflags=-s for per-call latency"
        ));
    }
    if !matches!(go_minor_version(go), Some(m) if m >= GO_REGABI_MINOR) {
        return Discovery::Unusable(format!(
            "{who}: Go before 1.17 passes arguments on the stack, which these \
             probes do not read"
        ));
    }
    let (Some((start, prog)), Some(end)) = (start_symbol(&syms), end_symbol(&syms)) else {
        return Discovery::Unusable(format!(
            "{who} has no {GO_HANDLE_STREAM} and (*http2Server).WriteStatus/writeStatus: \
             not a grpc-go server, or a grpc-go version these probes do not know"
        ));
    };
    let site = |prog, sym: &str| {
        let entry = syms.offsets[sym];
        let skip = elf.read_at(entry, 32).map_or(0, |c| past_stack_check(&c));
        Site {
            prog,
            path: exe.to_path_buf(),
            offset: entry + skip,
            symbol: if skip == 0 {
                sym.to_string()
            } else {
                format!("{sym}+{skip:#x}")
            },
        }
    };
    Discovery::Probes {
        stack: format!("grpc-go{with} ({} .. {})", short(&start), short(end)),
        sites: vec![site(prog, &start), site(Prog::GoWriteStatus, end)],
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::syms;
    use super::*;

    const F1: &str = "google.golang.org/grpc.(*Server).serveStreams.func1";
    const F2: &str = "google.golang.org/grpc.(*Server).serveStreams.func2";
    const F2_1: &str = "google.golang.org/grpc.(*Server).serveStreams.func2.1";
    const F1_1: &str = "google.golang.org/grpc.(*Server).serveStreams.func1.1";

    #[test]
    fn picks_either_spelling_of_write_status() {
        assert_eq!(
            end_symbol(&syms(&[GO_HANDLE_STREAM, GO_WRITE_STATUS_OLD])),
            Some(GO_WRITE_STATUS_OLD)
        );
        assert_eq!(
            end_symbol(&syms(&[GO_HANDLE_STREAM, GO_WRITE_STATUS_NEW])),
            Some(GO_WRITE_STATUS_NEW)
        );
        // The ServerStream method of >= 1.69 is not the transport's.
        assert_eq!(
            end_symbol(&syms(&[
                "google.golang.org/grpc/internal/transport.(*ServerStream).WriteStatus"
            ])),
            None
        );
    }

    #[test]
    fn starts_at_the_hand_off_closure_whichever_its_number() {
        // grpc-go >= 1.59: func1 is a deferred cleanup, func2 the callback.
        let s = syms(&[
            GO_HANDLE_STREAM,
            F1,
            F2,
            F2_1,
            &format!("{F2_1}.deferwrap1"),
        ]);
        assert_eq!(
            start_symbol(&s),
            Some((F2.to_string(), Prog::GoStreamHandOff))
        );
        // Older: func1 is the callback, func2 a trace-context function.
        let s = syms(&[GO_HANDLE_STREAM, F1, F1_1, F2]);
        assert_eq!(
            start_symbol(&s),
            Some((F1.to_string(), Prog::GoStreamHandOff))
        );
    }

    #[test]
    fn falls_back_to_handle_stream_when_the_closure_is_unclear() {
        let h = Some((GO_HANDLE_STREAM.to_string(), Prog::GoHandleStream));
        assert_eq!(start_symbol(&syms(&[GO_HANDLE_STREAM, F1, F2])), h);
        assert_eq!(
            start_symbol(&syms(&[GO_HANDLE_STREAM, F1, F1_1, F2, F2_1])),
            h
        );
        assert_eq!(start_symbol(&syms(&[F1, F2])), None);
    }

    #[test]
    fn skips_go_stack_checks_to_the_push() {
        // serveStreams.func2 of grpc-go 1.79 (small frame, short jbe).
        let small = [0x49, 0x3b, 0x66, 0x10, 0x76, 0x23, 0x55, 0x48, 0x89, 0xe5];
        assert_eq!(past_stack_check(&small), 6);
        // writeStatus (large frame: lea disp32, long jbe).
        let large = [
            0x4c, 0x8d, 0xa4, 0x24, 0x30, 0xfe, 0xff, 0xff, 0x4d, 0x3b, 0x66, 0x10, 0x0f, 0x86,
            0xec, 0x0b, 0x00, 0x00, 0x55, 0x48,
        ];
        assert_eq!(past_stack_check(&large), 18);
        let lea8 = [
            0x4c, 0x8d, 0x64, 0x24, 0xd8, 0x4d, 0x3b, 0x66, 0x10, 0x76, 0x10, 0x55,
        ];
        assert_eq!(past_stack_check(&lea8), 11);
        // Anything else: the entry.
        assert_eq!(past_stack_check(&[0x55, 0x48, 0x89, 0xe5]), 0);
        assert_eq!(
            past_stack_check(&[0x49, 0x3b, 0x66, 0x10, 0x76, 0x23, 0x48]),
            0
        );
        assert_eq!(past_stack_check(&[0x49, 0x3b, 0x66]), 0);
    }

    #[test]
    fn describes_the_probes_briefly() {
        assert_eq!(short(F2), "serveStreams.func2");
        assert_eq!(short(GO_HANDLE_STREAM), "handleStream");
        assert_eq!(short(GO_WRITE_STATUS_NEW), "writeStatus");
    }
}
