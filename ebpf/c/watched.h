/* Watched processes: per-process keys only for them, everything else under tgid 0
 * ("other"), so map sizes and label sets stay bounded.
 * User space fills watched_pids (engine pid, --watch-pid, /proc scan for --watch-comm)
 * and watched_comms (--watch-comm); a task whose comm matches is added to watched_pids
 * from here so a newly started engine is counted from its first event. */
#include <linux/sched.h>

#define MAX_WATCHED 1024
#define MAX_KEYS 10240

struct comm_key {
    char comm[TASK_COMM_LEN];
};

BPF_HASH(watched_pids, u32, u8, MAX_WATCHED);
BPF_HASH(watched_comms, struct comm_key, u8, 64);

/* Key for an event about process tgid, which need not be the current task. */
static __always_inline u32 watch_key(u32 tgid)
{
    return watched_pids.lookup(&tgid) ? tgid : 0;
}

/* Key for an event raised by the current task. */
static __always_inline u32 current_watch_key(void)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (watched_pids.lookup(&tgid))
        return tgid;
    struct comm_key c = {};
    bpf_get_current_comm(&c.comm, sizeof(c.comm));
    if (!watched_comms.lookup(&c))
        return 0;
    u8 one = 1;
    watched_pids.update(&tgid, &one);
    return tgid;
}
