/* rlimit.c -- resource limits, set in the child before exec.
 *
 * Each resource has its own step so that a failure names it
 * ("rlimit:RLIMIT_NOFILE") and the testing switch can target it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <sys/resource.h>

#include "sbx_internal.h"

static const struct {
    int resource;
    int step;
} rlimit_steps[] = {
    {RLIMIT_CORE, SBX_STEP_RLIMIT_CORE},   {RLIMIT_CPU, SBX_STEP_RLIMIT_CPU},
    {RLIMIT_FSIZE, SBX_STEP_RLIMIT_FSIZE}, {RLIMIT_DATA, SBX_STEP_RLIMIT_DATA},
    {RLIMIT_AS, SBX_STEP_RLIMIT_AS},       {RLIMIT_NOFILE, SBX_STEP_RLIMIT_NOFILE},
    {RLIMIT_NPROC, SBX_STEP_RLIMIT_NPROC},
};

int sbx_rlimit_step(int resource)
{
    size_t i;

    for (i = 0; i < sizeof rlimit_steps / sizeof rlimit_steps[0]; i++)
        if (rlimit_steps[i].resource == resource)
            return rlimit_steps[i].step;
    return SBX_STEP_NONE;
}

static rlim_t to_rlim(uint64_t v)
{
    return v == SBX_RLIM_INF ? RLIM_INFINITY : (rlim_t)v;
}

/* Child side (async-signal-safe): set the limits in the order given. */
void sbx_rlimit_apply_child(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;
    size_t i;

    for (i = 0; i < s->n_rlimits; i++) {
        const struct sbx_rlimit *r = &s->rlimits[i];
        struct rlimit rl;

        rl.rlim_cur = to_rlim(r->soft);
        rl.rlim_max = to_rlim(r->hard);
        SBX_CHILD_STEP(ctx, sbx_rlimit_step(r->resource), (int64_t)r->soft,
                       setrlimit(r->resource, &rl));
    }
}
