/* Pages allocated, by the page's node and whether that node is the allocating CPU's.
 * Counts base pages (1 << order per allocation). Watched processes in page_allocs,
 * the rest in page_allocs_other[(node + 1) * 3 + locality] (node -1: not in any range). */
#define MAX_RANGES 256
#define MAX_CPUS 8192
#define MAX_NODES 64
#define LOCAL 0
#define REMOTE 1
#define UNKNOWN 2

struct frame_range {
    u64 start_pfn;
    u64 end_pfn;
    s32 node;
    u32 pad;
};

struct alloc_key {
    u32 tgid;
    s32 node;      /* -1: pfn outside every known range */
    u32 locality;  /* LOCAL, REMOTE or UNKNOWN */
    u32 pad;
};

BPF_ARRAY(frame_ranges, struct frame_range, MAX_RANGES);
BPF_ARRAY(num_frame_ranges, u32, 1);
BPF_ARRAY(cpu_nodes, s32, MAX_CPUS);  /* -1 where unknown */
BPF_PERCPU_HASH(page_allocs, struct alloc_key, u64, MAX_KEYS);
BPF_PERCPU_ARRAY(page_allocs_other, u64, (MAX_NODES + 1) * 3);

static __always_inline s32 pfn_node(u64 pfn, u32 n)
{
    for (u32 i = 0; i < MAX_RANGES; i++) {
        if (i >= n)
            break;
        u32 idx = i;
        struct frame_range *r = frame_ranges.lookup(&idx);
        if (!r)
            break;
        if (pfn >= r->start_pfn && pfn < r->end_pfn)
            return r->node;
    }
    return -1;
}

TRACEPOINT_PROBE(kmem, mm_page_alloc)
{
    u64 pfn = args->pfn;
    if (pfn == (u64)-1)  /* failed allocation */
        return 0;
    u32 zero = 0;
    u32 *num_ranges = num_frame_ranges.lookup(&zero);
    if (!num_ranges || *num_ranges == 0)  /* maps not loaded (yet): count nothing */
        return 0;
    struct alloc_key key = {};
    key.node = pfn_node(pfn, *num_ranges);
    u32 cpu = bpf_get_smp_processor_id();
    s32 *cpu_node = cpu_nodes.lookup(&cpu);
    if (key.node < 0 || key.node >= MAX_NODES || !cpu_node || *cpu_node < 0) {
        key.node = -1;
        key.locality = UNKNOWN;
    } else {
        key.locality = (*cpu_node == key.node) ? LOCAL : REMOTE;
    }
    u64 pages = 1ULL << args->order;
    key.tgid = current_watch_key();
    if (key.tgid == OTHER) {
        u32 slot = (key.node + 1) * 3 + key.locality;
        u64 *count = page_allocs_other.lookup(&slot);
        if (count)
            *count += pages;
    } else {
        u64 zero = 0;
        u64 *count = page_allocs.lookup_or_try_init(&key, &zero);
        if (count)
            *count += pages;
    }
    return 0;
}
