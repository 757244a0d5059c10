/* none/namespaces.c -- no namespaces on this platform (linux/namespaces.c's
 * stand-in): a child asked to enter one fails at ns:unshare with ENOSYS,
 * and the probes say ENOSYS. */
#include <errno.h>

#include "../sbx_internal.h"

void sbx_ns_enter_child(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;
    int join = s->ns_join_net || s->ns_join_ipc;

    sbx_child_fail(ctx, join ? SBX_STEP_NS_SETNS : SBX_STEP_NS_UNSHARE, ENOSYS, s->ns_flags);
}

int sbx_ns_dev_template(void)
{
    errno = ENOSYS;
    return -1;
}

int sbx_ns_view_ns(const struct sbx_view *view, size_t n_view, int view_ro_root, int dev_fd,
                   unsigned char *missing, uint64_t root[3], uint64_t ns[3])
{
    (void)root;
    (void)ns;
    (void)view;
    (void)n_view;
    (void)view_ro_root;
    (void)dev_fd;
    (void)missing;
    return -ENOSYS;
}

int sbx_ns_make(int kind)
{
    (void)kind;
    errno = ENOSYS;
    return -1;
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
