/* none/seccomp.c -- platforms without seccomp, Landlock and namespaces. */
#include <errno.h>

#include "../sbx_internal.h"

int sbx_seccomp_build(void *out, size_t cap, size_t *n, int what, int caller, int caller_pgid)
{
    (void)out;
    (void)cap;
    (void)n;
    (void)what;
    (void)caller;
    (void)caller_pgid;
    return -ENOSYS;
}

int sbx_seccomp_load_child(const struct sbx_spec *s)
{
    (void)s;
    errno = ENOSYS;
    return -1;
}

int sbx_landlock_ruleset(uint64_t handled, const char *const *paths, const uint64_t *access,
                         size_t n, const struct sbx_landlock_net *net, size_t *added)
{
    (void)net;
    (void)handled;
    (void)paths;
    (void)access;
    (void)n;
    (void)added;
    return -ENOSYS;
}

int sbx_landlock_restrict_child(const struct sbx_spec *s)
{
    (void)s;
    errno = ENOSYS;
    return -1;
}

void sbx_ns_enter_child(const struct sbx_child_ctx *ctx)
{
    sbx_child_fail(ctx, SBX_STEP_NS_UNSHARE, ENOSYS, ctx->spec->ns_flags);
}

int sbx_ns_probe_child(long flags)
{
    (void)flags;
    errno = ENOSYS;
    return -1;
}

int sbx_ns_probe_view_child(long flags)
{
    (void)flags;
    errno = ENOSYS;
    return -1;
}

int sbx_landlock_allow_child(int ruleset, int fd, uint64_t access)
{
    (void)ruleset;
    (void)fd;
    (void)access;
    errno = ENOSYS;
    return -1;
}
