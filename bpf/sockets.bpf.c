// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * qosd request tracer on socket tracepoints (the default path; the syscall
 * path, requests.bpf.c, is the fallback where these are missing).
 *
 * Same record contract as requests.bpf.c (requests.h, emit.h): TURN, CONN
 * and H2 records per accepted connection, here held in the socket's own
 * storage instead of keyed by (tgid, fd), so fd reuse cannot confuse two
 * connections. Each request carries two start times: its arrival (the
 * first sk_data_ready after the server's last send: the bytes reached the
 * server's socket) and its first read; so latency (arrival -> last reply
 * bytes) includes the time a request waits in the socket while the server
 * is busy or descheduled, and service (first read -> last reply bytes) is
 * what the syscall path measures.
 *
 * Hooks (tp_btf: the typed struct sock *; no syscall tracepoint at all, so
 * untraced processes' syscalls stay on their fast path):
 *   sock:inet_sock_set_state  SYN_RECV -> ESTABLISHED on a traced port: an
 *                             accepted connection (handshake done, before
 *                             accept() returns; softirq context, so the
 *                             owner is unknown: it is claimed at its first
 *                             read/write by a traced tgid). Leaving
 *                             ESTABLISHED/CLOSE_WAIT by the server's close
 *                             (FIN_WAIT1, LAST_ACK) or any move to CLOSE
 *                             ends it (a reset's move to CLOSE comes with
 *                             skc_num already zeroed: see state_port()).
 *   sock:sk_data_ready        request bytes queued on the socket (softirq).
 *   sock:sock_recv_length     a read by the task (every read path).
 *   sock:sock_send_length     a write by the task (every write path,
 *                             sendfile/splice included).
 *   sched:sched_process_fork  a traced process forks: the child is traced
 *   sched:sched_process_exit  under the same root / forgotten (follow.h).
 *
 * Per-request ends on HTTP/1.x (replies.h): a connection whose requests
 * are HTTP has its replies parsed too, and each reply completes the oldest
 * request read and not yet answered, timed from that request's own
 * arrival; other protocols end requests by turns.
 *
 * Cost on untraced work: socket events of sockets on untraced ports leave
 * after one array load (the traced-port bitmap); fork/exit after one tgid
 * bitmap load. On a traced connection, BPF calls are what cost (~40 ns
 * each on this VM, the CPU's return-thunk mitigation: see count.h), so each
 * program makes one socket-storage lookup and takes its times from TCP's
 * own clock stamps where it can (tcp_stamp()).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "requests.h"
#include "emit.h"
#include "preface.h"
#include "targets.h"
#include "follow.h"
#include "count.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* See requests.bpf.c: wake the reader once this many bytes wait. */
const volatile __u64 wakeup_bytes = 0;

/* Globals so that the skeleton emits the Rust types of the contract. */
struct req_record _rec_type = {};
struct sock_state _sock_type = {};
struct target_cfg _cfg_type = {};
struct port_key _port_type = {};
struct reply_fifo _fifo_type = {};

/* Per-connection state in the socket's own storage: found from the socket
 * in a few loads (no hash of the address per event, no LRU bookkeeping),
 * freed by the kernel with the socket, so a later socket at the same
 * address can never inherit it. Userspace reaches an entry through a
 * socket fd (its copy of the owner's, pidfd_getfd()). */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_state);
} socks SEC(".maps");

/* Local TCP ports traced processes listen on, one bit each (filled by
 * userspace from /proc). The softirq hooks cannot know the task that owns
 * a socket; this is their first and only test for untraced sockets. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, QOSD_PORT_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} lports SEC(".maps");

#include "replies.h"

#define TCP_ESTABLISHED 1
#define TCP_SYN_RECV 3
#define TCP_FIN_WAIT1 4
#define TCP_CLOSE 7
#define TCP_CLOSE_WAIT 8
#define TCP_LAST_ACK 9
#define IPPROTO_TCP 6

static __always_inline bool port_traced(__u16 port)
{
	__u32 word = port >> 6;
	__u64 *bits = bpf_map_lookup_elem(&lports, &word);
	return bits && (*bits >> (port & 63)) & 1;
}

static __always_inline void emit(struct sock_state *ss, __u8 kind,
				 __u64 arrive, __u64 start, __u64 end)
{
	emit_record(kind, ss->tgid, 0, ss->conn_id, ss->turns, arrive, start,
		    end, wakeup_bytes);
}

/*
 * The TURN record of the turn in flight: as many requests as its inbound
 * bytes completed (count.h), ending at its last reply bytes. Those its
 * first read completed are timed from the turn's arrival; those later
 * reads completed (a server that reads ahead while replies are pending,
 * with a client that pipelines: they arrived after the turn began) go in
 * a second record, timed from the mean arrival and mean read of their
 * own reads, with turns == 0 (a continuation, not a turn: it opens no
 * connection). Timed from the turn's arrival, each of them was charged
 * the first one's wait, and the eBPF p99 of a busy fixture read above
 * the client's (docs/requests.md, "Timing"). A TLS connection's clock
 * (its CONN record) starts at its first request, not at the handshake.
 */
static __always_inline void emit_turn(struct sock_state *ss)
{
	if (tls_first_request(&ss->parse, ss->nreq) && ss->accept_ns) {
		ss->accept_ns = ss->req_arrive_ns;
		ss->first_read_ns = ss->req_start_ns;
	}
	if (!(ss->emit & QOSD_EMIT_TURN))
		return;
	__u16 nlater = ss->nlater < ss->nreq ? ss->nlater : ss->nreq;
	/* A turn whose requests all came in later reads still needs its
	 * first record if it opened the connection (auto mode counts them). */
	if (nlater < ss->nreq || ss->turns == 1 || !nlater)
		emit_record_n(QOSD_REC_TURN, ss->tgid, 0, ss->conn_id,
			      ss->turns, ss->nreq - nlater, ss->req_arrive_ns,
			      ss->req_start_ns, ss->last_out_ns, wakeup_bytes);
	if (!nlater)
		return;
	__u64 start = ss->req_start_ns + ss->later_read_sum / nlater;
	__u64 arrive = ss->req_arrive_ns + ss->later_arrive_sum / nlater;
	start = start < ss->last_out_ns ? start : ss->last_out_ns;
	arrive = arrive < start ? arrive : start;
	emit_record_n(QOSD_REC_TURN, ss->tgid, 0, ss->conn_id, 0, nlater,
		      arrive, start, ss->last_out_ns, wakeup_bytes);
}

/* The entry of sk (NULL: none). The helper takes sockets as void *. */
static __always_inline struct sock_state *entry_of(const struct sock *sk)
{
	return bpf_sk_storage_get(&socks, (void *)sk, 0, 0);
}

/* A new entry: accepted now (accept_ns != 0) or found open (0). An entry
 * already there is kept (the storage helper creates only). */
static __always_inline struct sock_state *track(const struct sock *sk,
						__u16 port, __u64 accept_ns,
						__u64 arrive_ns)
{
	__u64 now = bpf_ktime_get_ns();
	struct sock_state ss = {
		/* Unique: one CPU cannot track two connections in one ns.
		 * Connections found open set the top bit, like the seeded
		 * ones of the syscall path. */
		.conn_id = ((now << 8) | (bpf_get_smp_processor_id() & 0xff)) &
			   ~(1ULL << 63),
		.accept_ns = accept_ns,
		.arrive_ns = arrive_ns,
		.port = port,
		.state = QOSD_ST_IDLE,
	};
	if (!accept_ns)
		ss.conn_id |= 1ULL << 63;
	return bpf_sk_storage_get(&socks, (void *)sk, &ss,
				  BPF_SK_STORAGE_GET_F_CREATE);
}

/* The connection is over: its last turn and its CONN record. */
static __always_inline void finish(const struct sock *sk, struct sock_state *ss)
{
	__u64 now = bpf_ktime_get_ns();
	if (ss->tgid) {
		if (ss->state == QOSD_ST_RESPONDING && turn_in_flight(ss))
			emit_turn(ss);
		if ((ss->emit & QOSD_EMIT_CONN) &&
		    had_request(&ss->parse, ss->turns) && ss->accept_ns)
			emit(ss, QOSD_REC_CONN, ss->accept_ns,
			     ss->first_read_ns, now);
	}
	if (ss->by_reply == QOSD_BY_REPLY_ON)
		bpf_sk_storage_delete(&fifos, (void *)sk);
	bpf_sk_storage_delete(&socks, (void *)sk);
}

/*
 * The local port of sk at a state change. A move to CLOSE from ESTABLISHED
 * or CLOSE_WAIT (a reset from the peer, or the server's abortive close with
 * unread data) unbinds the socket before the tracepoint fires:
 * tcp_set_state() -> inet_put_port() zeroes skc_num first. Testing that
 * against the port bitmap lost exactly those closes (their connections
 * never ended, and a later socket at the same address overwrote them).
 * inet_sport (network order) still holds the port then.
 */
static __always_inline __u16 state_port(const struct sock *sk)
{
	__u16 port = sk->__sk_common.skc_num;
	if (port)
		return port;
	__be16 sport = 0;
	bpf_probe_read_kernel(&sport, sizeof(sport),
			      &((struct inet_sock *)sk)->inet_sport);
	return bpf_ntohs(sport);
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(qosd_set_state, const struct sock *sk, const int oldstate,
	     const int newstate)
{
	__u16 port = state_port(sk);
	if (!port_traced(port) || sk->sk_protocol != IPPROTO_TCP)
		return 0;
	if (oldstate == TCP_SYN_RECV && newstate == TCP_ESTABLISHED) {
		track(sk, port, bpf_ktime_get_ns(), 0);
		return 0;
	}
	/* The server closing (FIN_WAIT1 from ESTABLISHED, LAST_ACK from
	 * CLOSE_WAIT) is when close() ran; a reset or abort goes to CLOSE. A
	 * client's FIN alone (ESTABLISHED -> CLOSE_WAIT) ends nothing: the
	 * server may still answer. */
	if (newstate == TCP_FIN_WAIT1 || newstate == TCP_LAST_ACK ||
	    newstate == TCP_CLOSE) {
		struct sock_state *ss = entry_of(sk);
		if (ss)
			finish(sk, ss);
	}
	return 0;
}

/*
 * TCP's clock cache of sk (tcp_clock_cache: CLOCK_MONOTONIC ns,
 * bpf_ktime_get_ns()'s clock), which TCP stamps as it starts on each
 * received segment, as it copies bytes to a reader (tcp_recvmsg ->
 * tcp_rcv_space_adjust) and as it transmits: reading it saves a clock read
 * (a helper call, ~65 ns on this VM). Where the kernel has bpf_rdonly_cast
 * (6.2+; the verifier inlines it) the read costs no call at all; else
 * bpf_skc_to_tcp_sock makes it one. 0: not a TCP socket.
 */
static __always_inline __u64 tcp_stamp(const struct sock *sk)
{
	if (bpf_ksym_exists(bpf_rdonly_cast)) {
		struct tcp_sock *tp = bpf_core_cast(sk, struct tcp_sock);
		return tp->tcp_clock_cache;
	}
	struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);
	return tp ? tp->tcp_clock_cache : 0;
}

/*
 * When the bytes sk_data_ready announces reached the socket: TCP's stamp of
 * the segment, a microsecond or so before data_ready. The stamp is trusted
 * only if it is not older than the connection's last reply or its
 * handshake (a request arrives after both); else (a path that did not
 * refresh it, e.g. a child socket still holding its listener's stamp, or
 * no bound known) the clock is read.
 */
static __always_inline __u64 arrival_ns(const struct sock *sk,
					const struct sock_state *ss)
{
	__u64 floor = ss->last_out_ns > ss->accept_ns ? ss->last_out_ns :
							ss->accept_ns;
	__u64 stamp = tcp_stamp(sk);
	if (floor && stamp >= floor)
		return stamp;
	return bpf_ktime_get_ns();
}

/*
 * When the bytes of a write just made left: TCP stamped its clock as it
 * started transmitting them (tcp_write_xmit). Trusted only when every byte
 * written so far is sent (snd_nxt == write_seq): then a transmit ran after
 * this write queued its bytes, and the stamp lies between it and now
 * (within the transmit's own microseconds). Bytes still queued (autocork,
 * Nagle, a full window) or no bpf_rdonly_cast (before 6.2; a cast by
 * helper would cost the call the clock does): the clock is read.
 */
static __always_inline __u64 sent_ns(const struct sock *sk,
				     const struct sock_state *ss)
{
	if (bpf_ksym_exists(bpf_rdonly_cast)) {
		struct tcp_sock *tp = bpf_core_cast(sk, struct tcp_sock);
		__u64 stamp = tp->tcp_clock_cache;
		if (tp->snd_nxt == tp->write_seq && stamp >= ss->req_start_ns)
			return stamp;
	}
	return bpf_ktime_get_ns();
}

/*
 * Now, for a read of a claimed connection: TCP stamped the clock as it
 * copied the bytes (tcp_rcv_space_adjust, on every read that got any),
 * just before sock_recv_length. Trusted if not older than the request's
 * arrival and the last reply (else the clock is read).
 */
static __always_inline __u64 read_ns(const struct sock *sk,
				     const struct sock_state *ss)
{
	__u64 stamp = tcp_stamp(sk);
	if (stamp && stamp >= ss->arrive_ns && stamp >= ss->last_out_ns &&
	    stamp >= ss->accept_ns)
		return stamp;
	return bpf_ktime_get_ns();
}

SEC("tp_btf/sk_data_ready")
int BPF_PROG(qosd_data_ready, const struct sock *sk)
{
	__u16 port = sk->__sk_common.skc_num;
	if (!port_traced(port))
		return 0;
	struct sock_state *ss = entry_of(sk);
	if (ss) {
		/* Two arrivals: the turn's (first bytes since the server last
		 * wrote) and the next read's (first bytes since it last read;
		 * a read-ahead server's later requests). Usually both are
		 * unset at once: one stamp. */
		if (!ss->arrive_ns || !ss->read_arrive_ns) {
			__u64 t = arrival_ns(sk, ss);
			if (!ss->arrive_ns)
				ss->arrive_ns = t;
			if (!ss->read_arrive_ns)
				ss->read_arrive_ns = t;
		}
		return 0;
	}
	/* A connection open before tracing began (a listening socket's
	 * data_ready is a new connection to accept: not this). */
	__u8 st = sk->__sk_common.skc_state;
	if (sk->sk_protocol == IPPROTO_TCP &&
	    (st == TCP_ESTABLISHED || st == TCP_CLOSE_WAIT))
		track(sk, port, 0, bpf_ktime_get_ns());
	return 0;
}

/*
 * The entry of sk for a read or write by a task, claiming it for the
 * task's root at its first read or write by a traced tgid (and adopting a
 * connection open before tracing that nothing has been seen on yet).
 * NULL: not a traced connection. The port test comes first and costs no
 * call, so the other end of a traced connection (a client on this node)
 * and untraced servers leave at once; a claimed connection needs no test
 * of the task (one storage lookup in all).
 */
static __always_inline struct sock_state *claim(struct sock *sk)
{
	__u16 port = sk->__sk_common.skc_num;
	if (!port_traced(port))
		return NULL;
	struct sock_state *ss = entry_of(sk);
	if (ss && ss->tgid)
		return ss;
	if (sk->sk_protocol != IPPROTO_TCP)
		return NULL;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_traced(tgid))
		return NULL;
	struct target_cfg *cfg = bpf_map_lookup_elem(&targets, &tgid);
	if (!cfg)
		return NULL;
	if (cfg->port_filter) {
		struct port_key pk = { .tgid = cfg->root, .port = port };
		if (!bpf_map_lookup_elem(&ports, &pk))
			return NULL;
	}
	if (!ss) {
		__u8 st = sk->__sk_common.skc_state;
		if (st != TCP_ESTABLISHED && st != TCP_CLOSE_WAIT)
			return NULL;
		ss = track(sk, port, 0, 0);
		if (!ss)
			return NULL;
	}
	ss->tgid = cfg->root;
	ss->emit = cfg->emit;
	return ss;
}

/* The connection's first inbound bytes are the HTTP/2 preface: read them
 * from the user buffer of the syscall that is returning (its registers as
 * saved at entry). io_uring and other in-kernel readers have none. */
static __always_inline bool saw_preface(void)
{
	struct pt_regs *regs = syscall_regs();
	if (!regs)
		return false;
	__u64 buf = first_buf(regs->si, read_kind(regs->orig_ax));
	return buf && is_h2_preface(buf);
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(qosd_recv, struct sock *sk, int ret, int flags)
{
	/* The cheapest tests first: a read that got nothing (EAGAIN) is
	 * common on event-driven servers. */
	if (ret <= 0 || (flags & MSG_PEEK))
		return 0;
	struct sock_state *ss = claim(sk);
	if (!ss)
		return 0;
	__u64 now = read_ns(sk, ss);
	if (ss->turns == 0 && (ss->emit & QOSD_EMIT_H2) &&
	    ret >= QOSD_H2_PREFACE_LEN && saw_preface())
		emit(ss, QOSD_REC_H2, now, now, now);
	if (ss->state == QOSD_ST_RESPONDING) {
		if (turn_in_flight(ss))
			emit_turn(ss);
		ss->state = QOSD_ST_IDLE;
	}
	/* This read's bytes arrived at the first data_ready since the
	 * last read (none: no later than the read). */
	__u64 read_arrive = ss->read_arrive_ns;
	ss->read_arrive_ns = 0;
	bool later = true;
	if (ss->state == QOSD_ST_IDLE) {
		if (ss->turns == 0)
			ss->first_read_ns = now;
		ss->turns += 1;
		ss->req_start_ns = now;
		/* No data_ready seen (adopted mid-way, or bytes that came
		 * with the previous reply still going out): the read is the
		 * best start known. */
		__u64 arrive = ss->arrive_ns;
		ss->req_arrive_ns = arrive && arrive <= now ? arrive : now;
		ss->state = QOSD_ST_IN_REQ;
		ss->nreq = 0;
		ss->nlater = 0;
		ss->later_arrive_sum = 0;
		ss->later_read_sum = 0;
		later = false;
	}
	/* Only TURN records carry counts; connection mode needs no more
	 * than the protocol and, for TLS, where the handshake ends. */
	__u32 done = 0;
	__u8 proto = ss->parse.proto;
	bool partial = ss->parse.phase != QOSD_PH_START;
	if ((ss->emit & QOSD_EMIT_TURN) || proto == QOSD_PROTO_UNSEEN ||
	    proto == QOSD_PROTO_TLS) {
		long n = count_skipped(&ss->parse, ret);
		done = n >= 0 ? n : count_in(&ss->parse, ret, read_buffer(ret));
	}
	if (ss->by_reply != QOSD_BY_REPLY_OFF &&
	    read_by_reply(sk, ss, done, partial, read_arrive, now))
		return 0;
	__u16 before = ss->nreq;
	ss->nreq = turn_requests(&ss->parse, before, done);
	/* Requests completed by a later read of a turn that already holds
	 * a whole request: their own arrival and read, as offsets from the
	 * turn's (emit_turn). A request whose bytes came over several reads
	 * (before == 0) is still the turn's first, timed from its first
	 * bytes. */
	if (later && before && ss->nreq > before &&
	    now >= ss->req_start_ns) {
		__u16 k = ss->nreq - before;
		__u64 a = read_arrive && read_arrive <= now &&
				  read_arrive >= ss->req_arrive_ns ?
			  read_arrive :
			  now;
		ss->nlater += k;
		ss->later_arrive_sum += (__u64)k * (a - ss->req_arrive_ns);
		ss->later_read_sum += (__u64)k * (now - ss->req_start_ns);
	}
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(qosd_send, struct sock *sk, int ret, int flags)
{
	if (ret <= 0)
		return 0;
	struct sock_state *ss = claim(sk);
	if (!ss)
		return 0;
	/* The next request's arrival is the first data_ready from now on. */
	ss->arrive_ns = 0;
	/* Outbound bytes before any request (a greeting) are not a reply. */
	if (ss->state != QOSD_ST_IDLE) {
		bool first = ss->state == QOSD_ST_IN_REQ;
		ss->state = QOSD_ST_RESPONDING;
		ss->last_out_ns = sent_ns(sk, ss);
		if (ss->by_reply == QOSD_BY_REPLY_ON)
			sent_by_reply(sk, ss, ret, first);
	}
	return 0;
}
