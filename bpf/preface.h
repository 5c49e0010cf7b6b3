/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The HTTP/2 client preface in a connection's first inbound bytes, read
 * from the user buffer of the syscall that received them (requests.bpf.c
 * has the syscall's registers at its exit; sockets.bpf.c takes them from
 * the task's saved user registers, bpf_task_pt_regs()). Shared so both
 * paths tell gRPC/HTTP/2 connections apart the same way.
 */
#ifndef QOSD_PREFACE_H
#define QOSD_PREFACE_H

/* How an inbound syscall passes its buffer (args[1]). */
#define BUF_NONE 0
#define BUF_FLAT 1 /* read, recvfrom: the buffer */
#define BUF_IOV 2  /* readv: struct iovec[] */
#define BUF_MSG 3  /* recvmsg: struct user_msghdr */

/* x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl). */
#define NR_read 0
#define NR_write 1
#define NR_readv 19
#define NR_writev 20
#define NR_sendfile 40
#define NR_accept 43
#define NR_sendto 44
#define NR_recvfrom 45
#define NR_sendmsg 46
#define NR_recvmsg 47
#define NR_accept4 288

/* How the syscall `nr` passes an inbound buffer. */
static __always_inline int read_kind(__u64 nr)
{
	switch (nr) {
	case NR_read:
	case NR_recvfrom:
		return BUF_FLAT;
	case NR_readv:
		return BUF_IOV;
	case NR_recvmsg:
		return BUF_MSG;
	}
	return BUF_NONE;
}

#define MSG_PEEK 2

/* Whether the inbound syscall `nr` (registers at its exit) only peeked:
 * nothing was consumed and the bytes will be read again (nginx peeks at a
 * connection's first byte to tell TLS from plain HTTP). Flags are
 * recvfrom's fourth argument and recvmsg's third; read and readv cannot
 * peek. */
static __always_inline bool peeked(__u64 nr, const struct pt_regs *regs)
{
	if (nr == NR_recvfrom)
		return regs->r10 & MSG_PEEK;
	if (nr == NR_recvmsg)
		return regs->dx & MSG_PEEK;
	return false;
}

/* How the syscall `nr` passes an outbound buffer (args[1]). */
static __always_inline int write_kind(__u64 nr)
{
	switch (nr) {
	case NR_write:
	case NR_sendto:
		return BUF_FLAT;
	case NR_writev:
		return BUF_IOV;
	case NR_sendmsg:
		return BUF_MSG;
	}
	return BUF_NONE; /* sendfile, splice, io_uring: not in user memory */
}

/* The first piece of a syscall's `ret` bytes, given its args[1]: its user
 * address (0: unknown) and, in *len, how many of the bytes it holds (the
 * first iovec may hold fewer). */
static __always_inline __u64 user_piece(__u64 arg, int kind, __u64 ret,
					__u64 *len)
{
	struct iovec iov = {};
	*len = ret;
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
	if (iov.iov_len < ret)
		*len = iov.iov_len;
	return (__u64)iov.iov_base;
}

/* The user address where an inbound syscall's bytes landed, given its
 * args[1] (0: unknown, or its first piece holds fewer than `need` bytes:
 * they did not all land in one place). */
static __always_inline __u64 user_buf(__u64 arg, int kind, __u64 need)
{
	__u64 len = 0;
	__u64 buf = user_piece(arg, kind, need, &len);
	return len < need ? 0 : buf;
}

/* Where the first inbound bytes landed, if the preface fits there. */
static __always_inline __u64 first_buf(__u64 arg, int kind)
{
	return user_buf(arg, kind, QOSD_H2_PREFACE_LEN);
}

/* x86-64: the kernel stack's size (no KASAN) and the user segment
 * selectors a 64-bit task's saved registers hold. */
#define QOSD_THREAD_SIZE 16384
#define QOSD_USER_CS 0x33
#define QOSD_USER_SS 0x2b

/* The task's user registers saved at the top of its kernel stack, found
 * with no call: task_pt_regs() is (task->stack + THREAD_SIZE - padding)
 * less one struct pt_regs, the padding 0, or 16 with FRED (6.9+). Each
 * guess is read through bpf_core_cast (a faulting read gives 0) and taken
 * only if it holds the user segments; NULL: neither (another stack size,
 * a 32-bit task, a kernel thread), and the helper decides. */
static __always_inline struct pt_regs *guess_regs(struct task_struct *task)
{
	if (!bpf_ksym_exists(bpf_rdonly_cast))
		return NULL;
	__u64 top = (__u64)task->stack + QOSD_THREAD_SIZE -
		    bpf_core_type_size(struct pt_regs);
	struct pt_regs *r = bpf_core_cast((void *)top, struct pt_regs);
	if (r->cs == QOSD_USER_CS && r->ss == QOSD_USER_SS)
		return r;
	r = bpf_core_cast((void *)(top - 16), struct pt_regs);
	if (r->cs == QOSD_USER_CS && r->ss == QOSD_USER_SS)
		return r;
	return NULL;
}

/* The saved user registers of the current task's syscall (NULL: none),
 * for hooks that fire inside a syscall but are not handed its arguments.
 * A BPF call costs ~40 ns here (count.h): bpf_task_pt_regs only when the
 * guess fails. */
static __always_inline struct pt_regs *syscall_regs(void)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *r = guess_regs(task);
	return r ? r : (struct pt_regs *)bpf_task_pt_regs(task);
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

#endif
