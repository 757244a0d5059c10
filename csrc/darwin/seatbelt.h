/* darwin/seatbelt.h -- the macOS Seatbelt (SBPL) profile builder
 * (darwin/seatbelt.c).
 *
 * Plain C11, no Python, no platform code: it builds and is unit-tested on
 * every OS (tests/c/test_seatbelt.c), and the darwin spawn path applies its
 * output with sandbox_init (darwin/seatbelt_apply.c).  Both functions run in the
 * parent, before fork; neither allocates.
 *
 * Paths are canonicalised by sbx_seatbelt_canonical() first (Seatbelt
 * matches the real path of a vnode, so a symlink or `/tmp` in a rule would
 * never match), then rendered.  Rendering is deterministic: every list is
 * sorted (bytewise) and de-duplicated, so a profile compares byte for byte.
 * docs/seatbelt.md says what the profile allows and denies, and its limits.
 */
#ifndef SBX_SEATBELT_H
#define SBX_SEATBELT_H

#include <stddef.h>

enum sbx_seatbelt_net {
    SBX_SEATBELT_NET_ALLOW = 0, /* every network operation but Unix sockets' */
    SBX_SEATBELT_NET_DENY,      /* none */
    SBX_SEATBELT_NET_PROXY      /* only loopback to proxy_ports */
};

/* What a sandbox may touch.  Every path must be absolute; pass the output of
 * sbx_seatbelt_canonical().  The renderer applies the `/tmp`, `/var`,
 * `/etc` -> `/private/...` rule itself (sbx_seatbelt_private_prefix) and
 * drops trailing slashes, but resolves nothing. */
struct sbx_seatbelt_policy {
    const char *workspace; /* read, written, its Unix sockets reachable; NULL: none */

    /* Where sandboxes' private workspaces are made (the caller's temp
     * dir): every entry below it named like one (sbxlimit-<id>-...) but
     * `workspace` is neither read nor written, whatever writable_roots
     * say.  NULL: no such rule. */
    const char *workspaces_root;
    const char *const *writable_roots;
    size_t n_writable_roots;
    const char *const *deny_read; /* applied after the read allows */
    size_t n_deny_read;
    const char *const *deny_write; /* applied after every write allow */
    size_t n_deny_write;

    /* protect_dotfiles: writes denied, after the allows, to every
     * `.git/hooks` and `.git/config` (also under .git/modules/ and
     * .git/worktrees/) and to each path of `protected` (the caller lists
     * HOME's dotfiles both as links and as their targets, and the git
     * directories it found). */
    int protect_dotfiles;
    const char *const *protected_paths;
    size_t n_protected_paths;

    /* The terminal devices on the sandbox's stdio: read, written and
     * ioctl'd (never TIOCSTI).  Every other terminal but the ptys the
     * sandbox opens is out of reach. */
    const char *const *ttys;
    size_t n_ttys;

    /* Unix sockets the sandbox may connect to besides the system's
     * logging (and, with network allowed, name-resolution) sockets and
     * those in its workspace; every other connect is refused in every
     * network mode. */
    const char *const *unix_sockets;
    size_t n_unix_sockets;

    enum sbx_seatbelt_net network;
    const int *proxy_ports; /* 1..65535, any order, duplicates allowed */
    size_t n_proxy_ports;   /* >= 1 with SBX_SEATBELT_NET_PROXY, else 0 */
};

/* Render the profile into buf (cap bytes, NUL-terminated).  needed and
 * err_path may be NULL.
 *   0       done; *needed = bytes used, the NUL included.
 *   ENOSPC  cap is too small: *needed = the size to retry with; buf holds
 *           "" (when cap > 0), never a partial profile.  cap 0 with buf
 *           NULL asks for the size.
 *   EINVAL  an input is invalid: *err_path = the offending input string (a
 *           path that is empty, relative, or holds a control character
 *           other than tab and newline), or NULL for a NULL path, a bad
 *           network mode, a port out of range, or proxy without ports.
 *           Inputs are checked in field order, then array order, whatever
 *           cap is.  (A C string cannot hold a NUL: the caller rejects
 *           embedded NULs before it gets here.)
 * Strings become SBPL string literals with `\\`, `\"`, `\n` and `\t`
 * escaped.  No input string is ever placed inside a regex. */
int sbx_seatbelt_render(const struct sbx_seatbelt_policy *p, char *buf, size_t cap, size_t *needed,
                        const char **err_path);

/* Canonical form of the absolute path `in` as Seatbelt will see it: the
 * longest existing prefix resolved with realpath(3) (symlinks, `.`, `..`),
 * the rest appended with `.` and empty components dropped and `..` applied,
 * then `/tmp`, `/var`, `/etc` (and below) mapped to `/private/...` -- on
 * macOS these are symlinks into /private; the rule is applied here too so
 * that the result is the same whether or not the host has them.
 * Returns 0, EINVAL (NULL, empty or relative), ENAMETOOLONG (does not fit
 * PATH_MAX or cap), or the errno of realpath("/"). */
int sbx_seatbelt_canonical(const char *in, char *out, size_t cap);

/* "/private" when path is `/tmp`, `/var` or `/etc` or lies below one of
 * them, else "".  The mapping both functions above apply. */
const char *sbx_seatbelt_private_prefix(const char *path);

#endif /* SBX_SEATBELT_H */
