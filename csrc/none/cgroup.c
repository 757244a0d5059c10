/* none/cgroup.c -- no cgroups on this platform (linux/cgroup.c's stand-in):
 * nothing to join. */
#include <errno.h>

#include "../sbx_internal.h"

int sbx_cgroup_fs_kind(const char *path)
{
    (void)path;
    return 0;
}

void sbx_cgroup_join_child(const struct sbx_child_ctx *ctx)
{
    (void)ctx;
}
