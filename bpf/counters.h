/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* One per-CPU array of event counters per BPF object and count(idx), the
 * one way its programs bump one (userspace sums the CPUs). Each object
 * says how many it has: QOSD_COUNTERS(N) at file scope. */
#ifndef QOSD_COUNTERS_H
#define QOSD_COUNTERS_H

#define QOSD_COUNTERS(n)                                               \
	struct {                                                       \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);               \
		__uint(max_entries, n);                                \
		__type(key, __u32);                                    \
		__type(value, __u64);                                  \
	} counters SEC(".maps");                                       \
                                                                       \
	static __always_inline void count(__u32 idx)                   \
	{                                                              \
		__u64 *c = bpf_map_lookup_elem(&counters, &idx);       \
		if (c)                                                 \
			*c += 1;                                       \
	}

#endif
