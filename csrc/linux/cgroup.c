/* linux/cgroup.c -- the C side of cgroup placement (Linux).
 *
 * The parent does all the file work (mkdir, limits, opening the sandbox's
 * cgroup.procs files): see sbxlimit/_cgroup.py.  What must be C is the
 * child's move into the cgroup before anything else runs, and a statfs()
 * probe that tells cgroup2 from v1 without parsing mount tables.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "../sbx_internal.h"

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif
#ifndef CGROUP_SUPER_MAGIC
#define CGROUP_SUPER_MAGIC 0x27e0eb
#endif

int sbx_cgroup_fs_kind(const char *path)
{
    struct statfs st;

    if (statfs(path, &st) < 0)
        return -errno;
    if ((unsigned long)st.f_type == CGROUP2_SUPER_MAGIC)
        return 2;
    if ((unsigned long)st.f_type == CGROUP_SUPER_MAGIC)
        return 1;
    return 0;
}

/* Writing "0" to cgroup.procs moves the writing process: no pid to format. */
static int join_one_child(int fd)
{
    return write(fd, "0", 1) < 0 ? -1 : 0;
}

void sbx_cgroup_join_child(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;
    size_t i = 0;

    if (s->n_cgroup_procs > 0 && s->fail_step == SBX_STEP_CGROUP)
        sbx_child_fail(ctx, SBX_STEP_CGROUP, s->fail_errno, 0);
    /* Born there already: CLONE_INTO_CGROUP did procs[0]'s work. */
    if (s->cgroup_dirfd >= 0 && (ctx->how & SBX_HOW_INTO_CGROUP))
        i = 1;
    for (; i < s->n_cgroup_procs; i++)
        SBX_CHILD_STEP(ctx, SBX_STEP_CGROUP, (int64_t)i, join_one_child(s->cgroup_procs[i]));
}
