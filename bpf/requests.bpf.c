// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * qosd request tracer: per-request, server-side latency from syscalls.
 *
 * In the kernel: follow every connection a traced process accepted, keyed by
 * (tgid, fd), and cut its byte stream into requests:
 *   - TURN records: a request starts at the first inbound bytes after the
 *     server last wrote, and ends at the last outbound bytes before the next
 *     inbound bytes or the close (keep-alive HTTP/1.1, memcached, redis);
 *     each carries the requests its inbound bytes completed, counted from
 *     the read's buffer as on the socket path (count.h: pipelined requests
 *     count as several, a TLS handshake's turns as none);
 *   - CONN records: accept -> close of the accepted fd (one request per
 *     connection, e.g. HTTP with "Connection: close");
 *   - H2 records: the connection's first inbound bytes are the HTTP/2 client
 *     preface (a gRPC or other HTTP/2 server: userspace then knows that
 *     turns mean nothing on it; per-call boundaries come from grpc.bpf.c).
 * All kinds are emitted (as the target's emit bits allow); userspace picks
 * the mode that fits what it observes ("auto") and does all the statistics.
 *
 * Hooks (this kernel has no kprobes and no fentry):
 *   tp_btf/sys_exit (raw_syscalls: every syscall's exit, with its pt_regs)
 *     accept, accept4                    new connection (+ its local port)
 *     read, readv, recvfrom, recvmsg     inbound bytes
 *     write, writev, sendto, sendmsg, sendfile  outbound bytes
 *   tracepoint/syscalls/sys_enter_close  end of connection (at enter: the fd
 *                                        can be reused by another thread
 *                                        before exit)
 *   tp_btf/sched_process_fork, _exit     process trees (follow.h), as on the
 *                                        socket path
 *
 * Cost: these hooks run for every process on the node, so the first thing
 * each program does is a bitmap test on the tgid (`traced`, exact, one
 * array load); untraced processes, the load generator among them, leave
 * there. One program on the raw sys_exit tracepoint instead of an enter and
 * an exit program per syscall: the syscall's arguments are still in its
 * pt_regs at exit (the syscall reads them, never writes them), so nothing
 * has to travel from enter to exit, and a raw tracepoint skips the perf
 * buffer the per-syscall tracepoints fill for every run. A memcached get is
 * two traced runs (read, sendmsg) where it was four plus a hash insert and
 * delete.
 *
 * Records go through one ring buffer (emit.h); a full buffer is counted per
 * CPU in `counters`, never silently. The connection table is an LRU map so
 * stale entries (SIGKILLed processes, connections traced mid-way) cannot
 * grow it without bound.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "requests.h"
#include "emit.h"
#include "preface.h"
#include "targets.h"
#include "follow.h"
#include "count.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/*
 * Wake the reader only once this many bytes of records wait (set before
 * load; 0 wakes it for every record). Below it the reader takes them at its
 * next timed poll (every 20 ms), so a server doing thousands of requests a
 * second costs the reader tens of wakeups a second, not one per request.
 */
const volatile __u64 wakeup_bytes = 0;

/* Globals so that the skeleton emits the Rust types of the contract. */
struct req_record _rec_type = {};
struct conn_state _conn_type = {};
struct target_cfg _cfg_type = {};
struct port_key _port_type = {};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct conn_key);
	__type(value, struct conn_state);
} conns SEC(".maps");

/* arch/x86/include/asm/thread_info.h: the task is in a 32-bit syscall. */
#define TS_COMPAT 0x0002

static __always_inline void emit(__u32 tgid, __u32 fd, struct conn_state *cs,
				 __u8 kind, __u64 start, __u64 end)
{
	/* Counted under the traced root (a followed child's requests are
	 * its ancestor's); the entry is gone once the child exited. */
	struct target_cfg *cfg = bpf_map_lookup_elem(&targets, &tgid);
	__u32 root = cfg ? cfg->root : tgid;
	/* No arrival time on this path: latency == service. */
	emit_record(kind, root, fd, cs->conn_id, cs->turns, start, start, end,
		    wakeup_bytes);
}

/* The TURN record of the turn in flight, with the requests it carries. */
static __always_inline void emit_turn(__u32 tgid, __u32 fd,
				      struct conn_state *cs)
{
	if (!(cs->emit & QOSD_EMIT_TURN))
		return;
	struct target_cfg *cfg = bpf_map_lookup_elem(&targets, &tgid);
	__u32 root = cfg ? cfg->root : tgid;
	emit_record_n(QOSD_REC_TURN, root, fd, cs->conn_id, cs->turns,
		      cs->nreq, cs->req_start_ns, cs->req_start_ns,
		      cs->last_out_ns, wakeup_bytes);
}

/* Local port of the socket behind fd in the current task (host order). */
static __always_inline __u16 local_port(int fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct file **fdarr = BPF_CORE_READ(task, files, fdt, fd);
	struct file *f = NULL;
	bpf_probe_read_kernel(&f, sizeof(f), &fdarr[fd]);
	if (!f)
		return 0;
	struct socket *sock = BPF_CORE_READ(f, private_data);
	if (!sock)
		return 0;
	return BPF_CORE_READ(sock, sk, __sk_common.skc_num);
}

/* A new connection of a traced process (its tgid bit is set). */
static __always_inline void on_accept_exit(__u32 tgid, long ret)
{
	if (ret < 0)
		return;
	struct target_cfg *cfg = bpf_map_lookup_elem(&targets, &tgid);
	if (!cfg)
		return;
	__u16 port = local_port(ret);
	if (cfg->port_filter) {
		struct port_key pk = { .tgid = cfg->root, .port = port };
		if (!bpf_map_lookup_elem(&ports, &pk))
			return;
	}
	struct conn_key key = { .tgid = tgid, .fd = ret };
	__u64 now = bpf_ktime_get_ns();
	struct conn_state cs = {
		/* Unique within the process: an fd number cannot be accepted
		 * twice in one nanosecond. Seeded entries set the top bit. */
		.conn_id = ((now << 16) | (ret & 0xffff)) & ~(1ULL << 63),
		.accept_ns = now,
		.port = port,
		.state = QOSD_ST_IDLE,
		.emit = cfg->emit,
	};
	bpf_map_update_elem(&conns, &key, &cs, BPF_ANY);
}

/* Bytes moved on fd (args of the syscall: fd, arg1) by a traced process. */
static __always_inline void on_io_exit(__u32 tgid, long fd, long ret,
				       __u32 dir, __u64 arg1, int kind)
{
	if (fd < 0 || ret <= 0)
		return;
	struct conn_key key = { .tgid = tgid, .fd = fd };
	struct conn_state *cs = bpf_map_lookup_elem(&conns, &key);
	if (!cs)
		return;
	__u64 now = bpf_ktime_get_ns();
	/* Only a connection's first inbound bytes can be the preface. */
	if (dir == 0 && cs->turns == 0 && (cs->emit & QOSD_EMIT_H2) &&
	    ret >= QOSD_H2_PREFACE_LEN) {
		__u64 buf = first_buf(arg1, kind);
		if (buf && is_h2_preface(buf))
			emit(key.tgid, key.fd, cs, QOSD_REC_H2, now, now);
	}
	if (dir == 0) {
		if (cs->state == QOSD_ST_RESPONDING) {
			emit_turn(key.tgid, key.fd, cs);
			cs->state = QOSD_ST_IDLE;
		}
		if (cs->state == QOSD_ST_IDLE) {
			cs->turns += 1;
			cs->req_start_ns = now;
			cs->state = QOSD_ST_IN_REQ;
			cs->nreq = 0;
		}
		/* Only TURN records carry counts. */
		__u32 done = 0;
		if (cs->emit & QOSD_EMIT_TURN) {
			long n = count_skipped(&cs->parse, ret);
			done = n >= 0 ? n :
					count_in(&cs->parse, ret,
						 user_buf(arg1, kind, ret));
		}
		cs->nreq = turn_requests(&cs->parse, cs->nreq, done);
		/* A TLS connection's time starts at its first request (no
		 * arrival on this path: its first read). */
		if (tls_first_request(&cs->parse, cs->nreq) && cs->accept_ns)
			cs->accept_ns = cs->req_start_ns;
	} else if (cs->state != QOSD_ST_IDLE) {
		/* Outbound bytes before any request (a greeting) are not a reply. */
		cs->state = QOSD_ST_RESPONDING;
		cs->last_out_ns = now;
	}
}

/* Every syscall of every process ends here: leave at once unless traced. */
SEC("tp_btf/sys_exit")
int BPF_PROG(qosd_sys_exit, struct pt_regs *regs, long ret)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_traced(tgid))
		return 0;
	/* A 32-bit syscall has other numbers and argument registers; the
	 * per-syscall tracepoints skip those too. */
	struct task_struct *task = bpf_get_current_task_btf();
	if (task->thread_info.status & TS_COMPAT)
		return 0;
	long fd = regs->di;
	__u64 nr = regs->orig_ax;
	/* One call site per direction: the request counter is inlined. */
	int kind = read_kind(nr);
	if (kind != BUF_NONE) {
		if (!peeked(nr, regs))
			on_io_exit(tgid, fd, ret, 0, regs->si, kind);
		return 0;
	}
	switch (nr) {
	case NR_write:
	case NR_writev:
	case NR_sendto:
	case NR_sendmsg:
	case NR_sendfile: /* fd is out_fd: the socket */
		on_io_exit(tgid, fd, ret, 1, 0, BUF_NONE);
		break;
	case NR_accept:
	case NR_accept4:
		on_accept_exit(tgid, ret);
		break;
	}
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_close")
int enter_close(struct trace_event_raw_sys_enter *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	long fd = ctx->args[0];
	if (fd < 0 || !is_traced(tgid))
		return 0;
	struct conn_key key = { .tgid = tgid, .fd = fd };
	struct conn_state *cs = bpf_map_lookup_elem(&conns, &key);
	if (!cs)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (cs->state == QOSD_ST_RESPONDING)
		emit_turn(key.tgid, key.fd, cs);
	/* accept_ns == 0: seeded by userspace, accepted before tracing began. */
	if ((cs->emit & QOSD_EMIT_CONN) && had_request(&cs->parse, cs->turns) &&
	    cs->accept_ns)
		emit(key.tgid, key.fd, cs, QOSD_REC_CONN, cs->accept_ns, now);
	bpf_map_delete_elem(&conns, &key);
	return 0;
}
