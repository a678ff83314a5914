/* User-mode page faults per watched process (x86 exceptions:page_fault_user). A raw
 * tracepoint: no argument is needed, so the kernel need not format the event record. */
BPF_PERCPU_HASH(page_faults, u32, u64, MAX_KEYS);
BPF_PERCPU_ARRAY(page_faults_other, u64, 1);

RAW_TRACEPOINT_PROBE(page_fault_user)
{
    u32 key = current_watch_key();
    if (key == OTHER) {
        u32 slot = 0;
        u64 *count = page_faults_other.lookup(&slot);
        if (count)
            *count += 1;
    } else {
        u64 zero = 0;
        u64 *count = page_faults.lookup_or_try_init(&key, &zero);
        if (count)
            *count += 1;
    }
    return 0;
}
