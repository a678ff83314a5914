/* User-mode page faults per watched process (x86 exceptions:page_fault_user). */
BPF_PERCPU_HASH(page_faults, u32, u64, MAX_KEYS);

TRACEPOINT_PROBE(exceptions, page_fault_user)
{
    u32 key = current_watch_key();
    u64 zero = 0;
    u64 *faults = page_faults.lookup_or_try_init(&key, &zero);
    if (faults)
        *faults += 1;
    return 0;
}
