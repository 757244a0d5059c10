/* none/seccomp.c -- no seccomp on this platform (linux/seccomp.c's
 * stand-in): no filter is built, none can be loaded. */
#include <errno.h>

#include "../sbx_internal.h"

int sbx_seccomp_build(void *out, size_t cap, size_t *n, int what, int caller, int caller_pgid,
                      int guard)
{
    (void)out;
    (void)cap;
    (void)n;
    (void)what;
    (void)caller;
    (void)caller_pgid;
    (void)guard;
    return -ENOSYS;
}

int sbx_seccomp_load_child(const struct sbx_spec *s)
{
    (void)s;
    errno = ENOSYS;
    return -1;
}
