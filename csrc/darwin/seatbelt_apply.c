/* darwin/seatbelt_apply.c -- put the calling process under a Seatbelt profile.
 *
 * sandbox_init(3) with flags 0 compiles SBPL text and applies it to the
 * calling process for good; what it starts inherits it.  It is what
 * sandbox-exec(1) does, and the only public way to do it.  The SDK marks
 * it deprecated, so it is declared here rather than through <sandbox.h>.
 *
 * Two callers: the exec helper (seatbelt_exec.c), a fresh process after
 * exec, and the forked-callable path, which runs Python next.  Neither is
 * between fork and exec: compiling a profile allocates.  The file has no
 * other platform code, so the helper is tested on Linux against a test
 * double of libsandbox (tests/c/darwin/fake_sandbox.c).
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "seatbelt_apply.h"

int sandbox_init(const char *profile, uint64_t flags, char **errorbuf);
void sandbox_free_error(char *errorbuf);

int sbx_seatbelt_apply(const char *profile, char *msg, size_t cap)
{
    char *err = NULL;
    int saved;

    if (cap > 0)
        msg[0] = '\0';
    errno = 0;
    if (sandbox_init(profile, 0, &err) == 0)
        return 0;
    /* A profile libsandbox cannot compile fails without an errno; a
     * process already under a sandbox gets EPERM. */
    saved = errno != 0 ? errno : EINVAL;
    if (err != NULL) {
        if (cap > 0) {
            size_t n = strlen(err);

            if (n >= cap)
                n = cap - 1;
            memcpy(msg, err, n);
            msg[n] = '\0';
        }
        sandbox_free_error(err);
    }
    return saved;
}
