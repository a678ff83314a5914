/* NUMA hinting faults per watched process, local or remote. TNF_FAULT_LOCAL is from
 * include/linux/sched/numa_balancing.h; task_numa_fault() runs in the faulting task. */
#define TNF_FAULT_LOCAL 0x08

struct hint_key {
    u32 tgid;
    u32 remote;
};

BPF_PERCPU_HASH(numa_hint_faults, struct hint_key, u64, MAX_KEYS);

static __always_inline void count_hint_fault(int flags)
{
    struct hint_key key = {};
    key.tgid = current_watch_key();
    key.remote = (flags & TNF_FAULT_LOCAL) ? 0 : 1;
    u64 zero = 0;
    u64 *faults = numa_hint_faults.lookup_or_try_init(&key, &zero);
    if (faults)
        *faults += 1;
}
