/* Watched processes: per-process keys only for them, everything else counted as "other"
 * in small per-CPU arrays (cheaper than a hash update on every event), so map sizes and
 * label sets stay bounded.
 * User space fills watched_pids (engine pid, --watch-pid, /proc scan for --watch-comm),
 * watched_comms (--watch-comm) and watch_config; a task whose comm matches is added to
 * watched_pids from here so a new engine is counted from its first event. */
#ifndef TASK_COMM_LEN
#define TASK_COMM_LEN 16  /* include/linux/sched.h: comm is char[16], a stable ABI */
#endif

#define MAX_WATCHED 1024
#define MAX_KEYS 10240
#define OTHER 0

struct comm_key {
    char comm[TASK_COMM_LEN];
};

BPF_HASH(watched_pids, u32, u8, MAX_WATCHED);
BPF_HASH(watched_comms, struct comm_key, u8, 64);
BPF_ARRAY(watch_config, u32, 2);  /* [0] number of watched comms, [1] watch-list generation */

/* The last answer on this CPU: events come in bursts from one process, and two array
 * lookups cost less than a hash lookup. User space bumps the generation whenever it
 * rewrites the watch list, which empties every CPU's cache. */
struct watch_cache {
    u32 tgid;
    u32 key;
    u32 generation;
    u32 valid;
};

BPF_PERCPU_ARRAY(watch_cache, struct watch_cache, 1);

/* Key for an event about process tgid, which need not be the current task. */
static __always_inline u32 watch_key(u32 tgid)
{
    return watched_pids.lookup(&tgid) ? tgid : OTHER;
}

static __always_inline u32 lookup_current_watch_key(u32 tgid, u32 num_comms)
{
    if (watched_pids.lookup(&tgid))
        return tgid;
    if (num_comms == 0)
        return OTHER;
    struct comm_key c = {};
    bpf_get_current_comm(&c.comm, sizeof(c.comm));
    if (!watched_comms.lookup(&c))
        return OTHER;
    u8 one = 1;
    watched_pids.update(&tgid, &one);
    return tgid;
}

/* Key for an event raised by the current task. */
static __always_inline u32 current_watch_key(void)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 zero = 0, one = 1;
    u32 *num_comms = watch_config.lookup(&zero);
    u32 *generation = watch_config.lookup(&one);
    struct watch_cache *cache = watch_cache.lookup(&zero);
    if (!num_comms || !generation || !cache)
        return OTHER;
    if (cache->valid && cache->tgid == tgid && cache->generation == *generation)
        return cache->key;
    u32 key = lookup_current_watch_key(tgid, *num_comms);
    /* With comms watched, "not watched" is not cached: a process may rename itself
     * (prctl, exec) into a watched comm after its first event on this CPU. */
    if (key == OTHER && *num_comms > 0)
        return key;
    cache->tgid = tgid;
    cache->key = key;
    cache->generation = *generation;
    cache->valid = 1;
    return key;
}
