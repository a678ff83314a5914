KFUNC_PROBE(task_numa_fault, int last_cpupid, int mem_node, int pages, int flags)
{
    count_hint_fault(flags);
    return 0;
}
