/* darwin/seatbelt.c -- render a Policy as a macOS Seatbelt (SBPL) profile.
 *
 * Parent side, before fork; plain C11 with no platform code, so it builds and
 * is unit-tested on every OS (tests/c/test_seatbelt.c) and cross-compiled for
 * macOS in the test suite.  The darwin spawn path applies the result with
 * sandbox_init (darwin/seatbelt_apply.c), in the exec helper or in a forked
 * child.
 *
 * SBPL evaluates the rules that match an operation and the LAST one wins, so
 * the profile is laid out broad to narrow: (deny default), the allows, then
 * every deny that cuts into an allow (other sandboxes' workspaces, deny_read,
 * deny_write, dotfiles, Unix sockets, TIOCSTI last).
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

#include "seatbelt.h"

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

/* Up to three arrays of paths rendered as one sorted, de-duplicated list. */
#define PSET_MAX 3
struct pset {
    const char *const *v[PSET_MAX];
    size_t n[PSET_MAX];
};

static struct pset pset_of(const char *const *v0, size_t n0, const char *const *v1, size_t n1,
                           const char *const *v2, size_t n2)
{
    struct pset set;

    set.v[0] = v0;
    set.n[0] = n0;
    set.v[1] = v1;
    set.n[1] = n1;
    set.v[2] = v2;
    set.n[2] = n2;
    return set;
}

/* Emit one filter `(open"p"close)` per path of the set, each on its own
 * line, in sorted order, each once. */
static void out_filters(struct out *o, const char *open, const char *close, const struct pset *set)
{
    struct vpath last, best;
    int have_last = 0, have_best;
    size_t k, i;

    for (;;) {
        have_best = 0;
        for (k = 0; k < PSET_MAX; k++) {
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
            return;
        out_s(o, "\n    (");
        out_s(o, open);
        out_vpath(o, &best);
        out_s(o, close);
        out_s(o, ")");
        last = best;
        have_last = 1;
    }
}

/* Emit `comment` and then `(head (open"p"close) ...)` over the set; open is
 * e.g. "subpath " or "remote unix-socket (subpath " (close then ")").  An
 * empty set emits nothing: a rule without filters would apply to every
 * path. */
static void out_rule(struct out *o, const char *comment, const char *head, const char *open,
                     const char *close, const struct pset *set)
{
    size_t k, total = 0;

    for (k = 0; k < PSET_MAX; k++)
        total += set->n[k];
    if (total == 0)
        return;
    out_s(o, comment);
    out_s(o, head);
    out_filters(o, open, close, set);
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
    if (p->workspaces_root != NULL && (rc = check_path(p->workspaces_root, err)) != 0)
        return rc;
    if ((rc = check_paths(p->writable_roots, p->n_writable_roots, err)) != 0 ||
        (rc = check_paths(p->deny_read, p->n_deny_read, err)) != 0 ||
        (rc = check_paths(p->deny_write, p->n_deny_write, err)) != 0 ||
        (rc = check_paths(p->protected_paths, p->n_protected_paths, err)) != 0 ||
        (rc = check_paths(p->ttys, p->n_ttys, err)) != 0 ||
        (rc = check_paths(p->unix_sockets, p->n_unix_sockets, err)) != 0)
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

/* Processes, system information, IPC and devices: what an ordinary
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
    "; System information by name: hardware, OS release, limits, the process\n"
    "; table (ps) and routes.  Not every sysctl: kern.procargs2 returns the\n"
    "; arguments and environment of the user's other processes.\n"
    "(allow sysctl-read\n"
    "    (sysctl-name \"kern.argmax\")\n"
    "    (sysctl-name \"kern.boottime\")\n"
    "    (sysctl-name \"kern.hostname\")\n"
    "    (sysctl-name \"kern.maxfiles\")\n"
    "    (sysctl-name \"kern.maxfilesperproc\")\n"
    "    (sysctl-name \"kern.maxproc\")\n"
    "    (sysctl-name \"kern.ngroups\")\n"
    "    (sysctl-name \"kern.osproductversion\")\n"
    "    (sysctl-name \"kern.osrelease\")\n"
    "    (sysctl-name \"kern.ostype\")\n"
    "    (sysctl-name \"kern.osvariant_status\")\n"
    "    (sysctl-name \"kern.osversion\")\n"
    "    (sysctl-name \"kern.secure_kernel\")\n"
    "    (sysctl-name \"kern.tcsm_available\")\n"
    "    (sysctl-name \"kern.tcsm_enable\")\n"
    "    (sysctl-name \"kern.usrstack64\")\n"
    "    (sysctl-name \"kern.version\")\n"
    "    (sysctl-name \"security.mac.lockdown_mode_state\")\n"
    "    (sysctl-name \"sysctl.proc_cputype\")\n"
    "    (sysctl-name \"sysctl.proc_translated\")\n"
    "    (sysctl-name \"vm.loadavg\")\n"
    "    (sysctl-name-prefix \"hw.\")\n"
    "    (sysctl-name-prefix \"kern.proc.all\")\n"
    "    (sysctl-name-prefix \"kern.proc.pgrp.\")\n"
    "    (sysctl-name-prefix \"kern.proc.pid.\")\n"
    "    (sysctl-name-prefix \"machdep.cpu.\")\n"
    "    (sysctl-name-prefix \"net.routetable.\"))\n"
    "; The JVM reads the CPU type through a sysctl the kernel counts as a write;\n"
    "; V8 turns on its thread's side-channel mitigation.\n"
    "(allow sysctl-write\n"
    "    (sysctl-name \"kern.grade_cputype\")\n"
    "    (sysctl-name \"kern.tcsm_enable\"))\n"
    "; host_processor_info() and friends (libuv's os.cpus()).\n"
    "(allow mach-host*)\n"
    "; System libraries read preferences (CFPreferences).\n"
    "(allow user-preference-read)\n"
    "\n"
    "; System services, by name: file watchers (FSEvents), user and group\n"
    "; lookups, the per-user temp dir, preferences, logging, notifications,\n"
    "; power state.  No wildcard: some services start programs outside the\n"
    "; sandbox (LaunchServices).\n"
    "(allow mach-lookup\n"
    "    (global-name \"com.apple.FSEvents\")\n"
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
    "; Files: read anything (system libraries, toolchains, the caller's\n"
    "; files) but what the rules below take back; map any readable file as\n"
    "; code (dyld loads dylibs that are not in the shared cache this way).\n"
    "(allow file-read*)\n"
    "(allow file-map-executable)\n"
    "\n"
    "; Devices: bit buckets (tools ioctl them too), randomness, /dev/fd/N\n"
    "; (bash's process substitution), dyld's DTrace helper.  Never a raw disk:\n"
    "; a root program would read past deny_read.\n"
    "(allow file-write* file-ioctl\n"
    "    (literal \"/dev/dtracehelper\")\n"
    "    (literal \"/dev/null\")\n"
    "    (literal \"/dev/zero\"))\n"
    "(allow file-ioctl\n"
    "    (literal \"/dev/random\")\n"
    "    (literal \"/dev/urandom\"))\n"
    "(allow file-write* (subpath \"/dev/fd\"))\n"
    "(deny file-read* file-write* (regex #\"^/dev/r?disk\"))\n"
    "\n"
    "; Terminals: the user's others (another window's input and output) are\n"
    "; out of reach; openpty() and the ptys the sandbox opens (the kernel\n"
    "; grants it an extension for each), /dev/tty, and the terminals on its\n"
    "; stdio are allowed.  No TIOCSTI on any (the last rule of the profile).\n"
    "(deny file-read* file-write* file-ioctl\n"
    "    (regex #\"^/dev/(tty.+|pty.+|cu\\..+|console)$\"))\n"
    "(allow pseudo-tty)\n"
    "(allow file-read* file-write* file-ioctl\n"
    "    (literal \"/dev/ptmx\")\n"
    "    (literal \"/dev/tty\"))\n"
    "(allow file-read* file-write* file-ioctl\n"
    "    (require-all\n"
    "        (regex #\"^/dev/ttys[0-9]+$\")\n"
    "        (extension \"com.apple.sandbox.pty\")))\n";

/* Any repository's .git/hooks and .git/config, at any depth (a submodule's
 * under .git/modules/NAME, a worktree's config.worktree under
 * .git/worktrees/NAME): config can name hooks, filters and an fsmonitor.
 * "/\.git/" anchors .git as a whole component; no caller string is ever
 * placed in a regex. */
static const char git_hooks_regex[] =
    "    (regex #\"/\\.git/((modules|worktrees)/.+/)?(hooks(/|$)|config(\\.worktree)?$)\")";

/* Private workspaces are named sbxlimit-<pid hex>-<n>-<mkdtemp suffix>
 * (sbxlimit/_workspace.py); the regex names no caller string. */
static const char workspace_name_regex[] = "(regex #\"/sbxlimit-[0-9a-f]+-[0-9]+-[^/]+(/|$)\")";

/* network="allow": name resolution (configd's DNS configuration, the
 * DNS-SD daemon) and TLS certificate checks (trustd) are mach services. */
static const char profile_net_allow[] =
    "; Network: unrestricted (network=\"allow\") but Unix sockets (below), with\n"
    "; the services that resolve names and check TLS certificates.\n"
    "(allow network*)\n"
    "(allow mach-lookup\n"
    "    (global-name \"com.apple.SystemConfiguration.DNSConfiguration\")\n"
    "    (global-name \"com.apple.SystemConfiguration.configd\")\n"
    "    (global-name \"com.apple.dnssd.service\")\n"
    "    (global-name \"com.apple.trustd\")\n"
    "    (global-name \"com.apple.trustd.agent\"))\n";

static const char profile_net_deny[] =
    "; Network: none (network=\"deny\"): (deny default) denies every network\n"
    "; operation but the Unix sockets below.\n";

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

/* The system's sockets every sandbox may reach: logging (syslog(3)), and
 * with the network allowed, name resolution (dns_sd). */
static const char *const log_sockets[] = {"/private/var/run/syslog"};
static const char *const dns_sockets[] = {"/private/var/run/mDNSResponder"};

static const char profile_unix_head[] =
    "\n"
    "; Unix sockets, in every network mode: its own (in its workspace), the\n"
    "; system log's (and with the network allowed, name resolution's), and\n"
    "; unix_sockets; no other (the Docker socket, ssh-agent, tmux would run\n"
    "; code outside the sandbox).\n"
    "(allow system-socket (socket-domain AF_UNIX))\n";

static const char profile_tail[] =
    "\n"
    "; Last, so that no allow above can undo it: no typing into a terminal's\n"
    "; input, which its shell would run after the sandbox ends.\n"
    "(deny file-ioctl (ioctl-command TIOCSTI))\n";

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

static void out_unix_sockets(struct out *o, const struct sbx_seatbelt_policy *p,
                             const char *const *ws, size_t n_ws)
{
    struct pset set;
    int allow = p->network == SBX_SEATBELT_NET_ALLOW;

    out_s(o, profile_unix_head);
    set = pset_of(ws, n_ws, NULL, 0, NULL, 0);
    out_rule(o, "", "(allow network-bind", "local unix-socket (subpath ", ")", &set);
    if (allow) /* (allow network*) above allowed every connect */
        out_s(o, "(deny network-outbound (remote unix-socket))\n");
    set = pset_of(log_sockets, 1, allow ? dns_sockets : NULL, allow ? 1 : 0, ws, n_ws);
    out_rule(o, "", "(allow network-outbound", "remote unix-socket (subpath ", ")", &set);
    set = pset_of(p->unix_sockets, p->n_unix_sockets, NULL, 0, NULL, 0);
    out_rule(o, "; unix_sockets.\n", "(allow network-outbound", "remote unix-socket (subpath ", ")",
             &set);
}

static void render(struct out *o, const struct sbx_seatbelt_policy *p)
{
    const char *const *ws = &p->workspace;
    size_t n_ws = p->workspace != NULL;
    struct pset set;

    out_s(o, profile_base);

    set = pset_of(p->ttys, p->n_ttys, NULL, 0, NULL, 0);
    out_rule(o, "; The terminals on its stdio.\n", "(allow file-read* file-write* file-ioctl",
             "literal ", "", &set);

    out_s(o, "\n; Files: write only the workspace and writable_roots (hard links\n"
             "; included); every other write falls to (deny default).\n");
    set = pset_of(ws, n_ws, NULL, 0, NULL, 0);
    out_rule(o, "; The workspace.\n", "(allow file-write* file-link", "subpath ", "", &set);
    set = pset_of(p->writable_roots, p->n_writable_roots, NULL, 0, NULL, 0);
    out_rule(o, "; writable_roots.\n", "(allow file-write* file-link", "subpath ", "", &set);

    if (p->workspaces_root != NULL) {
        out_s(o, "\n; Other sandboxes' workspaces: neither read nor written, whatever\n"
                 "; writable_roots say; then its own again.\n"
                 "(deny file-read* file-write* file-link\n"
                 "    (require-all\n"
                 "        (subpath ");
        {
            struct vpath root = vpath_of(p->workspaces_root);

            out_vpath(o, &root);
        }
        out_s(o, ")\n        ");
        out_s(o, workspace_name_regex);
        out_s(o, "))\n");
        set = pset_of(ws, n_ws, NULL, 0, NULL, 0);
        out_rule(o, "", "(allow file-read* file-write* file-link", "subpath ", "", &set);
    }

    set = pset_of(p->deny_read, p->n_deny_read, NULL, 0, NULL, 0);
    out_rule(o, "\n; deny_read: after every read allow, so that it wins.\n", "(deny file-read*",
             "subpath ", "", &set);

    /* deny_read joins deny_write: a file the sandbox may not read must not
     * be renamed (a write) to a path it may read. */
    set = pset_of(p->deny_write, p->n_deny_write, p->deny_read, p->n_deny_read, NULL, 0);
    out_rule(o,
             "\n; deny_write and deny_read (no renaming an unreadable file to a readable\n"
             "; path): after every write allow, so that they win.\n",
             "(deny file-write* file-link", "subpath ", "", &set);

    if (p->protect_dotfiles) {
        out_s(o, "\n; Dotfiles (as links and as their targets) and git's hooks and config:\n"
                 "; shells and git run code from these later, outside the sandbox.\n"
                 "(deny file-write* file-link");
        set = pset_of(p->protected_paths, p->n_protected_paths, NULL, 0, NULL, 0);
        out_filters(o, "subpath ", "", &set);
        out_s(o, "\n");
        out_s(o, git_hooks_regex);
        out_s(o, ")\n");
    }

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
    out_unix_sockets(o, p, ws, n_ws);
    out_s(o, profile_tail);
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
