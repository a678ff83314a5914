#include <uapi/linux/ptrace.h>  /* struct pt_regs for the kprobe context */

int on_task_numa_fault(struct pt_regs *ctx, int last_cpupid, int mem_node, int pages, int flags)
{
    count_hint_fault(flags);
    return 0;
}
