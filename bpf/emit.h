/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The record channel of the request tracer, shared by requests.bpf.c and
 * grpc.bpf.c: one ring buffer of struct req_record and the per-CPU
 * counters (a full buffer is counted, never silent). Each object declares
 * the two maps through this header; userspace hands requests.bpf.o's fds to
 * grpc.bpf.o before load, so both write into the very same buffer and one
 * consumer drains every record kind in order.
 */
#ifndef QOSD_EMIT_H
#define QOSD_EMIT_H

#include "requests.h"
#include "agg.h"
#include "counters.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 128 * 1024); /* resized by userspace before load */
} events SEC(".maps");

QOSD_COUNTERS(QOSD_CNT_MAX)

/* emit_record(wake_at): never wake the reader; its timed poll takes it. */

/* Bytes one record takes in the ring buffer: the record and the buffer's
 * 8-byte header, rounded up to 8. */
#define QOSD_REC_FOOTPRINT ((sizeof(struct req_record) + 8 + 7) / 8 * 8)
#define QOSD_NEVER_WAKE (~0ULL)

/*
 * Sends one record. The reader is woken each time the bytes of records
 * waiting reach a multiple of `wake_at` (0: for every record;
 * QOSD_NEVER_WAKE: never): a wakeup is a context switch to the reader, the
 * dearest part of a record.
 */
static __always_inline void emit_record_n(__u8 kind, __u32 tgid, __u32 fd,
					  __u64 conn_id, __u32 turns,
					  __u16 nreq, __u64 arrive,
					  __u64 start, __u64 end,
					  __u64 wake_at)
{
	if (agg_record(kind, tgid, turns, nreq, arrive, start, end))
		return;
	/* Built on the stack and copied by one bpf_ringbuf_output: one call
	 * fewer than reserve + submit (a call costs ~40 ns here, count.h). */
	struct req_record r = {
		.arrive_ns = arrive,
		.start_ns = start,
		.end_ns = end,
		.conn_id = conn_id,
		.tgid = tgid,
		.fd = fd,
		.turns = turns,
		.kind = kind,
		.nreq = nreq,
	};
	__u64 flags = BPF_RB_NO_WAKEUP;
	if (wake_at == 0) {
		flags = BPF_RB_FORCE_WAKEUP;
	} else if (wake_at != QOSD_NEVER_WAKE) {
		/* Wake as the bytes waiting pass each multiple of wake_at,
		 * not on every record above it: until the reader runs, each
		 * forced wakeup whose irq_work already ran raises another
		 * (an IPI, a VM exit under a hypervisor), so a reader slow
		 * to be scheduled cost a wakeup per record. Waiting bytes
		 * after this record: what waits now and its footprint. */
		__u64 before = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
		__u64 after = before + QOSD_REC_FOOTPRINT;
		if (after / wake_at != before / wake_at)
			flags = BPF_RB_FORCE_WAKEUP;
	}
	if (bpf_ringbuf_output(&events, &r, sizeof(r), flags))
		count(QOSD_CNT_LOST);
}

/* One record that stands for one request. */
static __always_inline void emit_record(__u8 kind, __u32 tgid, __u32 fd,
					__u64 conn_id, __u32 turns,
					__u64 arrive, __u64 start, __u64 end,
					__u64 wake_at)
{
	emit_record_n(kind, tgid, fd, conn_id, turns, 1, arrive, start, end,
		      wake_at);
}

#endif
