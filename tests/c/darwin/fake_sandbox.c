/* fake_sandbox.c -- a test double of libsandbox's sandbox_init(3), for
 * running sbxlimit's Seatbelt exec helper (csrc/darwin/seatbelt_exec.c) on
 * Linux.  It behaves as the real call is documented and observed to:
 *   - success: returns 0, *errorbuf untouched;
 *   - a profile it cannot compile: -1 with *errorbuf set (sandbox_free_error
 *     frees it) and errno left as it was;
 *   - a process already under a sandbox: -1, errno EPERM, *errorbuf set.
 * What it cannot do is confine: it appends each profile it "applies" to
 * $SBX_FAKE_SANDBOX_LOG, followed by a line "--- applied", so a test can
 * check what the program would have run under.  $SBX_FAKE_SANDBOXED=1
 * stands for a caller that is already sandboxed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sandbox_init(const char *profile, uint64_t flags, char **errorbuf);
void sandbox_free_error(char *errorbuf);

static char *error_text(const char *s)
{
    char *e = malloc(strlen(s) + 1);

    if (e != NULL)
        strcpy(e, s);
    return e;
}

int sandbox_init(const char *profile, uint64_t flags, char **errorbuf)
{
    const char *log = getenv("SBX_FAKE_SANDBOX_LOG");
    const char *nested = getenv("SBX_FAKE_SANDBOXED");

    if (flags != 0 || profile == NULL || errorbuf == NULL) {
        errno = EINVAL;
        return -1;
    }
    if (nested != NULL && strcmp(nested, "1") == 0) {
        *errorbuf = error_text("sandbox_apply: Operation not permitted");
        errno = EPERM;
        return -1;
    }
    if (strncmp(profile, "(version 1)", 11) != 0) {
        *errorbuf = error_text("unknown or missing version");
        return -1;
    }
    if (log != NULL) {
        FILE *f = fopen(log, "a");

        if (f != NULL) {
            fputs(profile, f);
            fputs("\n--- applied\n", f);
            fclose(f);
        }
    }
    return 0;
}

void sandbox_free_error(char *errorbuf)
{
    free(errorbuf);
}
