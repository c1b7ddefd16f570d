#!/usr/bin/env python3
"""Where a whole-machine profile's cycles go, by thread group and by the
place of each sample's leaf frame.

Input: `perf script -F comm,tid,time,ip,sym,dso` of a `perf record -a -g`
(call graphs: the classes below look at the callers too). Groups by the
thread's name: `lcore-N` (server lcores), `tally` (a rank's own thread),
`tally-rail*` (its rails), other `tally-*` threads, `swapper` (idle), the
rest. Classes: the kernel's receive path (softirq, veth, tbf, IP/TCP),
its copies to and from user memory, the rest of send and receive calls,
waits and wake-ups, libfabric, libc's locks and stubs, tally's own code,
the reduce kernels. Start-up (libfabric's reads of /proc/kallsyms, slab
zeroing) is classed apart.

    perf script -i perf.data -F comm,tid,time,ip,sym,dso > s.txt
    scripts/device/perf_classes.py s.txt
"""
import collections
import sys

KERNEL_RX = ['net_rx_action', '__do_softirq', 'handle_softirqs', 'napi', 'veth_', 'tbf_', 'qdisc', 'netif_receive', 'ip_rcv', 'tcp_v4_rcv']
KERNEL_WAIT = ['epoll', 'do_sys_poll', 'poll_schedule', 'schedule', 'futex', 'nanosleep', 'sched_yield', 'eventfd', 'ksys_read', 'ksys_write', 'try_to_wake_up']
GROUPS = ['server lcores', 'rank main threads', 'rank rail threads', 'rank other tally threads', 'others', 'idle']


def classify(frames):
    leaf = frames[0]
    s = ' | '.join(frames)
    k = '[kernel.kallsyms]' in leaf
    if 'clear_page' in leaf or 'kallsyms_expand' in s or 'update_iter' in s or ' s_show' in s:
        return 'startup'
    if k and any(x in leaf for x in ['_copy_to_iter', '_copy_from_iter', 'copy_user', 'memcpy', 'memmove']):
        return 'kernel copy user<->skb'
    if k:
        if any(x in s for x in KERNEL_RX):
            return 'kernel net: softirq, veth, tbf, ip/tcp rx'
        if any(x in s for x in ['tcp_sendmsg', 'sendmsg', 'sendto']):
            return 'kernel send syscall (rest)'
        if any(x in s for x in ['tcp_recvmsg', 'recvmsg', 'recvfrom', 'readv']):
            return 'kernel recv syscall (rest)'
        if any(x in s for x in KERNEL_WAIT):
            return 'kernel wait/wake (epoll, poll, futex, eventfd, yield)'
        if 'do_syscall_64' in leaf or 'entry_SYSCALL' in leaf or 'syscall_exit' in leaf:
            return 'kernel syscall entry/exit'
        return 'kernel other'
    if 'memmove' in leaf or 'memcpy' in leaf:
        return 'user memcpy (libc)'
    if 'float_kernel' in leaf or 'reduce::' in leaf:
        return 'reduce kernel'
    if 'libfabric' in leaf:
        return 'libfabric (user)'
    if 'libc' in leaf and ('mutex' in leaf or 'lock' in leaf):
        return 'libc locks'
    if 'libc' in leaf:
        return 'libc other (syscall stubs etc.)'
    if 'vdso' in leaf:
        return 'vdso clock'
    if 'tally' in leaf:
        return 'tally (user)'
    return 'other'


def group(comm):
    if comm.startswith('lcore'):
        return 'server lcores'
    if comm == 'tally':
        return 'rank main threads'
    if comm.startswith('tally-rail'):
        return 'rank rail threads'
    if comm.startswith('tally-'):
        return 'rank other tally threads'
    if comm == 'swapper':
        return 'idle'
    return 'others'


def main(path):
    cat = collections.defaultdict(collections.Counter)
    tot = collections.Counter()
    for rec in open(path).read().split('\n\n'):
        lines = [line for line in rec.strip().split('\n') if line.strip()]
        if len(lines) < 2:
            continue
        g = group(lines[0].split()[0])
        cat[g][classify([line.strip() for line in lines[1:]])] += 1
        tot[g] += 1
    every = sum(tot.values()) or 1
    for g in GROUPS:
        if not tot[g]:
            continue
        print(f"== {g}: {tot[g]} samples ({100 * tot[g] / every:.1f}% of all)")
        for c, n in cat[g].most_common(14):
            print(f"  {100 * n / tot[g]:5.1f}%  {c}")


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
