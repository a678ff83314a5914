/* Pages migrated, by the kernel's migrate_reason (names read from the format file). */
#include <linux/migrate_mode.h>  /* the tracepoint's mode field */

#define MAX_REASONS 64

BPF_PERCPU_ARRAY(page_migrations, u64, MAX_REASONS);

TRACEPOINT_PROBE(migrate, mm_migrate_pages)
{
    u32 reason = args->reason;
    if (reason >= MAX_REASONS)
        reason = MAX_REASONS - 1;
    u64 *pages = page_migrations.lookup(&reason);
    if (pages)
        *pages += args->succeeded;
    return 0;
}
