/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The contract between requests.bpf.c and the Rust request sensor
 * (sensors/src/ebpf/). Every struct here is mirrored in Rust through the
 * generated skeleton and checked there by size/offset assertions; the
 * _Static_asserts below pin the layout on the C side.
 */
#ifndef QOSD_REQUESTS_H
#define QOSD_REQUESTS_H

/* Record kinds: which boundary rule closed the request. */
#define QOSD_REC_TURN 1 /* first inbound bytes .. last outbound bytes */
#define QOSD_REC_CONN 2 /* accept .. close of the accepted fd */
#define QOSD_REC_GRPC 3 /* gRPC call: stream start .. status written (grpc.bpf.c) */
#define QOSD_REC_H2 4   /* an accepted connection opened with the HTTP/2 preface */

/* target_cfg.emit bits: which record kinds to send for a target. */
#define QOSD_EMIT_TURN 1
#define QOSD_EMIT_CONN 2
#define QOSD_EMIT_H2 4 /* look for the HTTP/2 preface in the first inbound bytes */

/* Indexes of the per-CPU counters array. */
#define QOSD_CNT_LOST 0       /* records dropped: ring buffer full */
#define QOSD_CNT_CONN_EVICT 1 /* conn table full: an LRU entry was evicted */
#define QOSD_CNT_GAVE_UP 2    /* connections whose requests count by turns
			       * after all: their bytes could not be read,
			       * or a read needed more than the counter's
			       * bound of steps (count.h) */
#define QOSD_CNT_BY_TURNS 3 /* HTTP connections whose requests are timed
			     * by turns after all: a reply could not be
			     * parsed, or more requests waited for their
			     * replies than the FIFO holds (sockets.bpf.c) */
#define QOSD_CNT_MAX 4

/* conn_state.state */
#define QOSD_ST_IDLE 0       /* no request in flight */
#define QOSD_ST_IN_REQ 1     /* inbound bytes seen, no reply yet */
#define QOSD_ST_RESPONDING 2 /* reply bytes seen; ends at next inbound/close */

/* Words of the traced-tgid bitmap: 2^22 bits, one per possible pid
 * (PID_MAX_LIMIT on 64-bit). */
#define QOSD_TGID_WORDS 65536

/* The start of the HTTP/2 client connection preface, "PRI * HTTP/2.0\r\n". */
#define QOSD_H2_PREFACE_LEN 16

/* One finished request, sent through the ring buffer. GRPC records carry
 * the stream object's address in conn_id and fd 0; H2 records have
 * start_ns == end_ns (the preface read). Two figures per request:
 * end - arrive ("latency": the request's bytes reached the server's socket,
 * what the node adds to what a client sees) and end - start ("service":
 * from the server's first read). Where the arrival is not known (the
 * syscall path, gRPC uprobes) arrive_ns == start_ns. */
struct req_record {
	__u64 start_ns; /* bpf_ktime_get_ns() (CLOCK_MONOTONIC) */
	__u64 end_ns;
	__u64 conn_id; /* unique per accepted connection */
	__u32 tgid;    /* the traced root process (sockets.bpf.c) or the caller */
	__u32 fd;      /* 0 on the socket path (no fd there) */
	__u32 turns;   /* TURN: 1-based turn index; CONN: turns seen on it */
	__u8 kind;     /* QOSD_REC_* */
	__u8 pad;
	__u16 nreq;    /* requests the record stands for: 1, or for a TURN
			* on the socket path the requests counted in its
			* inbound bytes (count.h; 0: a TLS handshake turn, or
			* a request still incomplete) */
	__u64 arrive_ns; /* <= start_ns */
};

/* Key of every per-connection entry: the process and the accepted fd. */
struct conn_key {
	__u32 tgid;
	__u32 fd;
};

/* req_parse.proto: what the connection's first inbound bytes said. */
#define QOSD_PROTO_UNSEEN 0 /* nothing read yet */
#define QOSD_PROTO_OPAQUE 1 /* unknown, or gave up: one request per turn */
#define QOSD_PROTO_HTTP 2   /* HTTP/1.x */
#define QOSD_PROTO_RESP 3   /* redis (RESP arrays, inline commands) */
#define QOSD_PROTO_MC 4     /* memcached text */
#define QOSD_PROTO_TLS 5    /* TLS records: a turn with application data is one request */
#define QOSD_PROTO_HTTP_REPLY 6 /* HTTP/1.x replies (the outbound stream) */

/* Where the request counter of a connection is in its inbound byte stream
 * (count.h): enough to resume at the next read, whatever the split. */
struct req_parse {
	__u32 skip;  /* payload bytes to pass over unread */
	__u32 num;   /* the number being read (a length, a count) */
	__u16 elems; /* RESP: bulk strings left; memcached: data-length token */
	__u8 proto;  /* QOSD_PROTO_* */
	__u8 phase;  /* QOSD_PH_* (count.h) */
	__u8 line;   /* bytes into the line, token or TLS record header */
	__u8 match;  /* HTTP: header-name bits; memcached: token; TLS: type */
	__u8 tls;    /* QOSD_TLS_* flags (count.h) */
	__u8 http;   /* QOSD_HTTP_* flags (count_proto.h) */
};

/* Per accepted connection (the syscall path, requests.bpf.c). */
struct conn_state {
	__u64 conn_id;
	__u64 accept_ns;
	__u64 req_start_ns;
	__u64 last_out_ns;
	__u32 turns;
	__u16 port; /* local port, host order */
	__u8 state; /* QOSD_ST_* */
	__u8 emit;  /* QOSD_EMIT_* bits, copied from the target at accept */
	__u16 nreq; /* requests the turn in flight carries (its record's) */
	__u8 pad[6];
	struct req_parse parse;
};

/* gRPC calls in flight (grpc.bpf.c): the process and the stream object. */
struct grpc_key {
	__u32 tgid;
	__u32 pad;
	__u64 stream;
};

/* Per traced process. */
struct target_cfg {
	__u8 emit;        /* QOSD_EMIT_* bits */
	__u8 port_filter; /* 1: only ports in the ports map for the root tgid */
	__u8 follow;      /* 1: children forked later are traced too (sockets) */
	__u8 pad;
	__u32 root; /* the tgid records are counted under (itself, or the
		     * traced ancestor it descends from) */
};

/* Per accepted connection on the socket path (sockets.bpf.c), keyed by the
 * struct sock's address. */
struct sock_state {
	__u64 conn_id;
	__u64 accept_ns;     /* handshake completed; 0: open before tracing */
	__u64 first_read_ns; /* CONN records' service start */
	__u64 req_start_ns;  /* first read of the request in flight */
	__u64 req_arrive_ns; /* its arrival */
	__u64 arrive_ns;     /* first data_ready since the last send; 0: none */
	__u64 last_out_ns;
	__u32 tgid; /* root tgid of the traced owner; 0: not claimed yet */
	__u32 turns;
	__u16 port;  /* local port, host order */
	__u8 state;  /* QOSD_ST_* */
	__u8 emit;   /* QOSD_EMIT_* bits, copied from the target at claim */
	__u16 nreq;  /* requests the turn in flight carries (its record's) */
	__u16 nlater; /* of them, completed by a later read than the turn's
		       * first (read ahead while the turn's replies were
		       * pending): timed from their own reads' arrivals */
	struct req_parse parse;
	__u64 read_arrive_ns;   /* first data_ready since the last read; 0: none */
	__u64 later_arrive_sum; /* the nlater requests: sum of (arrival -
				 * req_arrive_ns), ns */
	__u64 later_read_sum;   /* and of (their read - req_start_ns), ns */
	__u8 by_reply; /* QOSD_BY_REPLY_*: how requests end (sockets.bpf.c) */
	__u8 pad2[7];
};

/* sock_state.by_reply */
#define QOSD_BY_REPLY_UNSET 0 /* not decided yet (no request read) */
#define QOSD_BY_REPLY_ON 1    /* HTTP: one record per reply (reply_fifo) */
#define QOSD_BY_REPLY_OFF 2   /* by turns (not HTTP, or fell back) */

/* Requests read but not answered yet that a connection timed by its
 * replies keeps (a power of two). */
#define QOSD_FIFO 64

/* Per HTTP connection timed by its replies (sockets.bpf.c), in a second
 * socket storage: the arrival and first read of each request read and not
 * yet answered, in order, and the parse of the outbound stream. */
struct reply_fifo {
	__u64 arrive[QOSD_FIFO];   /* arrival, ns */
	__u32 start_off[QOSD_FIFO]; /* its read - its arrival, ns (capped) */
	struct req_parse reply;    /* where the replies' parse is */
	__u64 part_arrive; /* a request whose bytes began in an earlier read */
	__u64 part_start;
	__u32 head; /* next to answer (free-running; index & (QOSD_FIFO-1)) */
	__u32 tail; /* next free */
	__u32 replies; /* replies counted: the records' turns (1 opens) */
	__u32 pad;
};

/* Words of the traced-local-port bitmap: one bit per TCP port. */
#define QOSD_PORT_WORDS 1024

/* (tgid, port) pairs a port-filtered target serves. */
struct port_key {
	__u32 tgid;
	__u16 port;
	__u16 pad;
};

_Static_assert(sizeof(struct req_record) == 48, "req_record layout");
_Static_assert(__builtin_offsetof(struct req_record, arrive_ns) == 40, "req_record layout");
_Static_assert(sizeof(struct req_parse) == 16, "req_parse layout");
_Static_assert(sizeof(struct sock_state) == 120, "sock_state layout");
_Static_assert(sizeof(struct reply_fifo) == 816, "reply_fifo layout");
_Static_assert(__builtin_offsetof(struct sock_state, nreq) == 68, "sock_state layout");
_Static_assert(__builtin_offsetof(struct req_record, nreq) == 38, "req_record layout");
_Static_assert(sizeof(struct conn_key) == 8, "conn_key layout");
_Static_assert(sizeof(struct conn_state) == 64, "conn_state layout");
_Static_assert(__builtin_offsetof(struct conn_state, nreq) == 40, "conn_state layout");
_Static_assert(sizeof(struct target_cfg) == 8, "target_cfg layout");
_Static_assert(sizeof(struct port_key) == 8, "port_key layout");
_Static_assert(sizeof(struct grpc_key) == 16, "grpc_key layout");

#endif
