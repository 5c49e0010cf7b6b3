/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The protocols the request counter (count.h) knows, one byte at a time:
 * which protocol a connection speaks (its first four inbound bytes), and
 * per protocol a step that advances the resumable parse state (struct
 * req_parse) by one byte and counts the requests that byte completes:
 *   HTTP/1.x   request and header lines up to the empty line; a
 *              Content-Length body skipped unread; Transfer-Encoding gives
 *              up (the connection goes opaque);
 *   RESP       arrays of bulk strings (headers read, values skipped) and
 *              inline commands;
 *   memcached  text command lines; a storage command's data block skipped;
 *   TLS        record headers: a turn with application data is one request,
 *              handshake records none (the TLS 1.3 Finished and small
 *              control records excepted, see step_tls);
 *   HTTP/1.x replies (the outbound stream, QOSD_PROTO_HTTP_REPLY): the same
 *              steps as requests, and the status code, read from the
 *              chunk with no step (reply_status): 1xx answers no request,
 *              204 and 304 have no body; anything but "HTTP/1.x NNN" where
 *              a reply begins gives up.
 * Payloads are skipped by length (req_parse.skip) and payload_done() says
 * what their end means. count.h drives these steps and skips whole lines
 * where only their end matters.
 */
#ifndef QOSD_COUNT_PROTO_H
#define QOSD_COUNT_PROTO_H

#include "requests.h"

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

/* req_parse.http */
#define QOSD_HTTP_HEAD 1    /* requests: a HEAD was read (its reply has a
			     * Content-Length and no body) */
#define QOSD_HTTP_INTERIM 2 /* replies: a 1xx reply (answers no request) */
#define QOSD_HTTP_NOBODY 4  /* replies: 204 or 304 (no body) */

/* TLS record types (RFC 8446 5.1). */
#define TLS_CCS 20
#define TLS_HANDSHAKE 22
#define TLS_APP 23
/* Larger than any TLS 1.3 alert or KeyUpdate record (2 + 1 + 16; 5 + 1 +
 * 16 bytes with a 16-byte tag). */
#define TLS_CONTROL_MAX 22

/* Bytes copied from the user buffer per read helper call. */
#define QOSD_CHUNK 64

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

/* The bytes copied from the user buffer (a struct: a global function's
 * pointer argument needs its size in its type). */
struct count_chunk {
	__u8 b[QOSD_CHUNK];
};

struct count_scan {
	struct req_parse p;
	__u64 buf;   /* user address of the bytes read */
	__u32 len;   /* bytes read */
	__u32 pos;   /* bytes consumed */
	__u32 cstart; /* position of chunk[0] */
	__u32 clen;  /* bytes in chunk */
	__u32 count; /* requests completed in these bytes */
	__u32 gave_up; /* 1: a known protocol was given up (opaque) */
	struct count_chunk chunk;
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
	if (s->p.proto > QOSD_PROTO_OPAQUE)
		s->gave_up = 1;
	s->p.proto = QOSD_PROTO_OPAQUE;
}

/* The protocol from the chunk's first bytes, if not known yet; false: the
 * connection is opaque. */
static __always_inline bool know_proto(struct count_scan *s)
{
	if (s->p.proto == QOSD_PROTO_UNSEEN) {
		if (s->clen < 4) {
			give_up(s);
			return false;
		}
		__u32 w = s->chunk.b[0] | (__u32)s->chunk.b[1] << 8 |
			  (__u32)s->chunk.b[2] << 16 | (__u32)s->chunk.b[3] << 24;
		s->p.proto = detect_proto(w);
	}
	return s->p.proto != QOSD_PROTO_OPAQUE;
}

/* Copies the next bytes into the chunk; false: they cannot be read. */
static __always_inline bool refill(struct count_scan *s)
{
	__u64 n = s->len - s->pos;
	/* The bound in the very register passed: clang may test a copy,
	 * and the verifier then sees an unbounded size. */
	asm volatile("if %[n] <= %[max] goto +1; %[n] = %[max]"
		     : [n] "+r"(n)
		     : [max] "i"(QOSD_CHUNK));
	if (bpf_probe_read_user(s->chunk.b, n, (void *)(s->buf + s->pos)))
		return false;
	s->cstart = s->pos;
	s->clen = n;
	return know_proto(s);
}

/*
 * A reply begins with the byte just stepped over ('H', at pos - 1): its
 * status line's first 12 bytes, "HTTP/1.x NNN", read from the chunk (one
 * copy more if they straddle its end; none if they are past the write:
 * the reply is given up). Sets the reply's QOSD_HTTP_* flags; false: not
 * a reply's start (the parse gave up).
 */
static __always_inline bool reply_status(struct count_scan *s, __u8 b)
{
	__u32 at = s->pos - 1 - s->cstart;
	if (b != 'H' || s->len - (s->pos - 1) < 12) {
		give_up(s);
		return false;
	}
	if (at + 12 > s->clen) {
		s->pos -= 1;
		if (!refill(s)) {
			give_up(s);
			return false;
		}
		s->pos += 1;
		at = 0;
	}
	__u8 sp = s->chunk.b[(at + 8) & (QOSD_CHUNK - 1)];
	__u8 c0 = s->chunk.b[(at + 9) & (QOSD_CHUNK - 1)];
	__u8 c1 = s->chunk.b[(at + 10) & (QOSD_CHUNK - 1)];
	__u8 c2 = s->chunk.b[(at + 11) & (QOSD_CHUNK - 1)];
	__u8 slash = s->chunk.b[(at + 4) & (QOSD_CHUNK - 1)];
	if (sp != ' ' || slash != '/' || c0 < '1' || c0 > '5') {
		give_up(s);
		return false;
	}
	if (c0 == '1')
		s->p.http |= QOSD_HTTP_INTERIM;
	else if ((c0 == '2' || c0 == '3') && c1 == '0' && c2 == '4')
		s->p.http |= QOSD_HTTP_NOBODY;
	return true;
}

/*
 * A header line's first byte was just stepped over (at pos - 1): its name
 * tested eight bytes at a time in the chunk, with no step per byte, when
 * 16 bytes of it are there. A name that is neither Content-Length nor
 * Transfer-Encoding leaves the rest of the line to the newline search
 * (a name is exact: "content-" and not "length:" is another header);
 * Content-Length's name is passed over whole, to its value. False: not
 * decided here (the byte steps go on: Transfer-Encoding, or a line too
 * near the chunk's end).
 */
static __always_inline bool header_by_words(struct count_scan *s)
{
	__u32 at = s->pos - 1 - s->cstart;
	if (at > QOSD_CHUNK - 16 || at + 16 > s->clen)
		return false;
	__u64 w0 = *(const __u64 *)&s->chunk.b[at];
	__u64 w1 = *(const __u64 *)&s->chunk.b[at + 8];
	/* b | 0x20 a byte at a time: lowers letters, keeps '-' and ':'. */
	__u64 lw0 = w0 | 0x2020202020202020ULL;
	__u64 lw1 = (w1 | 0x2020202020202020ULL) & 0x00ffffffffffffffULL;
	if (lw0 == HTTP_CL0 && lw1 == HTTP_CL1) {
		s->pos += HTTP_CL_LEN - 1;
		s->p.line = HTTP_CL_LEN;
		s->p.match = HTTP_M_CL;
		return true;
	}
	if (lw0 == HTTP_TE0)
		return false;
	s->p.line = 1;
	s->p.match = 0;
	return true;
}

static __always_inline void step_http(struct count_scan *s, __u8 b)
{
	struct req_parse *p = &s->p;
	if (p->phase == QOSD_PH_START) {
		if (b == '\r' || b == '\n')
			return; /* empty lines before a request line */
		if (p->proto == QOSD_PROTO_HTTP_REPLY) {
			if (!reply_status(s, b))
				return;
		} else if (b == 'H') {
			p->http |= QOSD_HTTP_HEAD; /* the one method in H */
		}
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
			__u8 f = p->http;
			p->http &= QOSD_HTTP_HEAD; /* a reply's flags are its own */
			if (f & QOSD_HTTP_INTERIM) {
				p->phase = QOSD_PH_START;
				return;
			}
			if (p->num && !(f & QOSD_HTTP_NOBODY)) {
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
	if (p->line == 0 && p->match && header_by_words(s))
		return;
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

#endif
