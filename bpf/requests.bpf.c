// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * qosd request tracer: per-request, server-side latency from syscalls.
 *
 * In the kernel: follow every connection a traced process accepted, keyed by
 * (tgid, fd), and cut its byte stream into requests:
 *   - TURN records: a request starts at the first inbound bytes after the
 *     server last wrote, and ends at the last outbound bytes before the next
 *     inbound bytes or the close (keep-alive HTTP/1.1, memcached, redis);
 *   - CONN records: accept -> close of the accepted fd (one request per
 *     connection, e.g. HTTP with "Connection: close");
 *   - H2 records: the connection's first inbound bytes are the HTTP/2 client
 *     preface (a gRPC or other HTTP/2 server: userspace then knows that
 *     turns mean nothing on it; per-call boundaries come from grpc.bpf.c).
 * All kinds are emitted (as the target's emit bits allow); userspace picks
 * the mode that fits what it observes ("auto") and does all the statistics.
 *
 * Hooks: syscall tracepoints only (this kernel has no kprobes and no fentry).
 *   sys_exit_accept{,4}            new connection (+ its local port, CO-RE)
 *   sys_enter/exit_read, readv, recvfrom, recvmsg        inbound bytes
 *   sys_enter/exit_write, writev, sendto, sendmsg, sendfile64  outbound bytes
 *   sys_enter_close                end of connection (at enter: the fd can be
 *                                  reused by another thread before exit)
 * Syscall arguments travel from enter to exit keyed by thread (pid_tgid), so
 * two threads of one process never see each other's arguments.
 *
 * Records go through one ring buffer; a full buffer is counted per CPU in
 * `counters`, never silently. Connection and argument tables are LRU maps so
 * stale entries (SIGKILLed processes, connections traced mid-way) cannot grow
 * them without bound.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "requests.h"

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
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32); /* tgid */
	__type(value, struct target_cfg);
} targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct port_key);
	__type(value, __u8);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct conn_key);
	__type(value, struct conn_state);
} conns SEC(".maps");

/* Arguments of a syscall in flight on one thread. */
struct io_args {
	__u32 fd;
	__u32 dir; /* 0 inbound, 1 outbound */
	__u64 buf; /* first inbound buffer of a connection, for the preface */
};

/* How an inbound syscall passes its buffer (args[1]). */
#define BUF_NONE 0
#define BUF_FLAT 1 /* read, recvfrom: the buffer */
#define BUF_IOV 2  /* readv: struct iovec[] */
#define BUF_MSG 3  /* recvmsg: struct user_msghdr */

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* pid_tgid */
	__type(value, struct io_args);
} inflight SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 128 * 1024); /* resized by userspace before load */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, QOSD_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &idx);
	if (c)
		*c += 1;
}

static __always_inline void emit(__u32 tgid, __u32 fd, struct conn_state *cs,
				  __u8 kind, __u64 start, __u64 end)
{
	struct req_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count(QOSD_CNT_LOST);
		return;
	}
	r->start_ns = start;
	r->end_ns = end;
	r->conn_id = cs->conn_id;
	r->tgid = tgid;
	r->fd = fd;
	r->turns = cs->turns;
	r->kind = kind;
	r->pad[0] = r->pad[1] = r->pad[2] = 0;
	__u64 waiting = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(r, waiting >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP
						     : BPF_RB_NO_WAKEUP);
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

static __always_inline int on_accept_exit(long ret)
{
	if (ret < 0)
		return 0;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct target_cfg *cfg = bpf_map_lookup_elem(&targets, &tgid);
	if (!cfg)
		return 0;
	__u16 port = local_port(ret);
	if (cfg->port_filter) {
		struct port_key pk = { .tgid = tgid, .port = port };
		if (!bpf_map_lookup_elem(&ports, &pk))
			return 0;
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
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_accept4")
int exit_accept4(struct trace_event_raw_sys_exit *ctx)
{
	return on_accept_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_accept")
int exit_accept(struct trace_event_raw_sys_exit *ctx)
{
	return on_accept_exit(ctx->ret);
}

/* The user address where the first inbound bytes will land (0: unknown or
 * too small a first piece to hold the preface). */
static __always_inline __u64 first_buf(__u64 arg, int kind)
{
	struct iovec iov = {};
	if (kind == BUF_FLAT)
		return arg;
	if (kind == BUF_MSG) {
		struct user_msghdr m = {};
		if (bpf_probe_read_user(&m, sizeof(m), (void *)arg))
			return 0;
		arg = (__u64)m.msg_iov;
	}
	if (kind == BUF_NONE || bpf_probe_read_user(&iov, sizeof(iov), (void *)arg))
		return 0;
	return iov.iov_len < QOSD_H2_PREFACE_LEN ? 0 : (__u64)iov.iov_base;
}

/* Syscall enter on a possibly-traced fd: remember it for the exit. */
static __always_inline int on_io_enter(long fd, __u32 dir, __u64 arg1, int kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct conn_key key = { .tgid = id >> 32, .fd = fd };
	if (fd < 0)
		return 0;
	struct conn_state *cs = bpf_map_lookup_elem(&conns, &key);
	if (!cs)
		return 0;
	struct io_args a = { .fd = fd, .dir = dir };
	/* Only a connection's first inbound bytes can be the preface. */
	if (dir == 0 && cs->turns == 0 && (cs->emit & QOSD_EMIT_H2))
		a.buf = first_buf(arg1, kind);
	bpf_map_update_elem(&inflight, &id, &a, BPF_ANY);
	return 0;
}

/* Whether the bytes at buf open with the HTTP/2 client preface. */
static __always_inline bool is_h2_preface(__u64 buf)
{
	/* "PRI * HTTP/2.0\r\n" as two little-endian words. */
	const __u64 want0 = 0x5448202a20495250ULL; /* "PRI * HT" */
	const __u64 want1 = 0x0a0d302e322f5054ULL; /* "TP/2.0\r\n" */
	__u64 got[2] = {};
	if (bpf_probe_read_user(got, sizeof(got), (void *)buf))
		return false;
	return got[0] == want0 && got[1] == want1;
}

static __always_inline int on_io_exit(long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct io_args *a = bpf_map_lookup_elem(&inflight, &id);
	if (!a)
		return 0;
	struct conn_key key = { .tgid = id >> 32, .fd = a->fd };
	__u32 dir = a->dir;
	__u64 buf = a->buf;
	bpf_map_delete_elem(&inflight, &id);
	if (ret <= 0)
		return 0;
	struct conn_state *cs = bpf_map_lookup_elem(&conns, &key);
	if (!cs)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (dir == 0 && buf && cs->turns == 0 && ret >= QOSD_H2_PREFACE_LEN &&
	    is_h2_preface(buf))
		emit(key.tgid, key.fd, cs, QOSD_REC_H2, now, now);
	if (dir == 0) {
		if (cs->state == QOSD_ST_RESPONDING) {
			if (cs->emit & QOSD_EMIT_TURN)
				emit(key.tgid, key.fd, cs, QOSD_REC_TURN,
				     cs->req_start_ns, cs->last_out_ns);
			cs->state = QOSD_ST_IDLE;
		}
		if (cs->state == QOSD_ST_IDLE) {
			cs->turns += 1;
			cs->req_start_ns = now;
			cs->state = QOSD_ST_IN_REQ;
		}
	} else if (cs->state != QOSD_ST_IDLE) {
		/* Outbound bytes before any request (a greeting) are not a reply. */
		cs->state = QOSD_ST_RESPONDING;
		cs->last_out_ns = now;
	}
	return 0;
}

#define IO_PAIR(name, dir, bufkind)                                      \
	SEC("tracepoint/syscalls/sys_enter_" #name)                     \
	int enter_##name(struct trace_event_raw_sys_enter *ctx)         \
	{                                                               \
		return on_io_enter(ctx->args[0], dir, ctx->args[1],     \
				   bufkind);                            \
	}                                                               \
	SEC("tracepoint/syscalls/sys_exit_" #name)                      \
	int exit_##name(struct trace_event_raw_sys_exit *ctx)           \
	{                                                               \
		return on_io_exit(ctx->ret);                            \
	}

IO_PAIR(read, 0, BUF_FLAT)
IO_PAIR(readv, 0, BUF_IOV)
IO_PAIR(recvfrom, 0, BUF_FLAT)
IO_PAIR(recvmsg, 0, BUF_MSG)
IO_PAIR(write, 1, BUF_NONE)
IO_PAIR(writev, 1, BUF_NONE)
IO_PAIR(sendto, 1, BUF_NONE)
IO_PAIR(sendmsg, 1, BUF_NONE)
IO_PAIR(sendfile64, 1, BUF_NONE) /* args[0] is out_fd: the socket */

SEC("tracepoint/syscalls/sys_enter_close")
int enter_close(struct trace_event_raw_sys_enter *ctx)
{
	long fd = ctx->args[0];
	struct conn_key key = { .tgid = bpf_get_current_pid_tgid() >> 32,
				.fd = fd };
	if (fd < 0)
		return 0;
	struct conn_state *cs = bpf_map_lookup_elem(&conns, &key);
	if (!cs)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (cs->state == QOSD_ST_RESPONDING && (cs->emit & QOSD_EMIT_TURN))
		emit(key.tgid, key.fd, cs, QOSD_REC_TURN, cs->req_start_ns,
		     cs->last_out_ns);
	/* accept_ns == 0: seeded by userspace, accepted before tracing began. */
	if ((cs->emit & QOSD_EMIT_CONN) && cs->turns > 0 && cs->accept_ns)
		emit(key.tgid, key.fd, cs, QOSD_REC_CONN, cs->accept_ns, now);
	bpf_map_delete_elem(&conns, &key);
	return 0;
}
