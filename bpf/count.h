/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Requests counted in a connection's inbound bytes (sockets.bpf.c), so that
 * several requests read at once (pipelining: redis-benchmark -P, HTTP/1.1
 * pipelining, memcached batches) count as several, and a TLS handshake's
 * turns count as none.
 *
 * Where the bytes are: sock_recv_length gives no buffer, but it fires in
 * the reading task at the end of the syscall, whose user registers
 * (bpf_task_pt_regs) still name the buffer the bytes were just copied to:
 * read/recvfrom (flat), readv/recvmsg (first iovec). Any other path
 * (io_uring, recvmmsg, splice, a read spilling past the first iovec) makes
 * the connection opaque: one request per turn from then on, as before.
 *
 * What is read: a resumable state machine (struct req_parse, kept in the
 * socket's storage) walks only the bytes a count needs and passes over
 * payloads by their length unread: HTTP/1.1 request and header lines
 * (Content-Length bodies skipped; Transfer-Encoding gives up: opaque),
 * RESP array and bulk-string headers (values skipped), memcached command
 * lines (storage commands' data blocks skipped), TLS record headers (the
 * encrypted bodies skipped). The protocol is chosen once from the first
 * four bytes the server reads; anything else is opaque.
 *
 * TLS: a turn whose records hold application data is one request (the
 * payload is encrypted: pipelined requests inside TLS count per turn);
 * handshake records are none. TLS 1.3 sends the client's Finished as an
 * application-data record: it is the first one when no handshake record
 * followed the client's ChangeCipherSpec (TLS 1.2 sends its Finished as a
 * handshake record after the CCS); and records of at most 22 bytes after
 * that (an encrypted alert such as close_notify, a KeyUpdate) are not
 * requests either.
 *
 * Cost: one bpf_loop step per byte of what is matched (a header name, a
 * memcached command and its data length, RESP headers, TLS record
 * headers), one per line for the rest of a line (scanned for its LF in the
 * 64-byte chunk copied per bpf_probe_read_user), one per payload skipped;
 * nothing per opaque connection beyond a test.
 */
#ifndef QOSD_COUNT_H
#define QOSD_COUNT_H

#include "requests.h"
#include "preface.h"

/* req_parse.phase */
#define QOSD_PH_START 0   /* between requests */
#define QOSD_PH_LINE 1    /* HTTP head / memcached line / RESP inline */
#define QOSD_PH_BODY 2    /* skipping a body: the request ends with it */
#define QOSD_PH_ARRLEN 3  /* RESP: "*N" */
#define QOSD_PH_BULKHDR 4 /* RESP: expecting '$' */
#define QOSD_PH_BULKLEN 5 /* RESP: "$N" */
#define QOSD_PH_BULK 6    /* RESP: skipping a bulk string and its CRLF */
#define QOSD_PH_TLSHDR 7  /* TLS: the 5-byte record header */
#define QOSD_PH_TLSBODY 8 /* TLS: skipping the record */

/* req_parse.tls */
#define QOSD_TLS_CCS 1         /* the client's ChangeCipherSpec seen */
#define QOSD_TLS_HS_AFTER_CCS 2 /* a handshake record after it: TLS 1.2 */
#define QOSD_TLS_APP 4         /* handshake over: app data is requests */
#define QOSD_TLS_13 8          /* TLS 1.3 */
#define QOSD_TLS_REQ 16        /* a request seen on the connection */

/* TLS record types (RFC 8446 5.1). */
#define TLS_CCS 20
#define TLS_HANDSHAKE 22
#define TLS_APP 23
/* Larger than any TLS 1.3 alert or KeyUpdate record (2 + 1 + 16; 5 + 1 +
 * 16 bytes with a 16-byte tag). */
#define TLS_CONTROL_MAX 22

/* Bytes copied from the user buffer per read helper call. */
#define QOSD_CHUNK 64
/* Steps (a byte, or a payload skipped) per read at most; a read that needs
 * more makes the connection opaque. */
#define QOSD_MAX_STEPS 16384

/* Header names matched in HTTP, as little-endian words (no string in
 * .rodata: the objects keep one global there, the load-time settings);
 * compared with b | 0x20, which lowers letters and keeps '-' and ':'. */
#define HTTP_CL0 0x2d746e65746e6f63ULL /* "content-" */
#define HTTP_CL1 0x003a6874676e656cULL /* "length:" */
#define HTTP_TE0 0x726566736e617274ULL /* "transfer" */
#define HTTP_TE1 0x6e69646f636e652dULL /* "-encodin" */
#define HTTP_TE2 0x0000000000003a67ULL /* "g:" */
#define HTTP_CL_LEN 15
#define HTTP_TE_LEN 18

/* Byte i of a name held in words w0, w1, w2. */
static __always_inline __u8 name_at(__u8 i, __u64 w0, __u64 w1, __u64 w2)
{
	__u64 w = i < 8 ? w0 : i < 16 ? w1 : w2;
	return w >> ((i & 7) * 8);
}
#define HTTP_M_CL 1
#define HTTP_M_TE 2

struct count_scan {
	struct req_parse p;
	__u64 buf;   /* user address of the bytes read */
	__u32 len;   /* bytes read */
	__u32 pos;   /* bytes consumed */
	__u32 cstart; /* position of chunk[0] */
	__u32 clen;  /* bytes in chunk */
	__u32 count; /* requests completed in these bytes */
	__u32 pad;
	__u8 chunk[QOSD_CHUNK];
};

/* The protocol from the first four inbound bytes (little-endian word). */
static __always_inline __u8 detect_proto(__u32 w)
{
#define W4(a, b, c, d) ((__u32)(a) | (__u32)(b) << 8 | (__u32)(c) << 16 | (__u32)(d) << 24)
	if ((w & 0xffff) == W4(0x16, 0x03, 0, 0))
		return QOSD_PROTO_TLS;
	if ((w & 0xff) == '*')
		return QOSD_PROTO_RESP;
	switch (w) {
	case W4('G', 'E', 'T', ' '):
	case W4('P', 'O', 'S', 'T'):
	case W4('P', 'U', 'T', ' '):
	case W4('H', 'E', 'A', 'D'):
	case W4('D', 'E', 'L', 'E'):
	case W4('O', 'P', 'T', 'I'):
	case W4('P', 'A', 'T', 'C'):
		return QOSD_PROTO_HTTP;
	case W4('g', 'e', 't', ' '):
	case W4('g', 'e', 't', 's'):
	case W4('s', 'e', 't', ' '):
	case W4('a', 'd', 'd', ' '):
	case W4('r', 'e', 'p', 'l'):
	case W4('a', 'p', 'p', 'e'):
	case W4('p', 'r', 'e', 'p'):
	case W4('c', 'a', 's', ' '):
	case W4('d', 'e', 'l', 'e'):
	case W4('i', 'n', 'c', 'r'):
	case W4('d', 'e', 'c', 'r'):
	case W4('t', 'o', 'u', 'c'):
	case W4('g', 'a', 't', ' '):
	case W4('g', 'a', 't', 's'):
		return QOSD_PROTO_MC;
	}
	switch (w & 0xffffff) {
	case W4('m', 'g', ' ', 0):
	case W4('m', 's', ' ', 0):
	case W4('m', 'd', ' ', 0):
	case W4('m', 'a', ' ', 0):
		return QOSD_PROTO_MC;
	}
	return QOSD_PROTO_OPAQUE;
}

/* memcached: the token that holds a storage command's data length (0: the
 * command has no data block), from its first token: its length and its
 * last four bytes, first byte highest (num). */
#define BE4(a, b, c, d) ((__u32)(a) << 24 | (__u32)(b) << 16 | (__u32)(c) << 8 | (__u32)(d))
static __always_inline __u16 mc_data_token(__u8 len, __u32 last4)
{
	if (len == 3 && (last4 == BE4(0, 's', 'e', 't') ||
			 last4 == BE4(0, 'a', 'd', 'd') ||
			 last4 == BE4(0, 'c', 'a', 's')))
		return 4;
	/* replace; append and prepend end alike */
	if ((len == 7 && last4 == BE4('l', 'a', 'c', 'e')) ||
	    ((len == 6 || len == 7) && last4 == BE4('p', 'e', 'n', 'd')))
		return 4;
	if (len == 2 && last4 == BE4(0, 0, 'm', 's'))
		return 2;
	return 0;
}

static __always_inline bool is_digit(__u8 b)
{
	return b >= '0' && b <= '9';
}

/* A request is complete. */
static __always_inline void count_done(struct count_scan *s)
{
	s->count += 1;
	s->p.phase = QOSD_PH_START;
}

static __always_inline void give_up(struct count_scan *s)
{
	s->p.proto = QOSD_PROTO_OPAQUE;
}

static __always_inline void step_http(struct count_scan *s, __u8 b)
{
	struct req_parse *p = &s->p;
	if (p->phase == QOSD_PH_START) {
		if (b == '\r' || b == '\n')
			return; /* empty lines before a request line */
		p->phase = QOSD_PH_LINE;
		p->line = 1;
		p->match = 0; /* the request line is no header */
		p->num = 0;
		return;
	}
	if (b == '\r')
		return;
	if (b == '\n') {
		if (p->line == 0) { /* the empty line: end of the head */
			if (p->num) {
				p->skip = p->num;
				p->phase = QOSD_PH_BODY;
			} else {
				count_done(s);
			}
			return;
		}
		p->line = 0;
		p->match = HTTP_M_CL | HTTP_M_TE;
		return;
	}
	__u8 i = p->line;
	if (p->line < 255)
		p->line += 1;
	if (!p->match)
		return;
	__u8 lb = b | 0x20;
	if (p->match & HTTP_M_CL) {
		if (i < HTTP_CL_LEN) {
			if (lb != name_at(i, HTTP_CL0, HTTP_CL1, 0))
				p->match &= ~HTTP_M_CL;
		} else if (is_digit(b)) {
			p->num = p->num * 10 + (b - '0');
		}
	}
	if (p->match & HTTP_M_TE) {
		if (i < HTTP_TE_LEN) {
			if (lb != name_at(i, HTTP_TE0, HTTP_TE1, HTTP_TE2))
				p->match &= ~HTTP_M_TE;
		} else {
			give_up(s); /* chunked bodies are not followed */
		}
	}
}

static __always_inline void step_resp(struct count_scan *s, __u8 b)
{
	struct req_parse *p = &s->p;
	switch (p->phase) {
	case QOSD_PH_START:
		if (b == '\r' || b == '\n')
			return;
		p->num = 0;
		p->phase = b == '*' ? QOSD_PH_ARRLEN : QOSD_PH_LINE;
		return;
	case QOSD_PH_LINE: /* an inline command */
		if (b == '\n')
			count_done(s);
		return;
	case QOSD_PH_ARRLEN:
	case QOSD_PH_BULKLEN:
		if (is_digit(b)) {
			p->num = p->num * 10 + (b - '0');
		} else if (b == '\n') {
			if (p->phase == QOSD_PH_ARRLEN) {
				p->elems = p->num;
				if (p->elems == 0)
					count_done(s);
				else
					p->phase = QOSD_PH_BULKHDR;
			} else {
				p->skip = p->num + 2; /* the string and CRLF */
				p->elems -= 1;
				p->phase = QOSD_PH_BULK;
			}
		} else if (b != '\r' && b != '-') {
			give_up(s);
		}
		return;
	case QOSD_PH_BULKHDR:
		if (b == '$') {
			p->num = 0;
			p->phase = QOSD_PH_BULKLEN;
		} else {
			give_up(s);
		}
		return;
	}
}

static __always_inline void step_mc(struct count_scan *s, __u8 b)
{
	struct req_parse *p = &s->p;
	if (p->phase == QOSD_PH_START) {
		if (b == '\r' || b == '\n')
			return;
		p->phase = QOSD_PH_LINE;
		p->match = 0; /* token index */
		p->line = 0;  /* bytes into the token */
		p->num = 0;
		p->elems = 0;
	}
	if (b == '\r')
		return;
	if (b == '\n') {
		if (p->elems && p->match >= p->elems) {
			p->skip = p->num + 2; /* the data block and CRLF */
			p->phase = QOSD_PH_BODY;
		} else {
			count_done(s);
		}
		return;
	}
	if (b == ' ') {
		if (p->line == 0)
			return; /* runs of spaces */
		if (p->match == 0) {
			p->elems = mc_data_token(p->line, p->num);
			p->num = 0;
		}
		if (p->match < 255)
			p->match += 1;
		p->line = 0;
		return;
	}
	if (p->line < 255)
		p->line += 1;
	if (p->match == 0)
		p->num = p->num << 8 | b; /* the command's last four bytes */
	else if (p->elems && p->match == p->elems && is_digit(b))
		p->num = p->num * 10 + (b - '0');
}

/* One byte of a TLS record header (type, version, length). */
static __always_inline void step_tls(struct count_scan *s, __u8 b)
{
	struct req_parse *p = &s->p;
	if (p->phase != QOSD_PH_TLSHDR) {
		p->phase = QOSD_PH_TLSHDR;
		p->line = 0;
		p->num = 0;
	}
	if (p->line == 0)
		p->match = b;
	else if (p->line >= 3)
		p->num = p->num << 8 | b;
	p->line += 1;
	if (p->line < 5)
		return;
	__u8 type = p->match;
	if (type == TLS_CCS) {
		p->tls |= QOSD_TLS_CCS;
	} else if (type == TLS_HANDSHAKE) {
		if (p->tls & QOSD_TLS_CCS)
			p->tls |= QOSD_TLS_HS_AFTER_CCS;
	} else if (type == TLS_APP) {
		if (!(p->tls & QOSD_TLS_APP)) {
			p->tls |= QOSD_TLS_APP;
			if (!(p->tls & QOSD_TLS_HS_AFTER_CCS))
				p->tls |= QOSD_TLS_13; /* this one is Finished */
			else
				s->count += 1;
		} else if (!(p->tls & QOSD_TLS_13) || p->num > TLS_CONTROL_MAX) {
			s->count += 1;
		}
	}
	p->skip = p->num;
	p->phase = QOSD_PH_TLSBODY;
}

/* A payload skipped to its end. */
static __always_inline void payload_done(struct count_scan *s)
{
	struct req_parse *p = &s->p;
	switch (p->phase) {
	case QOSD_PH_BODY:
		count_done(s);
		break;
	case QOSD_PH_BULK:
		if (p->elems == 0)
			count_done(s);
		else
			p->phase = QOSD_PH_BULKHDR;
		break;
	case QOSD_PH_TLSBODY:
		p->phase = QOSD_PH_START;
		break;
	}
}

/* Copies the next bytes into the chunk; false: they cannot be read. */
static __always_inline bool refill(struct count_scan *s)
{
	__u32 n = s->len - s->pos;
	if (n > QOSD_CHUNK)
		n = QOSD_CHUNK;
	if (bpf_probe_read_user(s->chunk, n, (void *)(s->buf + s->pos)))
		return false;
	s->cstart = s->pos;
	s->clen = n;
	if (s->p.proto == QOSD_PROTO_UNSEEN) {
		if (n < 4) {
			give_up(s);
			return false;
		}
		__u32 w = s->chunk[0] | (__u32)s->chunk[1] << 8 |
			  (__u32)s->chunk[2] << 16 | (__u32)s->chunk[3] << 24;
		s->p.proto = detect_proto(w);
	}
	return s->p.proto != QOSD_PROTO_OPAQUE;
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
		return p->match == 0 && p->line > 0;
	case QOSD_PROTO_MC:
		return p->match > 0 && (p->elems == 0 || p->match > p->elems);
	case QOSD_PROTO_RESP:
		return true;
	}
	return false;
}

/* One byte of the search for LF: 1 stops at an LF or the chunk's end. */
static long newline_step(__u64 i, void *ctx)
{
	struct count_scan *s = ctx;
	__u32 at = s->pos - s->cstart;
	if (at >= s->clen)
		return 1;
	if (s->chunk[at & (QOSD_CHUNK - 1)] == '\n')
		return 1;
	s->pos += 1;
	return 0;
}

/* Moves to the next LF in the chunk; false: the chunk has none left. One
 * step of the outer loop for a whole line instead of one per byte (an
 * inner bpf_loop: a bounded loop here took the verifier seconds). */
static __always_inline bool to_newline(struct count_scan *s)
{
	bpf_loop(QOSD_CHUNK, newline_step, s, 0);
	return s->pos - s->cstart < s->clen;
}

/* One step: a payload skipped, or one byte. 1 stops the loop. */
static long count_step(__u64 i, void *ctx)
{
	struct count_scan *s = ctx;
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
	__u8 b = s->chunk[(s->pos - s->cstart) & (QOSD_CHUNK - 1)];
	s->pos += 1;
	switch (s->p.proto) {
	case QOSD_PROTO_HTTP:
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

/* The user buffer of the syscall that is returning from a read of `ret`
 * bytes (0: none known, or the bytes went past its first iovec). */
static __always_inline __u64 read_buffer(long ret)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!regs)
		return 0;
	__u64 arg = regs->si;
	switch (regs->orig_ax) {
	case NR_read:
	case NR_recvfrom:
		return arg;
	case NR_recvmsg: {
		struct user_msghdr m = {};
		if (bpf_probe_read_user(&m, sizeof(m), (void *)arg))
			return 0;
		arg = (__u64)m.msg_iov;
		break;
	}
	case NR_readv:
		break;
	default:
		return 0;
	}
	struct iovec iov = {};
	if (bpf_probe_read_user(&iov, sizeof(iov), (void *)arg) ||
	    iov.iov_len < (__u64)ret)
		return 0;
	return (__u64)iov.iov_base;
}

/*
 * Counts the requests completed in `ret` bytes just read on a connection
 * whose counter is at *p; advances *p. A connection that cannot be
 * followed becomes opaque (its turns count one each).
 */
static __always_inline __u32 count_requests(struct req_parse *p, long ret)
{
	if (p->proto == QOSD_PROTO_OPAQUE)
		return 0;
	/* A payload that covers the whole read: nothing to look at. */
	if (p->skip >= (__u64)ret) {
		struct count_scan s = { .p = *p, .len = ret };
		s.p.skip -= ret;
		if (!s.p.skip)
			payload_done(&s);
		*p = s.p;
		return s.count;
	}
	__u64 buf = read_buffer(ret);
	if (!buf) {
		p->proto = QOSD_PROTO_OPAQUE;
		return 0;
	}
	struct count_scan s = { .p = *p, .buf = buf, .len = ret };
	bpf_loop(QOSD_MAX_STEPS, count_step, &s, 0);
	if (s.pos < s.len)
		s.p.proto = QOSD_PROTO_OPAQUE;
	*p = s.p;
	return s.count;
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
