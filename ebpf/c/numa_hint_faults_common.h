/* NUMA hinting faults per watched process, local or remote. TNF_FAULT_LOCAL is from
 * include/linux/sched/numa_balancing.h; task_numa_fault() runs in the faulting task. */
#define TNF_FAULT_LOCAL 0x08

struct hint_key {
    u32 tgid;
    u32 remote;
};

BPF_PERCPU_HASH(numa_hint_faults, struct hint_key, u64, MAX_KEYS);
BPF_PERCPU_ARRAY(numa_hint_faults_other, u64, 2);  /* [remote] */

static __always_inline void count_hint_fault(int flags)
{
    struct hint_key key = {};
    key.remote = (flags & TNF_FAULT_LOCAL) ? 0 : 1;
    key.tgid = current_watch_key();
    if (key.tgid == OTHER) {
        u32 slot = key.remote;
        u64 *count = numa_hint_faults_other.lookup(&slot);
        if (count)
            *count += 1;
    } else {
        u64 zero = 0;
        u64 *count = numa_hint_faults.lookup_or_try_init(&key, &zero);
        if (count)
            *count += 1;
    }
}
