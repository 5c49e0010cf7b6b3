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
    let site = |prog, sym: &str| Site {
        prog,
        path: exe.to_path_buf(),
        offset: syms.offsets[sym],
        symbol: sym.to_string(),
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
    fn describes_the_probes_briefly() {
        assert_eq!(short(F2), "serveStreams.func2");
        assert_eq!(short(GO_HANDLE_STREAM), "handleStream");
        assert_eq!(short(GO_WRITE_STATUS_NEW), "writeStatus");
    }
}
