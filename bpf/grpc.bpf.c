// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * qosd gRPC call tracer: per-call, server-side latency of gRPC servers that
 * multiplex many calls (HTTP/2 streams) on one connection, where syscalls
 * cannot tell the calls apart.
 *
 * In the kernel: uprobes on the server's gRPC library mark each call's start
 * and end, keyed by (tgid, address of the library's stream object); the end
 * emits one GRPC record into the request tracer's ring buffer (emit.h: the
 * `events` and `counters` maps here are the very maps of requests.bpf.c,
 * userspace hands their fds over before load). Userspace resolves the symbols to file
 * offsets and attaches each program per traced pid; nothing here attaches
 * by itself (bare SEC("uprobe")).
 *
 * Hooks (x86-64 only: the registers are read by name):
 *   grpc-go (Go register ABI: RAX, RBX, RCX, RDI, RSI, ... in order; an
 *   interface takes two registers; a closure's context is in RDX, not an
 *   argument; no uretprobes on Go: they corrupt moving goroutine stacks, so
 *   both ends are function entries; sensors/src/ebpf/grpc/go.rs picks):
 *     go_stream_handoff  the closure google.golang.org/grpc.(*Server).
 *                        serveStreams.funcN(stream RAX) that the transport
 *                        calls with each new stream (HEADERS decoded)
 *     go_handle_stream   or, where that closure cannot be told apart,
 *                        google.golang.org/grpc.(*Server).handleStream(
 *                          s RAX, t ServerTransport RBX:RCX, stream RDI, ...)
 *     go_write_status    .../internal/transport.(*http2Server).WriteStatus
 *                        (< 1.69) or .writeStatus (>= 1.69)(t RAX, s RBX, ...)
 *   gRPC C-core (System V ABI: RDI, RSI, RDX, RCX, ...):
 *     ccore_stream_new   grpc_chttp2_stream::grpc_chttp2_stream(this RDI,
 *                          transport RSI, refcount RDX, server_data RCX, ...);
 *                        server_data is NULL for client streams: skipped
 *     ccore_stream_closed  grpc_chttp2_mark_stream_closed(t RDI, s RSI,
 *                          close_reads EDX, close_writes ECX, ...); the call
 *                        ends when writes close, i.e. once the trailing
 *                        metadata (the status) has been written out
 * Userspace places each probe on the function's first `push` (past Go's
 * stack check, past an endbr64) where it can: the kernel emulates a push
 * but single-steps other instructions (two traps, ten times the cost), and
 * the argument registers are still those of the entry there. Where it
 * cannot, the probe is on the entry, which a Go function that grows its
 * stack runs twice: a second start only moves the start a few ns later, a
 * second end finds its entry gone. Calls begun before tracing have no
 * start: skipped.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "requests.h"
#include "emit.h" /* events, counters: requests.bpf.c's (fds reused before load) */

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct grpc_key _grpc_key_type = {};

/* Calls in flight: stream -> start time. LRU: calls that never end (the
 * process killed mid-call) cannot fill it. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct grpc_key);
	__type(value, __u64);
} grpc_calls SEC(".maps");

static __always_inline void call_start(__u64 stream)
{
	if (!stream)
		return;
	struct grpc_key k = { .tgid = bpf_get_current_pid_tgid() >> 32,
			      .stream = stream };
	__u64 now = bpf_ktime_get_ns();
	bpf_map_update_elem(&grpc_calls, &k, &now, BPF_ANY);
}

static __always_inline void call_end(__u64 stream)
{
	struct grpc_key k = { .tgid = bpf_get_current_pid_tgid() >> 32,
			      .stream = stream };
	__u64 *start = bpf_map_lookup_elem(&grpc_calls, &k);
	if (!start)
		return;
	__u64 start_ns = *start;
	/* Delete first: a second end of the same call finds nothing. */
	if (bpf_map_delete_elem(&grpc_calls, &k))
		return;
	/* No wakeup: the consumer drains the ring every 20 ms anyway, and a
	 * wakeup per call (a context switch to the consumer) was most of the
	 * cost: Go fixture, one call in flight, 2-CPU VM, client p50 +95 us
	 * over no tracing with a wakeup per record, +35 us without (as much as
	 * the syscall tracepoints of `turn` mode alone). */
	emit_record(QOSD_REC_GRPC, k.tgid, 0, stream, 0, start_ns, start_ns,
		    bpf_ktime_get_ns(), QOSD_NEVER_WAKE);
}

SEC("uprobe")
int go_stream_handoff(struct pt_regs *ctx)
{
	call_start(ctx->ax);
	return 0;
}

SEC("uprobe")
int go_handle_stream(struct pt_regs *ctx)
{
	call_start(ctx->di);
	return 0;
}

SEC("uprobe")
int go_write_status(struct pt_regs *ctx)
{
	call_end(ctx->bx);
	return 0;
}

SEC("uprobe")
int ccore_stream_new(struct pt_regs *ctx)
{
	if (ctx->cx) /* server_data: a server-side stream */
		call_start(ctx->di);
	return 0;
}

SEC("uprobe")
int ccore_stream_closed(struct pt_regs *ctx)
{
	if ((__u32)ctx->cx) /* close_writes */
		call_end(ctx->si);
	return 0;
}
