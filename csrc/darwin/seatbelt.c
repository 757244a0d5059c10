/* seatbelt.c -- render a Policy as a macOS Seatbelt (SBPL) profile.
 *
 * Parent side, before fork; plain C11 with no platform code, so it builds and
 * is unit-tested on every OS (tests/c/test_seatbelt.c) and cross-compiled for
 * macOS in the test suite.  The darwin spawn path runs the result as
 * `/usr/bin/sandbox-exec -p PROFILE -- target args`.
 *
 * SBPL evaluates the rules that match an operation and the LAST one wins, so
 * the profile is laid out broad to narrow: (deny default), the allows, then
 * every deny that cuts into an allow (deny_read, deny_write, dotfiles).
 *
 * Nothing here allocates: lists are emitted in sorted order by repeated
 * selection (n is small), and output goes through a writer that keeps
 * counting past the end of the caller's buffer so that one pass yields both
 * the profile and the size it needs.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../seatbelt.h"

/* ---- the /private mapping ------------------------------------------------ */

/* On macOS /tmp, /var and /etc are symlinks into /private, and Seatbelt
 * matches the resolved path: a rule naming /tmp would never match. */
static const char *const private_roots[] = {"/tmp", "/var", "/etc"};

const char *sbx_seatbelt_private_prefix(const char *path)
{
    size_t i;

    for (i = 0; i < sizeof private_roots / sizeof private_roots[0]; i++) {
        size_t n = strlen(private_roots[i]);

        if (strncmp(path, private_roots[i], n) == 0 && (path[n] == '\0' || path[n] == '/'))
            return "/private";
    }
    return "";
}

/* ---- the writer ------------------------------------------------------------ */

struct out {
    char *buf;
    size_t cap;
    size_t len; /* bytes produced so far, including those that did not fit */
};

static void out_n(struct out *o, const char *s, size_t n)
{
    if (o->len < o->cap) {
        size_t room = o->cap - o->len;

        memcpy(o->buf + o->len, s, n < room ? n : room);
    }
    o->len += n;
}

static void out_s(struct out *o, const char *s)
{
    out_n(o, s, strlen(s));
}

static void out_port(struct out *o, int port)
{
    char digits[8];
    size_t i = sizeof digits;

    do {
        digits[--i] = (char)('0' + port % 10);
        port /= 10;
    } while (port > 0);
    out_n(o, digits + i, sizeof digits - i);
}

/* Escape s[0..n) for the inside of an SBPL string literal.  The input was
 * checked by check_path(): no control characters but tab and newline. */
static void out_escaped(struct out *o, const char *s, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        switch (s[i]) {
        case '\\':
            out_s(o, "\\\\");
            break;
        case '"':
            out_s(o, "\\\"");
            break;
        case '\n':
            out_s(o, "\\n");
            break;
        case '\t':
            out_s(o, "\\t");
            break;
        default:
            out_n(o, s + i, 1);
        }
    }
}

/* ---- paths as the profile names them ------------------------------------- */

/* A path as rendered: pre ("/private" or "") followed by s[0..len), trailing
 * slashes dropped.  A view, so that sorting and mapping need no copies. */
struct vpath {
    const char *pre;
    size_t pre_len;
    const char *s;
    size_t len;
};

static struct vpath vpath_of(const char *s)
{
    struct vpath v;

    v.pre = sbx_seatbelt_private_prefix(s);
    v.pre_len = strlen(v.pre);
    v.s = s;
    v.len = strlen(s);
    while (v.len > 1 && s[v.len - 1] == '/')
        v.len--;
    return v;
}

static unsigned char vpath_at(const struct vpath *v, size_t i)
{
    return (unsigned char)(i < v->pre_len ? v->pre[i] : v->s[i - v->pre_len]);
}

/* Bytewise order of the rendered forms (what `sort` with LC_ALL=C gives). */
static int vpath_cmp(const struct vpath *a, const struct vpath *b)
{
    size_t na = a->pre_len + a->len, nb = b->pre_len + b->len, i;

    for (i = 0; i < na && i < nb; i++) {
        unsigned char ca = vpath_at(a, i), cb = vpath_at(b, i);

        if (ca != cb)
            return ca < cb ? -1 : 1;
    }
    return na < nb ? -1 : na > nb;
}

/* The rendered path as an SBPL string literal. */
static void out_vpath(struct out *o, const struct vpath *v)
{
    out_s(o, "\"");
    out_escaped(o, v->pre, v->pre_len);
    out_escaped(o, v->s, v->len);
    out_s(o, "\"");
}

/* Up to two arrays of paths rendered as one sorted, de-duplicated list. */
struct pset {
    const char *const *v[2];
    size_t n[2];
};

/* Emit `comment` and then `(head (filter "p") ...)` with one filter per path
 * of the set, in sorted order, each once.  An empty set emits nothing: a
 * rule without filters would apply to every path. */
static void out_rule(struct out *o, const char *comment, const char *head, const char *filter,
                     const struct pset *set)
{
    struct vpath last, best;
    int have_last = 0, have_best;
    size_t k, i;

    if (set->n[0] + set->n[1] == 0)
        return;
    out_s(o, comment);
    out_s(o, head);
    for (;;) {
        have_best = 0;
        for (k = 0; k < 2; k++) {
            for (i = 0; i < set->n[k]; i++) {
                struct vpath x = vpath_of(set->v[k][i]);

                if (have_last && vpath_cmp(&x, &last) <= 0)
                    continue;
                if (!have_best || vpath_cmp(&x, &best) < 0) {
                    best = x;
                    have_best = 1;
                }
            }
        }
        if (!have_best)
            break;
        out_s(o, "\n    (");
        out_s(o, filter);
        out_s(o, " ");
        out_vpath(o, &best);
        out_s(o, ")");
        last = best;
        have_last = 1;
    }
    out_s(o, ")\n");
}

/* ---- validation -------------------------------------------------------------- */

/* 0, or EINVAL with *err = s (NULL for a NULL path). */
static int check_path(const char *s, const char **err)
{
    const unsigned char *c;

    *err = s;
    if (s == NULL || s[0] != '/')
        return EINVAL;
    for (c = (const unsigned char *)s; *c; c++)
        if ((*c < 0x20 && *c != '\t' && *c != '\n') || *c == 0x7f)
            return EINVAL;
    *err = NULL;
    return 0;
}

static int check_paths(const char *const *v, size_t n, const char **err)
{
    size_t i;
    int rc;

    if (n > 0 && v == NULL) {
        *err = NULL;
        return EINVAL;
    }
    for (i = 0; i < n; i++)
        if ((rc = check_path(v[i], err)) != 0)
            return rc;
    return 0;
}

static int check_policy(const struct sbx_seatbelt_policy *p, const char **err)
{
    size_t i;
    int rc;

    *err = NULL;
    if (p->workspace != NULL && (rc = check_path(p->workspace, err)) != 0)
        return rc;
    if ((rc = check_paths(p->temp_dirs, p->n_temp_dirs, err)) != 0 ||
        (rc = check_paths(p->writable_roots, p->n_writable_roots, err)) != 0 ||
        (rc = check_paths(p->deny_read, p->n_deny_read, err)) != 0 ||
        (rc = check_paths(p->deny_write, p->n_deny_write, err)) != 0)
        return rc;
    if (p->protect_dotfiles && p->home != NULL && p->home[0] != '\0' &&
        (rc = check_path(p->home, err)) != 0)
        return rc;
    switch (p->network) {
    case SBX_SEATBELT_NET_ALLOW:
    case SBX_SEATBELT_NET_DENY:
        return p->n_proxy_ports == 0 ? 0 : EINVAL;
    case SBX_SEATBELT_NET_PROXY:
        if (p->n_proxy_ports == 0 || p->proxy_ports == NULL)
            return EINVAL;
        for (i = 0; i < p->n_proxy_ports; i++)
            if (p->proxy_ports[i] < 1 || p->proxy_ports[i] > 65535)
                return EINVAL;
        return 0;
    }
    return EINVAL;
}

/* ---- the profile ---------------------------------------------------------------- */

/* Processes, system information, IPC and terminals: what an ordinary
 * command-line program (a shell, python, node, a compiler, git) needs, and
 * not more.  Each rule says why. */
static const char profile_base[] =
    "(version 1)\n"
    "; Generated by sbxlimit.  SBPL applies the last rule that matches, so\n"
    "; every deny that narrows an allow comes after it.\n"
    "\n"
    "; Nothing is allowed unless a rule below allows it.\n"
    "(deny default)\n"
    "\n"
    "; Run programs and fork: children inherit this profile.\n"
    "(allow process-exec)\n"
    "(allow process-fork)\n"
    "; Signal and inspect processes of this sandbox only, not the user's others.\n"
    "(allow signal (target same-sandbox))\n"
    "(allow process-info* (target same-sandbox))\n"
    "\n"
    "; System information (CPU count, page size, OS version): read-only.\n"
    "(allow sysctl-read)\n"
    "; The JVM reads the CPU type through a sysctl the kernel counts as a write.\n"
    "(allow sysctl-write (sysctl-name \"kern.grade_cputype\"))\n"
    "; host_processor_info() and friends (libuv's os.cpus()).\n"
    "(allow mach-host*)\n"
    "; System libraries read preferences (CFPreferences).\n"
    "(allow user-preference-read)\n"
    "\n"
    "; System services, by name: user and group lookups, the per-user temp dir,\n"
    "; preferences, logging, notifications, power state.  No wildcard: some\n"
    "; services start programs outside the sandbox (LaunchServices).\n"
    "(allow mach-lookup\n"
    "    (global-name \"com.apple.PowerManagement.control\")\n"
    "    (global-name \"com.apple.bsd.dirhelper\")\n"
    "    (global-name \"com.apple.cfprefsd.agent\")\n"
    "    (global-name \"com.apple.cfprefsd.daemon\")\n"
    "    (global-name \"com.apple.logd\")\n"
    "    (global-name \"com.apple.system.logger\")\n"
    "    (global-name \"com.apple.system.notification_center\")\n"
    "    (global-name \"com.apple.system.opendirectoryd.libinfo\")\n"
    "    (global-name \"com.apple.system.opendirectoryd.membership\"))\n"
    "\n"
    "; POSIX semaphores and shared memory (Python's multiprocessing).\n"
    "(allow ipc-posix-sem)\n"
    "(allow ipc-posix-shm)\n"
    "\n"
    "; IOKit: power-management queries and registry properties only.\n"
    "(allow iokit-open (iokit-registry-entry-class \"RootDomainUserClient\"))\n"
    "(allow iokit-get-properties)\n"
    "\n"
    "; Terminals: openpty(), and the ioctls of job control, raw mode and\n"
    "; window size on the controlling and pseudo terminals.\n"
    "(allow pseudo-tty)\n"
    "(allow file-ioctl\n"
    "    (literal \"/dev/ptmx\")\n"
    "    (literal \"/dev/tty\")\n"
    "    (regex #\"^/dev/ttys[0-9]+$\"))\n"
    "\n"
    "; Files: read anything (system libraries, toolchains, the caller's\n"
    "; files) except deny_read, denied just below; map any readable file as\n"
    "; code (dyld loads dylibs that are not in the shared cache this way).\n"
    "(allow file-read*)\n"
    "(allow file-map-executable)\n";

/* Always writable: the system temp dirs.  /private/var/folders holds every
 * user's confstr(_CS_DARWIN_USER_TEMP_DIR), the default TMPDIR. */
static const char *const fixed_temp_dirs[] = {"/private/tmp", "/private/var/folders"};

/* The device nodes ordinary programs write to: bit buckets, the controlling
 * and pseudo terminals, and /dev/fd/N (bash's process substitution). */
static const char profile_dev_write[] =
    "; Device nodes programs write to: bit buckets, terminals, /dev/fd/N.\n"
    "(allow file-write*\n"
    "    (literal \"/dev/null\")\n"
    "    (literal \"/dev/zero\")\n"
    "    (literal \"/dev/tty\")\n"
    "    (literal \"/dev/ptmx\")\n"
    "    (regex #\"^/dev/ttys[0-9]+$\")\n"
    "    (subpath \"/dev/fd\"))\n";

/* Files that shells and git run code from.  A write there runs later,
 * outside the sandbox, the next time the user opens a shell or commits. */
static const char *const dotfiles[] = {".bashrc",  ".bash_profile", ".zshrc", ".zprofile",
                                       ".profile", ".gitconfig",    ".ssh"};

/* Any repository's .git/hooks and .git/config, at any depth (a submodule's
 * under .git/modules/NAME, a worktree's config.worktree under
 * .git/worktrees/NAME): config can name hooks, filters and an fsmonitor.
 * "/\.git/" anchors .git as a whole component; no caller string is ever
 * placed in a regex. */
static const char git_hooks_regex[] =
    "    (regex #\"/\\.git/((modules|worktrees)/.+/)?(hooks(/|$)|config(\\.worktree)?$)\")";

/* network="allow": name resolution (configd's DNS configuration, the
 * DNS-SD daemon) and TLS certificate checks (trustd) are mach services. */
static const char profile_net_allow[] =
    "; Network: unrestricted (network=\"allow\"), with the services that\n"
    "; resolve names and check TLS certificates.\n"
    "(allow network*)\n"
    "(allow mach-lookup\n"
    "    (global-name \"com.apple.SystemConfiguration.DNSConfiguration\")\n"
    "    (global-name \"com.apple.SystemConfiguration.configd\")\n"
    "    (global-name \"com.apple.dnssd.service\")\n"
    "    (global-name \"com.apple.trustd\")\n"
    "    (global-name \"com.apple.trustd.agent\"))\n";

static const char profile_net_deny[] =
    "; Network: none (network=\"deny\").  (deny default) already denies every\n"
    "; network operation, Unix-domain sockets included.\n";

/* network="proxy": the proxy resolves names; the client still checks the
 * certificates of the TLS sessions it tunnels through the proxy. */
static const char profile_net_proxy_head[] =
    "; Network: loopback to the proxy ports only (network=\"proxy\"); the rest\n"
    "; stays denied by (deny default).  Names are resolved by the proxy.\n"
    "(allow network-outbound";
static const char profile_net_proxy_tail[] =
    ")\n"
    "; TLS certificate checks of the sessions tunnelled through the proxy.\n"
    "(allow mach-lookup\n"
    "    (global-name \"com.apple.trustd\")\n"
    "    (global-name \"com.apple.trustd.agent\"))\n";

static void out_dotfiles(struct out *o, const struct sbx_seatbelt_policy *p)
{
    size_t i;

    out_s(o, "\n; Dotfiles: shells and git run code from these later, outside the sandbox.\n"
             "(deny file-write*");
    if (p->home != NULL && p->home[0] != '\0') {
        struct vpath home = vpath_of(p->home);
        /* "/" as home gives "/.bashrc", not "//.bashrc". */
        int root = home.pre_len + home.len == 1;

        for (i = 0; i < sizeof dotfiles / sizeof dotfiles[0]; i++) {
            out_s(o, "\n    (subpath \"");
            out_escaped(o, home.pre, home.pre_len);
            out_escaped(o, home.s, root ? 0 : home.len);
            out_s(o, "/");
            out_s(o, dotfiles[i]);
            out_s(o, "\")");
        }
    }
    out_s(o, "\n");
    out_s(o, git_hooks_regex);
    out_s(o, ")\n");
}

static void out_proxy(struct out *o, const struct sbx_seatbelt_policy *p)
{
    int last = 0;
    size_t i;

    out_s(o, profile_net_proxy_head);
    for (;;) {
        int best = 0;

        /* Ascending and de-duplicated, by selection. */
        for (i = 0; i < p->n_proxy_ports; i++)
            if (p->proxy_ports[i] > last && (best == 0 || p->proxy_ports[i] < best))
                best = p->proxy_ports[i];
        if (best == 0)
            break;
        out_s(o, "\n    (remote ip \"localhost:");
        out_port(o, best);
        out_s(o, "\")");
        last = best;
    }
    out_s(o, profile_net_proxy_tail);
}

static void render(struct out *o, const struct sbx_seatbelt_policy *p)
{
    struct pset set;
    const char *workspace[1];

    out_s(o, profile_base);

    memset(&set, 0, sizeof set);
    set.v[0] = p->deny_read;
    set.n[0] = p->n_deny_read;
    out_rule(o, "; deny_read: after the read allow, so that it wins.\n", "(deny file-read*",
             "subpath", &set);

    out_s(o, "\n; Files: write only the workspace, the temp dirs, writable_roots and the\n"
             "; device nodes below; every other write falls to (deny default).\n");
    memset(&set, 0, sizeof set);
    workspace[0] = p->workspace;
    set.v[0] = workspace;
    set.n[0] = p->workspace != NULL;
    out_rule(o, "; The workspace.\n", "(allow file-write*", "subpath", &set);

    memset(&set, 0, sizeof set);
    set.v[0] = fixed_temp_dirs;
    set.n[0] = sizeof fixed_temp_dirs / sizeof fixed_temp_dirs[0];
    set.v[1] = p->temp_dirs;
    set.n[1] = p->n_temp_dirs;
    out_rule(o,
             "; Temp dirs: /private/tmp, /private/var/folders (home of every\n"
             "; per-user TMPDIR), and this TMPDIR.\n",
             "(allow file-write*", "subpath", &set);

    memset(&set, 0, sizeof set);
    set.v[0] = p->writable_roots;
    set.n[0] = p->n_writable_roots;
    out_rule(o, "; writable_roots.\n", "(allow file-write*", "subpath", &set);

    out_s(o, profile_dev_write);

    /* deny_read joins deny_write: a file the sandbox may not read must not
     * be renamed (a write) to a path it may read. */
    memset(&set, 0, sizeof set);
    set.v[0] = p->deny_write;
    set.n[0] = p->n_deny_write;
    set.v[1] = p->deny_read;
    set.n[1] = p->n_deny_read;
    out_rule(o,
             "\n; deny_write and deny_read (no renaming an unreadable file to a readable\n"
             "; path): after every write allow, so that they win.\n",
             "(deny file-write*", "subpath", &set);

    if (p->protect_dotfiles)
        out_dotfiles(o, p);

    out_s(o, "\n");
    switch (p->network) {
    case SBX_SEATBELT_NET_ALLOW:
        out_s(o, profile_net_allow);
        break;
    case SBX_SEATBELT_NET_DENY:
        out_s(o, profile_net_deny);
        break;
    case SBX_SEATBELT_NET_PROXY:
        out_proxy(o, p);
        break;
    }
}

int sbx_seatbelt_render(const struct sbx_seatbelt_policy *p, char *buf, size_t cap, size_t *needed,
                        const char **err_path)
{
    const char *bad = NULL;
    struct out o;
    int rc;

    if (err_path != NULL)
        *err_path = NULL;
    if (needed != NULL)
        *needed = 0;
    if (p == NULL || (buf == NULL && cap > 0))
        return EINVAL;
    if ((rc = check_policy(p, &bad)) != 0) {
        if (err_path != NULL)
            *err_path = bad;
        return rc;
    }
    o.buf = buf;
    o.cap = cap;
    o.len = 0;
    render(&o, p);
    if (needed != NULL)
        *needed = o.len + 1;
    if (o.len >= cap) {
        if (cap > 0)
            buf[0] = '\0';
        return ENOSPC;
    }
    buf[o.len] = '\0';
    return 0;
}

/* ---- canonical paths ------------------------------------------------------------ */

/* Append "/" and s[0..n) to dst (a PATH_MAX buffer holding a path). */
static int path_push(char *dst, const char *s, size_t n)
{
    size_t len = strlen(dst);

    if (len == 1 && dst[0] == '/')
        len = 0; /* "/" + "x" is "/x" */
    if (len + 1 + n >= PATH_MAX)
        return ENAMETOOLONG;
    dst[len] = '/';
    memcpy(dst + len + 1, s, n);
    dst[len + 1 + n] = '\0';
    return 0;
}

/* Drop the last component of dst; "/" stays "/". */
static void path_pop(char *dst)
{
    char *slash = strrchr(dst, '/');

    if (slash == dst)
        dst[1] = '\0';
    else if (slash != NULL)
        *slash = '\0';
}

int sbx_seatbelt_canonical(const char *in, char *out, size_t cap)
{
    char path[PATH_MAX], res[PATH_MAX];
    const char *pre;
    size_t plen, rlen;

    if (in == NULL || in[0] != '/')
        return EINVAL;
    if (strlen(in) >= sizeof path)
        return ENAMETOOLONG;
    strcpy(path, in);

    /* Each round resolves the longest existing prefix and appends the rest
     * lexically.  A ".." in the rest is applied lexically and the result
     * resolved again (what follows it may exist, as a symlink); every
     * round removes at least one "..", so this ends. */
    for (;;) {
        size_t cut = strlen(path);
        const char *c, *rest;
        int dotdot = 0, rc;

        for (;;) {
            char saved = path[cut];

            path[cut] = '\0';
            if (realpath(cut > 0 ? path : "/", res) != NULL) {
                path[cut] = saved;
                break;
            }
            path[cut] = saved;
            if (cut == 0)
                return errno;
            /* Not there (or not reachable): try the parent. */
            while (cut > 0 && path[cut - 1] == '/')
                cut--;
            while (cut > 0 && path[cut - 1] != '/')
                cut--;
            while (cut > 0 && path[cut - 1] == '/')
                cut--;
        }

        /* res is canonical; add the components of the rest. */
        rest = path + cut;
        for (c = rest; *c != '\0';) {
            size_t n;

            while (*c == '/')
                c++;
            n = strcspn(c, "/");
            if (n == 0 || (n == 1 && c[0] == '.')) {
                /* "" or ".": nothing */
            } else if (n == 2 && c[0] == '.' && c[1] == '.') {
                path_pop(res);
                dotdot = 1;
            } else if ((rc = path_push(res, c, n)) != 0) {
                return rc;
            }
            c += n;
        }
        if (!dotdot)
            break;
        strcpy(path, res);
    }

    pre = sbx_seatbelt_private_prefix(res);
    plen = strlen(pre);
    rlen = strlen(res);
    if (plen + rlen + 1 > cap)
        return ENAMETOOLONG;
    memcpy(out, pre, plen);
    memcpy(out + plen, res, rlen + 1);
    return 0;
}
