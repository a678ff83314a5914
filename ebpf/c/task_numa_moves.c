/* NUMA balancer task placement: moves to another node, swaps with a task there, and
 * decisions to stay (stick). Counted against the process of each task involved. */
#define KIND_MOVE 0
#define KIND_SWAP 1
#define KIND_STICK 2

struct move_key {
    u32 tgid;
    u32 kind;
};

BPF_PERCPU_HASH(task_numa_moves, struct move_key, u64, MAX_KEYS);
BPF_PERCPU_ARRAY(task_numa_moves_other, u64, 3);  /* [kind] */

static __always_inline void count_move(u32 tgid, u32 kind)
{
    struct move_key key = {};
    key.tgid = watch_key(tgid);
    key.kind = kind;
    if (key.tgid == OTHER) {
        u32 slot = kind;
        u64 *count = task_numa_moves_other.lookup(&slot);
        if (count)
            *count += 1;
    } else {
        u64 zero = 0;
        u64 *count = task_numa_moves.lookup_or_try_init(&key, &zero);
        if (count)
            *count += 1;
    }
}

TRACEPOINT_PROBE(sched, sched_move_numa)
{
    count_move(args->tgid, KIND_MOVE);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_swap_numa)
{
    count_move(args->src_tgid, KIND_SWAP);
    count_move(args->dst_tgid, KIND_SWAP);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_stick_numa)
{
    count_move(args->src_tgid, KIND_STICK);
    return 0;
}
