/* none/proctree.c -- no process-tree backend on this platform (the stand-in
 * for linux/proctree.c and darwin/proctree.c).
 * Callers fall back to signalling the process group. */
#include <errno.h>
#include <string.h>

#include "../sbx.h"

int sbx_tree_sample(pid_t root, int skip_root, struct sbx_tree_sample *out)
{
    (void)root;
    (void)skip_root;
    memset(out, 0, sizeof *out);
    errno = ENOSYS;
    return -1;
}

int sbx_tree_signal(pid_t root, int sig, pid_t pgid)
{
    (void)root;
    (void)sig;
    (void)pgid;
    errno = ENOSYS;
    return -1;
}

int sbx_tree_sample_cached(pid_t root, int skip_root, struct sbx_tree_cache *cache,
                           struct sbx_tree_sample *out)
{
    /* No cheap "has it run" here: always walk. */
    cache->n = 0;
    return sbx_tree_sample(root, skip_root, out);
}
