/* linux/landlock.c -- file rules with Landlock: the ruleset is built in the
 * parent (it opens every rule's path), the child restricts itself with it
 * after no_new_privs, before the seccomp filter.
 *
 * Landlock only allows: what a policy denies inside an allowed tree is done
 * by the Python layer allowing the siblings along the way instead
 * (sbxlimit/_landlock.py).  Rights the running kernel's ABI does not know
 * are never asked for, as the kernel's own sample does.  From ABI 4 the
 * same ruleset can hold TCP port rules (bind/connect), from ABI 6 scopes
 * (abstract unix sockets).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../sbx_internal.h"

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_landlock_add_rule
#define SYS_landlock_add_rule 445
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif

/* The kernel's structs (linux/landlock.h), spelled out so that the build
 * does not depend on the installed headers' version. */
struct sbx_ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net; /* ABI 4 */
    uint64_t scoped;             /* ABI 6 */
};
struct sbx_ll_net_port {
    uint64_t allowed_access;
    uint64_t port;
};
#define SBX_LL_RULE_NET_PORT 2
struct sbx_ll_path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));
#define SBX_LL_RULE_PATH_BENEATH 1

/* Rights that apply to a file (the others need a directory). */
#define SBX_LL_FILE_RIGHTS ((1ULL << 0) | (1ULL << 1) | (1ULL << 2) | (1ULL << 14) | (1ULL << 15))

int sbx_landlock_ruleset(uint64_t handled, const char *const *paths, const uint64_t *access,
                         size_t n, const struct sbx_landlock_net *net, size_t *added)
{
    struct sbx_ll_ruleset_attr attr;
    size_t i, size = sizeof attr.handled_access_fs;
    int fd;

    memset(&attr, 0, sizeof attr);
    attr.handled_access_fs = handled;
    /* The smallest struct that holds what is asked: an older kernel
     * refuses a larger one with non-zero fields it does not know. */
    if (net && net->handled_net) {
        attr.handled_access_net = net->handled_net;
        size = offsetof(struct sbx_ll_ruleset_attr, scoped);
    }
    if (net && net->scoped) {
        attr.scoped = net->scoped;
        size = sizeof attr;
    }
    /* Close-on-exec already: the kernel makes it so. */
    fd = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
    if (fd < 0)
        return -errno;
    *added = 0;
    for (i = 0; i < n; i++) {
        struct sbx_ll_path_beneath rule;
        int pfd = open(paths[i], O_PATH | O_CLOEXEC), rc;

        if (pfd < 0) {
            if (errno == ENOENT || errno == ENOTDIR || errno == EACCES)
                continue; /* nothing there to allow */
            goto fail;
        }
        rule.allowed_access = access[i] & handled;
        rule.parent_fd = pfd;
        rc = (int)syscall(SYS_landlock_add_rule, fd, SBX_LL_RULE_PATH_BENEATH, &rule, 0);
        /* Not a directory: the kernel takes a file's rights only (and says
         * EINVAL for the others), which spares an fstat of every path. */
        if (rc < 0 && errno == EINVAL && (rule.allowed_access & ~SBX_LL_FILE_RIGHTS)) {
            rule.allowed_access &= SBX_LL_FILE_RIGHTS;
            rc = (int)syscall(SYS_landlock_add_rule, fd, SBX_LL_RULE_PATH_BENEATH, &rule, 0);
        }
        if (rc < 0) {
            close(pfd);
            goto fail;
        }
        close(pfd);
        (*added)++;
    }
    for (i = 0; net && net->handled_net && i < net->n_ports; i++) {
        struct sbx_ll_net_port rule;

        rule.allowed_access = net->net_access & net->handled_net;
        rule.port = net->ports[i];
        if (syscall(SYS_landlock_add_rule, fd, SBX_LL_RULE_NET_PORT, &rule, 0) < 0)
            goto fail;
        (*added)++;
    }
    return fd;
fail : {
    int saved = errno;

    close(fd);
    return -saved;
}
}

int sbx_landlock_restrict_child(const struct sbx_spec *s)
{
    return (int)syscall(SYS_landlock_restrict_self, s->landlock_fd, 0);
}

/* Child side: allow `access` beneath the directory `fd` in the spec's
 * ruleset (before restricting).  For the workspace's tmpfs, mounted after
 * the parent built the ruleset: Landlock does not look at the directory a
 * mount hides, so the parent's rule for it does not reach the tmpfs. */
int sbx_landlock_allow_child(int ruleset, int fd, uint64_t access)
{
    struct sbx_ll_path_beneath rule;

    rule.allowed_access = access;
    rule.parent_fd = fd;
    return (int)syscall(SYS_landlock_add_rule, ruleset, SBX_LL_RULE_PATH_BENEATH, &rule, 0);
}
