/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Requests counted in a connection's inbound bytes, so that several
 * requests read at once (pipelining: redis-benchmark -P, HTTP/1.1
 * pipelining, memcached batches) count as several, and a TLS handshake's
 * turns count as none. Used by both hook paths: sockets.bpf.c and the
 * syscall fallback, requests.bpf.c.
 *
 * Where the bytes are: the user buffer of the read syscall that is
 * returning: read/recvfrom (flat), readv/recvmsg (the first iovec). The
 * syscall path has the syscall's registers; sock_recv_length (no buffer
 * argument) fires in the reading task at the syscall's end, whose saved
 * user registers (bpf_task_pt_regs) still name it. Any other path
 * (io_uring, recvmmsg, splice, a read spilling past the first iovec) makes
 * the connection opaque: one request per turn from then on.
 *
 * What is read: the protocols' byte steps (count_proto.h) walk only the
 * bytes a count needs, resumable across reads (struct req_parse), and pass
 * over payloads by their length unread. The protocol is chosen once from
 * the first four bytes the server reads; anything else is opaque.
 *
 * Cost. On this kind of machine a BPF call and return (a helper, or a
 * bpf_loop iteration, which the verifier inlines as a BPF-to-BPF call)
 * costs ~40 ns (every return goes through the kernel's return thunk), far
 * more than a few dozen plain instructions, so the counter is built to
 * make few calls:
 *   - the common turn, one memcached command with no data block that is
 *     the whole read, is counted with no loop at all (mc_one_line);
 *   - a line's end is found eight bytes at a time in the 64-byte chunk of
 *     one bpf_probe_read_user, with no call (to_newline);
 *   - else one bpf_loop step per byte matched (a header name, a command
 *     name, a RESP length with its '*' or '$' and CRLF, a TLS record
 *     header) and one per payload skipped. A RESP length is still read a
 *     byte a step: ~16 steps for a redis GET (a word-at-a-time number
 *     would make it ~6).
 * A read that needs more than QOSD_MAX_STEPS steps makes the connection
 * opaque, counted in QOSD_CNT_GAVE_UP (a known protocol given up).
 */
#ifndef QOSD_COUNT_H
#define QOSD_COUNT_H

#include "requests.h"
#include "preface.h"
#include "emit.h"
#include "count_proto.h"

/* Steps (a byte, a line, or a payload skipped) per read at most; a read
 * that needs more makes the connection opaque. */
#define QOSD_MAX_STEPS 16384

/* Word tricks (one u64 = eight bytes, little-endian), written without
 * branches: a branch per byte or per word multiplies the paths the
 * verifier walks (an unrolled search with one took it past its limit). */
#define ONES 0x0101010101010101ULL
#define LOW7 0x7f7f7f7f7f7f7f7fULL

/* The top bit of each byte of w equal to c is set, exactly (no borrow
 * crosses bytes: the low seven bits are added apart from the top one). */
static __always_inline __u64 bytes_eq(__u64 w, __u8 c)
{
	__u64 x = w ^ (ONES * c);
	return ~(((x & LOW7) + LOW7) | x | LOW7);
}

/* The index of the lowest byte flagged by bytes_eq (t != 0): the multiply
 * moves byte k's flag into the top byte of a table that reads k there. */
static __always_inline __u32 first_flagged(__u64 t)
{
	__u64 low = t & -t;
	return ((low >> 7) * 0x0001020304050607ULL) >> 56;
}

/* Bit j set for each byte j flagged by bytes_eq: the multiply gathers the
 * eight flags into the top byte (no two partial products overlap). */
static __always_inline __u64 flag_bits(__u64 t)
{
	return ((t >> 7) * 0x0102040810204080ULL) >> 56;
}

/* The number of trailing zero bits of m != 0 (a popcount of the bits below
 * the lowest one set; BPF has neither instruction). */
static __always_inline __u32 low_bit(__u64 m)
{
	__u64 x = (m & -m) - 1;
	x = x - ((x >> 1) & 0x5555555555555555ULL);
	x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return (x * ONES) >> 56;
}

/* The offset in the chunk of the first LF at or after `at` and before
 * `end` (<= QOSD_CHUNK); QOSD_CHUNK: none. A 64-bit map of the chunk's
 * LFs, eight words, no branch and no call. */
static __always_inline __u32 chunk_lf(const __u8 *chunk, __u32 at, __u32 end)
{
	if (at >= end || end > QOSD_CHUNK)
		return QOSD_CHUNK;
	const __u64 *w = (const __u64 *)chunk;
	__u64 m = 0;
#pragma unroll
	for (int i = 0; i < QOSD_CHUNK / 8; i++)
		m |= flag_bits(bytes_eq(w[i], '\n')) << (i * 8);
	m &= ~0ULL << at;          /* at < end <= 64 */
	m &= ~0ULL >> (64 - end);  /* end >= 1 */
	return m ? low_bit(m) : QOSD_CHUNK;
}

/* Whether nothing but the end of the line matters: the rest of a request
 * line or an unmatched header (HTTP), of a command that has no data length
 * still to read (memcached), of an inline command (RESP). */
static __always_inline bool waits_for_newline(const struct req_parse *p)
{
	if (p->phase != QOSD_PH_LINE)
		return false;
	switch (p->proto) {
	case QOSD_PROTO_HTTP:
	case QOSD_PROTO_HTTP_REPLY:
		return p->match == 0 && p->line > 0;
	case QOSD_PROTO_MC:
		return p->match > 0 && (p->elems == 0 || p->match > p->elems);
	case QOSD_PROTO_RESP:
		return true;
	}
	return false;
}

/* chunk_lf() as a global function: the verifier checks it once, on its
 * own, where inlined into the loop's step it multiplied the step's paths
 * (338k instructions verified instead of 50k). One call per line. */
__noinline int chunk_lf_fn(const struct count_chunk *c, __u32 at, __u32 end)
{
	if (!c)
		return QOSD_CHUNK;
	return chunk_lf(c->b, at, end);
}

/* Moves to the next LF in the chunk; false: the chunk has none left (pos
 * at its end: the next step refills). */
static __always_inline bool to_newline(struct count_scan *s)
{
	__u32 k = chunk_lf_fn(&s->chunk, s->pos - s->cstart, s->clen);
	if (k >= QOSD_CHUNK) {
		s->pos = s->cstart + s->clen;
		return false;
	}
	s->pos = s->cstart + k;
	return true;
}

/*
 * The scan lives in a per-CPU map value, not on the stack: the verifier
 * tracks what a program keeps on its stack (constants, ranges) but not the
 * contents of a map value. On the stack, each loop step began with other
 * known values (the positions, the protocol's phase) and the verifier
 * checked the step again for each: 1 817 times, ~95 % of the 2 s that
 * loading qosd_recv took. Here every step begins alike (the step is
 * checked for unknown values, once). A program does not run again on the
 * CPU it is running on (tracepoint programs run with preemption off, and
 * the kernel skips a program's nested run), so one value per CPU is enough.
 * bpf_loop takes a stack pointer: it gets the pointer to the value.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct count_scan);
} count_scratch SEC(".maps");

struct count_loop_ctx {
	struct count_scan *s;
};

/* One step: a payload skipped, a line to its end, or one byte. 1 stops
 * the loop. */
static long count_step(__u64 i, void *ctx)
{
	struct count_scan *s = ((struct count_loop_ctx *)ctx)->s;
	if (s->pos >= s->len || s->p.proto == QOSD_PROTO_OPAQUE)
		return 1;
	if (s->p.skip) {
		__u32 n = s->len - s->pos;
		if (n > s->p.skip)
			n = s->p.skip;
		s->pos += n;
		s->p.skip -= n;
		if (!s->p.skip)
			payload_done(s);
		return 0;
	}
	if (s->pos - s->cstart >= s->clen || s->pos < s->cstart) {
		if (!refill(s)) {
			give_up(s);
			return 1;
		}
	}
	if (waits_for_newline(&s->p) && !to_newline(s))
		return 0; /* no LF in this chunk: the next step refills */
	__u8 b = s->chunk.b[(s->pos - s->cstart) & (QOSD_CHUNK - 1)];
	s->pos += 1;
	switch (s->p.proto) {
	case QOSD_PROTO_HTTP:
	case QOSD_PROTO_HTTP_REPLY:
		step_http(s, b);
		break;
	case QOSD_PROTO_RESP:
		step_resp(s, b);
		break;
	case QOSD_PROTO_MC:
		step_mc(s, b);
		break;
	case QOSD_PROTO_TLS:
		step_tls(s, b);
		break;
	}
	return 0;
}

/*
 * The common memcached turn: the whole read (in the chunk) is one command
 * line with no data block (get, gets, delete, incr, touch, mg, ...), whose
 * only LF ends the read. Then it is one request, found with a few word
 * operations and no loop; false: anything else (the byte steps decide).
 */
static __always_inline bool mc_one_line(const struct count_scan *s)
{
	if (s->p.proto != QOSD_PROTO_MC || s->p.phase != QOSD_PH_START ||
	    s->p.skip || s->clen != s->len || s->len < 2)
		return false;
	__u64 w0 = *(const __u64 *)s->chunk.b;
	__u64 sp = bytes_eq(w0, ' ');
	if (!sp)
		return false;
	__u32 len = first_flagged(sp); /* the command's length, < 8 */
	if (len == 0)
		return false;
	/* The command's last four bytes, first byte highest (as step_mc
	 * gathers them for mc_data_token). */
	__u64 cmd = w0 & ((1ULL << (len * 8)) - 1);
	__u32 last4 = __builtin_bswap64(cmd) >> (64 - len * 8);
	if (mc_data_token(len, last4))
		return false;
	return chunk_lf(s->chunk.b, 0, s->clen) == s->len - 1;
}

/* A known protocol is given up on a connection: counted, as its requests
 * now count by turns. A reply parse's giving up is its caller's to count
 * (sockets.bpf.c, QOSD_CNT_BY_TURNS). */
static __always_inline void gave_up_on(const struct req_parse *p)
{
	if (p->proto != QOSD_PROTO_HTTP_REPLY)
		count(QOSD_CNT_GAVE_UP);
}

/*
 * Counts the requests (or, on an HTTP reply parse, the replies) completed
 * in `ret` bytes at user address `buf` (0: unknown) on a connection whose
 * counter is at *p; advances *p. A stream that cannot be followed becomes
 * opaque (a connection's turns count one each).
 */
static __always_inline __u32 count_in(struct req_parse *p, long ret, __u64 buf)
{
	if (!buf) {
		gave_up_on(p);
		p->proto = QOSD_PROTO_OPAQUE;
		return 0;
	}
	__u32 zero = 0;
	struct count_scan *s = bpf_map_lookup_elem(&count_scratch, &zero);
	if (!s) {
		gave_up_on(p);
		p->proto = QOSD_PROTO_OPAQUE;
		return 0;
	}
	s->p = *p;
	s->buf = buf;
	s->len = ret;
	s->pos = 0;
	s->cstart = 0;
	s->clen = 0;
	s->count = 0;
	s->gave_up = 0;
	/* The first chunk here, so that the common turn needs no loop. */
	if (refill(s) && mc_one_line(s))
		return 1;
	if (s->p.proto != QOSD_PROTO_OPAQUE) {
		struct count_loop_ctx ctx = { .s = s };
		bpf_loop(QOSD_MAX_STEPS, count_step, &ctx, 0);
	}
	if (s->pos < s->len) {
		/* A known protocol given up, or past the steps (not a
		 * protocol never known). */
		if (s->gave_up || s->p.proto > QOSD_PROTO_OPAQUE)
			gave_up_on(p);
		s->p.proto = QOSD_PROTO_OPAQUE;
	}
	*p = s->p;
	return s->count;
}

/* The user buffer of the read syscall now returning `ret` bytes, from the
 * task's saved registers (the socket path; 0: none known). */
static __always_inline __u64 read_buffer(long ret)
{
	struct pt_regs *regs = syscall_regs();
	return regs ? user_buf(regs->si, read_kind(regs->orig_ax), ret) : 0;
}

/* The requests a read of `ret` bytes completed when a payload covers it
 * whole: nothing to read. -1: the bytes must be read (count_in). */
static __always_inline long count_skipped(struct req_parse *p, long ret)
{
	if (p->proto == QOSD_PROTO_OPAQUE)
		return 0;
	if (p->skip < (__u64)ret)
		return -1;
	struct count_scan s = { .p = *p, .len = ret };
	s.p.skip -= ret;
	if (!s.p.skip)
		payload_done(&s);
	*p = s.p;
	return s.count;
}

/* Whether a turn that carries `nreq` requests holds a TLS connection's
 * first request, which then marks it: the connection's time (its CONN
 * record) starts there, not at the handshake. */
static __always_inline bool tls_first_request(struct req_parse *p, __u16 nreq)
{
	if (!nreq || p->proto != QOSD_PROTO_TLS || (p->tls & QOSD_TLS_REQ))
		return false;
	p->tls |= QOSD_TLS_REQ;
	return true;
}

/* Whether a connection of `turns` turns carried a request (a TLS one: past
 * its handshake): one that did not is no request in connection mode. */
static __always_inline bool had_request(const struct req_parse *p,
					__u32 turns)
{
	return turns > 0 &&
	       (p->proto != QOSD_PROTO_TLS || (p->tls & QOSD_TLS_REQ));
}

/* The requests a turn stands for, after `count` more were completed. */
static __always_inline __u16 turn_requests(const struct req_parse *p,
					   __u16 nreq, __u32 count)
{
	switch (p->proto) {
	case QOSD_PROTO_HTTP:
	case QOSD_PROTO_RESP:
	case QOSD_PROTO_MC: {
		__u32 n = nreq + count;
		return n > 0xffff ? 0xffff : n;
	}
	case QOSD_PROTO_TLS:
		return nreq || count ? 1 : 0;
	default:
		/* Opaque (or gone opaque mid-turn): the turn rule, keeping
		 * what was counted before. */
		return nreq ? nreq : 1;
	}
}

#endif
