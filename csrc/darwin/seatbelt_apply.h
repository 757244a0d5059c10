/* darwin/seatbelt_apply.h -- put the calling process under a Seatbelt
 * profile (darwin/seatbelt_apply.c). */
#ifndef SBX_SEATBELT_APPLY_H
#define SBX_SEATBELT_APPLY_H

#include <stddef.h>

/* Compile the SBPL text `profile` and apply it to the calling process; its
 * children inherit it.  Returns 0, or an errno (EINVAL when the profile is
 * refused without one) with libsandbox's message in msg (cap bytes,
 * NUL-terminated, possibly truncated).  Allocates: never call it between
 * fork and exec. */
int sbx_seatbelt_apply(const char *profile, char *msg, size_t cap);

#endif /* SBX_SEATBELT_APPLY_H */
