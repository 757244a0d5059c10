/* none/landlock.c -- no Landlock on this platform (linux/landlock.c's
 * stand-in): no ruleset is built, none can restrict the child. */
#include <errno.h>

#include "../sbx_internal.h"

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

int sbx_landlock_allow_child(int ruleset, int fd, uint64_t access)
{
    (void)ruleset;
    (void)fd;
    (void)access;
    errno = ENOSYS;
    return -1;
}
