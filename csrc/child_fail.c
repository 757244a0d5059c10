/* child_fail.c -- the child's failure report.
 *
 * The first step of the child sequence that fails writes one fixed-size
 * struct sbx_child_error (step, errno, detail) to the close-on-exec error
 * pipe and _exit(127)s; the parent reads it in sbx_spawn_finish (spawn.c).
 * Every step file (spawn.c, fds.c, rlimit.c, linux/...) reports through
 * here, so none of them depends on another for it.
 *
 * Runs between clone and exec, possibly sharing the parent's memory: only
 * write(2) and _exit(2), no malloc, no locks, no stdio.
 */
#include <errno.h>
#include <unistd.h>

#include "sbx_internal.h"

_Noreturn void sbx_child_fail(const struct sbx_child_ctx *ctx, int step, int err, int64_t detail)
{
    struct sbx_child_error rec;
    ssize_t n;

    rec.step = step;
    rec.err = err;
    rec.detail = detail;
    do {
        n = write(ctx->errfd, &rec, sizeof rec);
    } while (n < 0 && errno == EINTR);
    _exit(127);
}
