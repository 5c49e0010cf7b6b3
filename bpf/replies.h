/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Per-request ends on HTTP/1.x connections (sockets.bpf.c; included there
 * after its maps). The turn rule ends a turn's requests at its last reply
 * bytes, and a turn ends at the first read after a write; a server that
 * reads ahead (a reader thread handing requests to workers) reads requests
 * while earlier replies are still being computed, so near saturation its
 * requests were timed to an earlier request's reply and the eBPF p99 read
 * far below what clients saw (docs/requests.md, "Replies").
 *
 * HTTP/1.x answers in order, one reply per request, and a reply's length
 * is in its head (Content-Length; 1xx interim replies answer nothing; 204,
 * 304 and HEAD's replies have no body). So on a connection whose requests
 * are HTTP, each request read is put in a FIFO (its arrival and its read)
 * and each reply parsed in the outbound bytes (count.h, a second struct
 * req_parse) answers the oldest: one TURN record per reply, timed from its
 * own request's arrival to the reply's last bytes. Such a connection's
 * records carry turns = the reply's index (1 opens the connection).
 *
 * Falls back to the turn rule for the rest of the connection, counted in
 * QOSD_CNT_BY_TURNS, when a reply cannot be followed (chunked
 * Transfer-Encoding, a body with no length, bytes not in user memory where
 * a head is, a write that does not begin where a reply must), when a HEAD
 * request is read (its reply's Content-Length has no body: one flag of
 * the request parse tells), when more than QOSD_FIFO requests wait for
 * replies, or when a reply answers no request read. Requests read and not
 * answered then become the turn in flight: counts stay exact. Connections
 * found open when tracing began keep the turn rule (their first bytes may
 * be mid-stream).
 *
 * Replies are parsed only where they must be. A write phase (the writes
 * between two reads) that begins with one request waiting, at a reply
 * boundary, answers that request and no other: the server has read no
 * other to answer. It is not parsed (reply_fifo.single): the request
 * becomes the turn in flight and ends at the phase's last bytes, by the
 * turn rule. So a server that answers each request before it reads the
 * next (nginx, and the fixture below saturation) pays no reply parse; one
 * that has read ahead (two or more waiting when it writes) or a pipelining
 * client's burst is parsed, reply by reply.
 *
 * Cost: nothing on other protocols past one byte test (sock_state's
 * by_reply); on HTTP, one more socket-storage lookup per read and per
 * write, and where replies are parsed, the reply's head walked by the
 * request counter's steps (its body is skipped by length, sendfile bodies
 * included, unread).
 */
#ifndef QOSD_REPLIES_H
#define QOSD_REPLIES_H

#include "requests.h"
#include "count.h"
#include "emit.h"

/* Whether a responding connection's turn is the turn rule's to record:
 * on one timed by its replies, only a lone request's reply taken unparsed
 * (reply_fifo.single) is. */
static __always_inline bool turn_in_flight(const struct sock_state *ss)
{
	return ss->by_reply != QOSD_BY_REPLY_ON || ss->nreq;
}

/* The FIFO of an HTTP connection timed by its replies. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct reply_fifo);
} fifos SEC(".maps");

/* Ends this connection's use of replies: its requests are timed by turns
 * from now on, counted once. The requests read and not yet answered become
 * the turn in flight, from the oldest one's arrival and read. */
static __always_inline void fall_back(struct sock_state *ss,
				      struct reply_fifo *f)
{
	ss->by_reply = QOSD_BY_REPLY_OFF;
	count(QOSD_CNT_BY_TURNS);
	ss->nlater = 0;
	ss->later_arrive_sum = 0;
	ss->later_read_sum = 0;
	ss->nreq = 0;
	if (!f)
		return;
	__u32 n = f->tail - f->head;
	if (n) {
		__u32 i = f->head & (QOSD_FIFO - 1);
		ss->nreq = n > QOSD_FIFO ? QOSD_FIFO : n;
		ss->req_arrive_ns = f->arrive[i];
		ss->req_start_ns = f->arrive[i] + f->start_off[i];
	}
	/* A reply's record opened the connection already (turns == 1). */
	if (f->replies && ss->turns <= 1)
		ss->turns = 2;
}

/* The arrival of the j-th request that begins in a read: the read's
 * arrival for the first, the middle of its wait for the others (they came
 * at some time between: the turn rule's W/2, turn_latencies in
 * sensors/src/ebpf/target.rs). */
static __always_inline __u64 begun_at(__u32 j, __u64 arrive, __u64 now)
{
	return j == 0 ? arrive : arrive + (now - arrive) / 2;
}

/*
 * `done` requests a read at `now` completed, into the FIFO; `partial`: the
 * first of them began in an earlier read (f->part_*). False: the FIFO
 * cannot hold them (nothing pushed).
 */
static __always_inline bool push_requests(struct reply_fifo *f, __u32 done,
					  bool partial, __u64 arrive,
					  __u64 now)
{
	if (f->tail - f->head + done > QOSD_FIFO)
		return false;
	for (__u32 i = 0; i < QOSD_FIFO; i++) {
		if (i >= done)
			break;
		__u64 a = f->part_arrive;
		__u64 st = f->part_start;
		if (!partial || i > 0) {
			a = begun_at(i - partial, arrive, now);
			st = now;
		}
		__u32 k = (f->tail + i) & (QOSD_FIFO - 1);
		__u64 off = st > a ? st - a : 0;
		f->arrive[k] = a;
		f->start_off[k] = off > 0xffffffffULL ? 0xffffffff : off;
	}
	f->tail += done;
	return true;
}

/*
 * A read of a connection not timed by turns (yet): `done` requests
 * completed, the parse was mid-request before it (`partial`), its bytes
 * arrived at `read_arrive` (0: unknown). Decides at the connection's first
 * read whether replies are used. True: handled here; false: the turn rule
 * counts this read (the connection is, or just fell back to, by turns).
 */
static __always_inline bool read_by_reply(struct sock *sk,
					  struct sock_state *ss, __u32 done,
					  bool partial, __u64 read_arrive,
					  __u64 now)
{
	struct reply_fifo *f;
	if (ss->by_reply == QOSD_BY_REPLY_UNSET) {
		ss->by_reply = QOSD_BY_REPLY_OFF;
		if (ss->parse.proto != QOSD_PROTO_HTTP ||
		    !(ss->emit & QOSD_EMIT_TURN) || !ss->accept_ns)
			return false;
		f = bpf_sk_storage_get(&fifos, sk, 0,
				       BPF_SK_STORAGE_GET_F_CREATE);
		if (!f) {
			count(QOSD_CNT_BY_TURNS);
			return false;
		}
		f->reply.proto = QOSD_PROTO_HTTP_REPLY;
		ss->by_reply = QOSD_BY_REPLY_ON;
	} else {
		f = bpf_sk_storage_get(&fifos, sk, 0, 0);
	}
	/* A write phase taken by the turn rule ended (qosd_recv emitted it). */
	if (f)
		f->single = 0;
	__u64 arrive = read_arrive && read_arrive <= now ? read_arrive : now;
	if (!f || ss->parse.proto != QOSD_PROTO_HTTP ||
	    (ss->parse.http & QOSD_HTTP_HEAD) ||
	    !push_requests(f, done, partial, arrive, now)) {
		fall_back(ss, f);
		return false;
	}
	/* A request left incomplete that began in this read: its arrival
	 * and read, for the read that completes it. */
	if (ss->parse.phase != QOSD_PH_START && (done || !partial)) {
		f->part_arrive = begun_at(done - partial, arrive, now);
		f->part_start = now;
	}
	return true;
}

/* One reply's bytes all sent at `end`: the oldest request waiting is
 * answered, one record. */
static __always_inline void answer(struct sock_state *ss, struct reply_fifo *f,
				   __u64 end)
{
	__u32 i = f->head & (QOSD_FIFO - 1);
	__u64 a = f->arrive[i];
	__u64 st = a + f->start_off[i];
	f->head += 1;
	f->replies += 1;
	st = st < end ? st : end;
	a = a < st ? a : st;
	emit_record_n(QOSD_REC_TURN, ss->tgid, 0, ss->conn_id, f->replies, 1,
		      a, st, end, wakeup_bytes);
}

struct answer_ctx {
	struct sock_state *ss;
	struct reply_fifo *f;
	__u64 end;
};

static long answer_step(__u64 i, void *ctx)
{
	struct answer_ctx *c = ctx;
	answer(c->ss, c->f, c->end);
	return 0;
}

/* Replies completed in a write of `ret` bytes: its first piece read from
 * the syscall's buffer, the rest (a writev's body iovec, a sendfile) only
 * skipped as a body by its length. The parse goes opaque if it cannot
 * follow. */
static __always_inline __u32 count_replies(struct req_parse *p, long ret)
{
	long n = count_skipped(p, ret);
	if (n >= 0)
		return n;
	struct pt_regs *regs = syscall_regs();
	__u64 have = 0;
	__u64 buf = regs ? user_piece(regs->si, write_kind(regs->orig_ax),
				      ret, &have) :
			   0;
	if (!have)
		buf = 0;
	__u32 c = count_in(p, have, buf);
	if (have < (__u64)ret && p->proto != QOSD_PROTO_OPAQUE) {
		n = count_skipped(p, ret - have);
		if (n < 0)
			p->proto = QOSD_PROTO_OPAQUE;
		else
			c += n;
	}
	return c;
}

/* A write of `ret` bytes on a connection timed by its replies, whose last
 * byte left at ss->last_out_ns; `first`: the first write since a read. */
static __always_inline void sent_by_reply(struct sock *sk,
					  struct sock_state *ss, long ret,
					  bool first)
{
	struct reply_fifo *f = bpf_sk_storage_get(&fifos, sk, 0, 0);
	if (!f) {
		fall_back(ss, f);
		return;
	}
	/* One request waiting, the outbound stream at a reply's start: this
	 * phase is its reply. It leaves the FIFO for the turn in flight,
	 * which the turn rule ends (the next read, the close, or the flush of
	 * open connections when tracing stops); nothing is parsed. */
	if (first && f->tail - f->head == 1 &&
	    f->reply.phase == QOSD_PH_START && !f->reply.skip &&
	    !f->reply.line) {
		__u32 i = f->head & (QOSD_FIFO - 1);
		ss->req_arrive_ns = f->arrive[i];
		ss->req_start_ns = f->arrive[i] + f->start_off[i];
		ss->nreq = 1;
		ss->nlater = 0;
		ss->later_arrive_sum = 0;
		ss->later_read_sum = 0;
		f->head += 1;
		/* The FIFO's later records must not reuse index 1 (opens). */
		f->replies += 1;
		f->single = 1;
	}
	if (f->single)
		return;
	__u32 n = count_replies(&f->reply, ret);
	__u32 waiting = f->tail - f->head;
	__u32 k = n < waiting ? n : waiting;
	if (k == 1) {
		answer(ss, f, ss->last_out_ns);
	} else if (k > 1) {
		struct answer_ctx c = { .ss = ss, .f = f, .end = ss->last_out_ns };
		bpf_loop(k, answer_step, &c, 0);
	}
	if (n > waiting || f->reply.proto != QOSD_PROTO_HTTP_REPLY)
		fall_back(ss, f);
}

#endif
