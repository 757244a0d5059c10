"""One sandbox's life: ``Sandbox``.

A ``Sandbox`` holds everything one sandbox owns (its plan, workspace,
cgroup, Seatbelt profile, namespace sockets, output pumps, quota admission,
supervision) and the order in which it gets and gives them back:

    configure()  the sandbox's arguments checked, then prepare(), then
               the quota's room taken
    prepare()  validate and plan, before anything exists (ConfigError,
               UnsupportedError)
    spawn()    acquire in order -- workspace, Seatbelt profile, output
               pumps, cgroup, Landlock ruleset, namespace sockets -- then
               make the child; on any failure the child, if made, is
               killed and reaped (``_end_child``) and ``_abort()`` gives
               back what was taken, in one place
    started()  register with the one supervisor thread (_monitor), or,
               for a caller that waits, leave a watch of timers alone to
               it for when the first is due (``Monitor.defer``)
    reap()     wait for the leader's exit without reaping it, end what it
               left (leader_exited), reap it, and keep the cgroup's final
               figures and the workspace's size (reaped), the cgroup
               handed to the supervisor for removal
    exited()   give the quota's room back, tell the audit
    outcome()  the one record the verdict and the final usage come from
    close_workspace()  remove the workspace (or keep it)

``sbxlimit.Popen`` is subprocess's class plus a Sandbox; the asyncio
``Process`` and ``ForkedSandbox`` drive the same object through it, and
``run()`` drives it directly where nothing of Popen is needed (_direct).
"""

from __future__ import annotations

import errno
import functools
import itertools
import math
import os
import pwd
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from . import (
    _core,
    _landlock,
    _namespaces,
    _place,
    _platform,
    _protected,
    _seatbelt,
    _sentinel,
    _workspace,
    audit,
)
from . import _spawn as _spawn_mod
from ._cgroup import Cgroup, CgroupStats, Site, discover, warn_explicit_site
from ._enforcement import Enforcement
from ._errors import ConfigError, UnsupportedError, setup_error
from ._evidence import Evidence, Usage, usage
from ._exit import run as run_exit_steps
from ._limits import Limits
from ._monitor import (
    Watch,
    get_monitor,
    kill_group_left,
    next_sample,
    settle_monitor,
    signal_tree,
)
from ._once import Once
from ._plan import Held, Plan, plan, warn_downgrades
from ._platform import CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID
from ._policy import Policy, environ_bytes, put_env
from ._pump import Pump
from ._seatbelt import Belt, proxy_env, terminal_devices
from ._spawn import child_error, resolve_executable
from ._termination import Outcome, Termination
from ._units import parse_seconds

__all__ = ["DEFAULT_INTERVAL", "NO_PLAN", "Sandbox"]

_ids = itertools.count(1)


def _new_id() -> str:
    """A sandbox id (and its cgroup's name, after "sbx-"), unique in this
    process; gc reads the owner's pid from it."""
    return f"{os.getpid():x}-{next(_ids)}"


DEFAULT_INTERVAL = 0.1
NO_PLAN = Plan()  # a plain Popen: no limits, no policy
# _find_protected's notes per (policy, plan, HOME), with the search they
# came from: reused while _protected.protected() returns that same search
# (plans are cached, so the same request gets the same Plan object).
_notes_kept: dict[tuple[object, ...], tuple[Plan, object, dict[str, Enforcement]]] = {}


def _readable(fd: int) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))


def _no_reaper(forked: bool, group: Any) -> str:
    """Why the program cannot run under a PID namespace's reaper, if so."""
    if forked:
        return "a forked callable cannot run under a reaper"
    if isinstance(group, int) and not isinstance(group, bool) and group > 0:
        return f"process_group={group} is a group outside any PID namespace"
    return ""


def _target_uid(user: Any) -> int:
    """The uid the program will run as (for RLIMIT_NPROC's caveat)."""
    if user is None:
        return os.geteuid()
    if isinstance(user, int):
        return user
    try:
        return pwd.getpwnam(user).pw_uid
    except (KeyError, TypeError):
        return os.geteuid()  # subprocess reports the bad user itself


def _env_list(env: Any) -> list[bytes]:
    out = []
    for k, v in env.items():
        k = os.fsencode(k)
        if b"=" in k:
            raise ValueError("illegal environment variable name")
        out.append(k + b"=" + os.fsencode(v))
    return out


# The environment a policy sandbox inherits: ours, filtered, with the
# proxy's variables.  The same spawn after spawn while os.environ stays as
# it was (one dict comparison, where filtering and encoding it again cost
# some 35 µs per spawn).  (policy, proxy port, with a TMPDIR) -> (our
# environment then, the filtered one, its list without TMPDIR's entry).
_inherited: dict[
    tuple[Policy, int, bool], tuple[dict[bytes, bytes], dict[bytes, bytes], list[bytes]]
] = {}


def _inherited_env(
    policy: Policy, port: int, tmpdir: str | None
) -> tuple[dict[bytes, bytes], list[bytes]]:
    """(the child's environment, as the list the core takes): ours under
    `policy`, TMPDIR set to `tmpdir` (the workspace's) when given.  The
    dict is for the PATH lookup only (shared: not to be changed)."""
    ours = getattr(os.environ, "_data", None)
    key = (policy, port, tmpdir is not None)
    hit = _inherited.get(key)  # (one dict operation each: atomic)
    if hit is None or type(ours) is not dict or hit[0] != ours:
        snapshot = environ_bytes()
        env = policy.filter_env(snapshot)
        for name, value in proxy_env(policy, port).items():
            put_env(env, name, value)
        if tmpdir is not None:
            env.pop(b"TMPDIR", None)  # the workspace's, appended last
        hit = (snapshot, env, _env_list(env))
        if type(ours) is dict:
            if len(_inherited) > 16:
                _inherited.clear()
            _inherited[key] = hit
    if tmpdir is None:
        return hit[1], hit[2]
    return hit[1], [*hit[2], b"TMPDIR=" + os.fsencode(tmpdir)]


@functools.lru_cache(maxsize=64)
def _noting(held: Held, notes: tuple[str, ...]) -> Enforcement:
    """`held` with `notes`: the same few per workdir, spawn after spawn
    (both immutable, so one object serves them all)."""
    return held.noting(*notes).enforcement


class Sandbox:
    """Everything one sandbox holds, from its plan to its evidence.

    Attributes are class-level defaults: a plain Popen (no limits, no
    policy) sets almost none of them on its spawn path."""

    plan: Plan = NO_PLAN
    limits: Limits | None = None
    policy: Policy | None = None
    target: Callable[[], Any] | None = None  # a forked callable (ForkedSandbox)
    program = "the program"  # program_name(), set when the child is made
    audit_key: str | None = None
    interval = DEFAULT_INTERVAL
    die_with_parent: bool | None = None
    warn_at: float | None = 0.9
    protected: tuple[str, ...] = ()  # what protect_dotfiles protects (_protected)
    place: _place.Place = None  # where its paths are resolved (_place), with a policy
    notes: dict[str, Enforcement] = {}  # noqa: RUF012  (replaced, never mutated) this run's enforced notes
    _id: str | None = None

    # Resources, in the order spawn() takes them.
    quota: Any = None  # a Quota admission, given back when the program exits
    workspace: str | None = None  # the private workspace, until close()
    workspace_dir: str | None = None  # its path, kept after close() for the record
    workspace_removed = False  # close() removed it
    owner_pid = 0  # the process that spawned it (a fork's copy owns nothing)
    belt: Belt | None = None  # macOS: the profile on its way in
    proxy: Any = None  # the filtering proxy serving it (_proxy.Served), allow_domains
    cgroup: Cgroup | None = None
    ws_fd = -1  # the size-capped tmpfs over the workspace (mount namespace): its root
    # A PID namespace's PID 1 (our child) writes the target's wait status
    # here: the status the caller sees, signals included.
    status_fd = -1

    # The running sandbox.
    pid = 0
    failed_status: int | None = None  # the wait status of a child that failed before exec
    dies_with_us = False  # PR_SET_PDEATHSIG was set
    leads_group = False  # the child leads a process group (or session) of its own
    how = 0  # _core.HOW_* bits of the clone that made the child
    start = 0.0
    end: float | None = None
    pgid = 0  # > 0 when the child leads that group and we may kill it
    tree_pgid = 0  # same, and what it leaves there is killed at exit
    kill_group = 0  # kill_tree() asked: kill the group at reap
    killed_by_caller = False
    # The leader was reaped, here or elsewhere (SIGCHLD ignored, a handler's
    # waitpid): its pid and group id are free for reuse, never signalled.
    gone = False
    # Held across the check of `gone` and the signals that follow it, and
    # by the reap (reap()): a reap never frees the ids mid-way.
    signal_lock: threading.Lock | None = None
    watch: Watch | None = None
    # started(defer=True) left the watch to the supervisor (Monitor.defer),
    # and whether leader_exited() came first (then none is made).
    deferred = False
    exit_seen = False
    returncode: int | None = None  # exited() was called with it
    wait_status = 0  # wait4's, at the reap
    status: int | None = None  # the one the caller sees, once reaped() is done
    flush: list[Pump] = []  # noqa: RUF012  (never mutated: replaced per instance)

    # What it left.
    rusage: Any = None
    cgroup_figures: Once[CgroupStats | None] | None = None  # its final figures (Cgroup.ended)
    # Its mount namespace, held until the reap (_namespaces.hold_mounts).
    mnt_hold: int = -1
    disk: int | None = None  # the workspace's size when the program ended
    disk_size: _workspace.FinalSize | None = None  # the same, measured when asked
    # run() closes the sandbox right after the reap: nobody can change the
    # workspace in between, so its size may be measured later (disk_size).
    # A Popen's caller may take the program's files out before close().
    closed_at_reap = False
    disk_full = False  # the tmpfs was past the limit (or full) when the program ended
    _outcome: Outcome | None = None

    @property
    def id(self) -> str:
        """A short id, unique in this process, for logs and audit events."""
        if self._id is None:
            self._id = _new_id()
        return self._id

    @property
    def enforced(self) -> dict[str, Enforcement]:
        return {**self.plan.enforced, **self.notes}

    # -- before anything exists --------------------------------------------

    def configure(
        self,
        limits: Any,
        policy: Any,
        *,
        user: Any,
        group: Any,
        cgroup_parent: Any,
        sample_interval: float | str,
        die_with_parent: Any,
        audit_key: Any,
        warn_at: Any,
        quota: Any,
    ) -> None:
        """Popen's and run()'s sandbox arguments, checked and planned before
        anything starts; the quota's room is taken last (given back by
        release_quota() if the spawn fails)."""
        if cgroup_parent is not None and not isinstance(cgroup_parent, str):
            raise ConfigError("cgroup_parent", cgroup_parent, "expected a path or 'none'")
        if warn_at != 0.9:
            if warn_at is not None and (
                isinstance(warn_at, bool)
                or not isinstance(warn_at, (int, float))
                or not 0 < warn_at <= 1
            ):
                raise ConfigError("warn_at", warn_at, "expected a fraction in (0, 1], or None")
            self.warn_at = warn_at
        if audit_key is not None:
            if not isinstance(audit_key, str):
                raise ConfigError("audit_key", audit_key, "expected a str")
            self.audit_key = audit_key
        if limits is not None or policy is not None:
            self.prepare(limits, policy, user, cgroup_parent, group)
        if sample_interval is not DEFAULT_INTERVAL:
            self.interval = parse_seconds("sample_interval", sample_interval)
        if die_with_parent is not None:
            if not isinstance(die_with_parent, bool):
                raise ConfigError("die_with_parent", die_with_parent, "expected a bool or None")
            if die_with_parent and not _platform.LINUX:
                raise ConfigError(
                    "die_with_parent",
                    True,
                    "only Linux has a parent-death signal; end the sandbox with kill_tree(), a "
                    "with block or wall_time",
                )
            self.die_with_parent = die_with_parent
        if quota is not None:
            from ._quota import Quota

            if not isinstance(quota, Quota):
                raise ConfigError("quota", quota, "expected a sbxlimit.Quota")
            self.quota = quota.admit(self.limits, key=audit_key)

    def prepare(
        self, limits: Any, policy: Any, user: Any, cgroup_parent: str | None, group: Any
    ) -> None:
        """Validate and plan; raises before any process starts."""
        self.limits = Limits.coerce(limits)
        self.policy = Policy.coerce(policy)
        site = discover(cgroup_parent)
        if not site.version and cgroup_parent not in (None, "none"):
            # Asked for by name: say so rather than fall back quietly.
            raise ConfigError("cgroup_parent", cgroup_parent, site.reason)
        if not site.version and site.explicit and (self.limits or self.policy):
            warn_explicit_site(site)
        p = self.plan = plan(
            self.limits,
            self.policy,
            uid=_target_uid(user),
            site=site,
            no_reaper=_no_reaper(self.target is not None, group),
        )
        if p.ns_flags & CLONE_NEWPID and self.target is not None:
            raise ConfigError(
                "Policy.isolate_pids",
                True,
                "a forked Python callable (ForkedSandbox, the pytest marker) cannot be PID 2 "
                "under a reaper: it needs a program to exec",
            )
        if p.ns_flags & CLONE_NEWPID and isinstance(group, int) and group > 0:
            raise ConfigError(
                "process_group",
                group,
                "with Policy(isolate_pids=True) the program cannot join a group outside its "
                "PID namespace",
            )
        if p.new_session and isinstance(group, int) and group > 0:
            raise ConfigError(
                "process_group",
                group,
                "a Policy sandbox gets a session of its own (no controlling terminal), so it "
                "cannot join a group of the caller's; pass Policy(terminal=True) to share it",
            )
        strict = self.policy is not None and self.policy.strict
        if strict and (p.downgrades or p.fallbacks):
            raise UnsupportedError({**p.fallbacks, **p.downgrades})
        if p.downgrades:
            warn_downgrades(p)
        if p.landlock or p.ro_view:
            # Once a spawn: where the caches of resolved paths are looked up.
            self.place = _place.here()
        self._find_protected()

    def _find_protected(self) -> None:
        """What protect_dotfiles protects for this sandbox, and where the
        mechanism that holds it falls short (a note in `enforced`)."""
        p, pol = self.plan, self.policy
        if pol is None or not pol.protect_dotfiles or not (p.landlock or p.ro_view or p.seatbelt):
            return
        # The private workspace is new and empty: the roots to search are
        # the caller's.
        roots = [pol.workdir] if pol.workdir else []
        home = os.path.expanduser("~")
        found = _protected.protected(
            home, [*roots, *pol.writable_roots], darwin=p.seatbelt, place=self.place
        )
        self.protected = found.paths
        # The notes of the same search for the same request: as they were.
        key = (pol, id(p), home)
        kept = _notes_kept.get(key)
        if kept is not None and kept[0] is p and kept[1] is found:
            self.notes = kept[2]
            return
        self.notes = self._protected_notes(found, home)
        if len(_notes_kept) > 64:
            _notes_kept.clear()
        _notes_kept[key] = (p, found, self.notes)

    def _protected_notes(self, found: _protected.Found, home: str) -> dict[str, Enforcement]:
        p, pol = self.plan, self.policy
        assert pol is not None
        notes = []
        if not found.complete:
            # The protection is bounded by definition (SPEC 3): say where
            # this search stopped.
            unreached = (
                # The profile's rule covers every .git/hooks and .git/config.
                "git directories that a .git file names, in repositories it did not reach"
                if p.seatbelt
                else "repositories it did not reach"
            )
            notes.append(
                f"this search stopped after {_protected.MAX_DIRS} directories: "
                f"{unreached} are not protected"
            )
        # Nothing can be bound over a name that does not exist (Seatbelt
        # rules name paths: it refuses those too).
        missing = [] if p.seatbelt else _protected.missing_dotfiles(home, pol.writable_roots)
        if missing:
            notes.append(f"not there, so a new one can be made: {', '.join(missing)}")
        links = _protected.replaceable_links(home, pol.writable_roots) if p.ro_view else []
        if links:
            notes.append(f"a link to a directory, so it can be replaced: {', '.join(links)}")
        held = p.held["protect_dotfiles"]
        if notes and isinstance(held, Held):
            return {"protect_dotfiles": _noting(held, tuple(notes))}
        return {}

    def release_quota(self) -> None:
        admission, self.quota = self.quota, None
        if admission is not None:
            admission.release()

    # -- the child -----------------------------------------------------------

    def spawn(
        self,
        args: list[Any],
        executable: Any,
        *,
        env: Any,
        cwd: Any,
        preexec_fn: Any,
        close_fds: bool,
        pass_fds: Sequence[int],
        stdio: tuple[int, int, int, int, int, int],
        devnull: int,
        restore_signals: bool,
        start_new_session: bool,
        process_group: int,
        gid: int | None,
        gids: Any,
        uid: int | None,
        umask: int,
        handed_over: Callable[[], None],
    ) -> int:
        """Acquire this sandbox's resources in order and make the child;
        returns its pid (0 in a forked callable's child).  `stdio`:
        subprocess's (p2cread, p2cwrite, c2pread, c2pwrite, errread,
        errwrite); `handed_over` is called when the core takes charge of
        closing the child's ends.  Whatever fails, everything taken so far
        is given back (``_abort``) before the exception propagates."""
        p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite = stdio
        p = self.plan
        self.owner_pid = os.getpid()
        implicit_cwd = cwd is None  # a cwd sbxlimit picks must not move "./prog"
        inherit = False  # our own environment, filtered (_inherited_env)
        if p.active and self.policy is not None:
            if env is None:
                inherit = True
            else:
                env = self.policy.filter_env(env)
                for name, value in proxy_env(self.policy, p.proxy_port).items():
                    put_env(env, name, value)
            if cwd is None and self.policy.workdir is not None:
                cwd = self.policy.workdir
        pumps: list[Pump] = []
        ns: _namespaces.Spawn | None = None
        # What subprocess's _close_pipe_fds would close; the core closes them
        # right after the child is made, on every path.
        close_after = [devnull]
        if p2cread != -1 and p2cwrite != -1 and p2cread != devnull:
            close_after.append(p2cread)
        if c2pwrite != -1 and c2pread != -1 and c2pwrite != devnull:
            close_after.append(c2pwrite)
        if errwrite != -1 and errread != -1 and errwrite != devnull:
            close_after.append(errwrite)
        ours = len(close_after)  # from here on: fds of our own making
        pid, failure = 0, None
        try:
            # First: a pooled cgroup gives the sandbox its id (and name).
            cg_dirfd = -1
            cg_procs: list[int] = []
            if p.site is not None:
                cg = self.cgroup = self._make_cgroup(p.site, p.cgroup_settings)
                if self.die_with_parent is False:
                    _sentinel.keep(cg.name)  # not ended if we are killed
                try:
                    cg_procs = cg.procs_fds()
                except OSError as e:
                    raise setup_error("cgroup:create", e.errno or errno.EIO, 0, e.filename) from e
                cg_dirfd = cg.dirfd
                close_after += cg_procs
            if p.workspace:
                ws = None if self.plan.keep_workspace else get_monitor().take_workspace(self.id)
                ws = self.workspace = self.workspace_dir = ws or _workspace.create(
                    self.id, keep=self.plan.keep_workspace
                )
                if self.die_with_parent is False:
                    _workspace.outlives(ws)  # left at our exit while it works there
                if cwd is None:
                    cwd = ws
                if not inherit:
                    env = environ_bytes() if env is None else dict(env)
                    put_env(env, "TMPDIR", os.path.join(ws, "tmp"))
            env_list = None
            if inherit:
                assert self.policy is not None
                tmpdir = os.path.join(self.workspace, "tmp") if self.workspace else None
                env, env_list = _inherited_env(self.policy, p.proxy_port, tmpdir)
            elif env is not None:
                env_list = _env_list(env)
            exe = os.fsencode(executable)
            exec_paths: tuple[bytes, ...] | None
            if self.target is not None:
                exec_paths = None  # fork only: the child runs the target
            elif b"/" in exe:
                if implicit_cwd and cwd is not None and not os.path.isabs(exe):
                    # subprocess would find it from the caller's directory.
                    exe = os.path.abspath(exe)
                exec_paths = (exe,)
            else:
                exec_paths = resolve_executable(
                    exe,
                    executable,
                    env,
                    child_decides=(cwd is not None or uid is not None or gid is not None),
                )

            if p.seatbelt:
                belt = self.belt = self._seatbelt_profile((p2cread, c2pwrite, errwrite))
                if exec_paths is not None:
                    exec_paths, args, belt_fds = belt.exec_through(
                        _seatbelt.HELPER, exec_paths, args
                    )
                    pass_fds = (*pass_fds, *belt_fds)

            if p.ns_flags:
                memory = self.limits.memory if self.limits is not None else None
                made: dict[int, int] = {}  # kind -> fd of one made ahead (_nspool)
                if not p.user_ns:
                    for kind in (CLONE_NEWNET, CLONE_NEWIPC):
                        if p.ns_flags & kind:
                            made[kind] = fd = get_monitor().take_ns(kind)
                            if fd >= 0:
                                close_after.append(fd)  # the child joined it: ours to close
                ns = _namespaces.Spawn(
                    p,
                    self.policy,
                    self.workspace,
                    uid,
                    gid,
                    memory,
                    self.protected,
                    made,
                    cwd=None if cwd is None else os.fspath(cwd),
                    place=self.place,
                )
                if ns.view_ns >= 0:
                    get_monitor().keep_views()

            pgid = process_group
            die = self.die_with_parent
            if die is None:  # default: sandboxes started from the main thread
                die = (
                    p.active
                    and _platform.LINUX
                    and threading.current_thread() is threading.main_thread()
                )
            pdeathsig = signal.SIGKILL if die else 0
            self.dies_with_us = bool(pdeathsig)
            child_out, child_err = c2pwrite, errwrite
            if p.active:
                if p.new_session and process_group <= 0:
                    # A session of its own: no controlling terminal to type
                    # into, and a group of its own (the tree we can end).
                    start_new_session, pgid = True, -1
                elif not start_new_session and process_group == -1:
                    pgid = 0  # lead a group of our own: the tree we can end
                if p.output is not None:
                    child_out, child_err = self._make_pumps(
                        pumps, close_after, c2pread, c2pwrite, errread, errwrite, devnull
                    )
            fail_step, fail_errno = _spawn_mod._fail_at or (0, 0)

            landlock_fd = -1
            if p.landlock:
                assert self.policy is not None
                where = self.workspace or self.policy.workdir
                handled, ll_rules = _landlock.rules(
                    self.policy,
                    where,
                    p.landlock,
                    self.protected,
                    view=p.ro_view,
                    fresh=self.workspace is not None,
                    place=self.place,
                )
                # Shared only if the child adds nothing to it: rules it adds
                # for its tmpfs would stay in the shared ruleset for good.
                own = self.workspace is not None or (ns is not None and ns.child_rules)
                try:
                    landlock_fd = _landlock.ruleset(
                        handled, ll_rules, p.landlock_net, reuse=not own
                    )
                except OSError as e:
                    raise setup_error("landlock:ruleset", e.errno or errno.EIO, 0) from e
                close_after.append(landlock_fd)
            if ns is not None and ns.child_end >= 0:
                close_after.append(ns.take_child_end())
            if ns is not None and ns.status_w >= 0:
                self.status_fd, status_w = ns.take_status_ends()
                close_after.append(status_w)
            self.start = time.monotonic()
            handed_over()  # the core closes the child's ends from here on
            ours = -1  # and ours (close_after): closed by the core in every case
            pid, failure, self.how, mnt_ns = _core.spawn(
                exec_paths,
                args,
                env_list,
                cwd,
                p2cread,
                child_out,
                child_err,
                close_fds,
                sorted(set(pass_fds)) if pass_fds else (),
                close_after,
                restore_signals and self.target is None,
                start_new_session,
                pgid,
                gids,
                -1 if gid is None else gid,
                -1 if uid is None else uid,
                umask,
                p.rlimits,
                pdeathsig,
                p.no_new_privs,
                p.drop_caps,
                p.caps_keep,
                p.seccomp_what,
                # Made with the cgroup, before this; a PID namespace hides it
                # (and there its number may be one of the sandbox's own).
                0 if p.ns_flags & CLONE_NEWPID else _sentinel.sentinel_pid() or 0,
                landlock_fd,
                ns.args if ns is not None else None,
                cg_dirfd,
                cg_procs,
                preexec_fn,
                fail_step,
                fail_errno,
            )
            if self.cgroup is not None:
                self.cgroup.spawned()
            if failure is None and pid > 0 and p.ns_flags & CLONE_NEWNS:
                self.mnt_hold = _namespaces.hold_mounts(pid, mnt_ns)
            if ns is not None and failure is None and pid != 0:
                if p.proxy_port:
                    self._serve_proxy(ns.receive_listener())
                got = ns.receive_fd()  # may be 0: the caller may have closed stdin
                self.ws_fd = -1 if got is None else got
            reason = None
            if failure is None and self.belt is not None and pid != 0:
                failure, reason = self._belt_started(pid)
            if failure is not None:
                step, err_no, detail, self.failed_status = failure
                raise child_error(
                    step, err_no, detail, executable=executable, cwd=cwd, reason=reason
                )
        except BaseException:
            try:
                if pid > 0 and failure is None:
                    # Made and running (what came after failed, or a
                    # signal's handler raised): nobody else knows it.
                    self._end_child(pid, start_new_session or pgid == 0)
            finally:
                # Our own fds in close_after that the core never took.
                self._abort(pumps, ns, close_after[ours:] if ours >= 0 else ())
                settle_monitor()  # the pools taken from are refilled all the same
            raise
        if ns is not None:
            ns.close()
        self._pumps = pumps
        self.leads_group = start_new_session or pgid == 0
        if pid == 0:  # only with a target: we are the forked child
            self.run_target(
                (p2cwrite, c2pread, errread), (p2cread != -1, child_out != -1, child_err != -1)
            )
        self.pid = pid
        self.signal_lock = threading.Lock()
        return pid

    def _make_cgroup(self, site: Site, settings: tuple[tuple[str, str, str], ...]) -> Cgroup:
        """One made ahead by the supervisor (the sandbox takes its name as
        its id), else made here."""
        if self._id is None:
            cg = get_monitor().take_cgroup(site, settings, _new_id)
            if cg is not None:
                self._id = cg.name.removeprefix("sbx-")
                return cg
        try:
            for _ in range(64):
                try:
                    return Cgroup.create(site, f"sbx-{self.id}", settings)
                except FileExistsError:
                    # Another process's, with our pid in another PID
                    # namespace (_mkdir_sandbox; it holds a few in a row):
                    # the sandbox takes another id.
                    self._id = None
            return Cgroup.create(site, f"sbx-{self.id}", settings)
        except OSError as e:
            raise setup_error("cgroup:create", e.errno or errno.EIO, 0, e.filename) from e

    def _end_child(self, pid: int, leads_group: bool) -> None:
        """SIGKILL to a child the spawn made but will not return (and to
        its group, its cgroup), then its reap."""
        signal_tree(pid, signal.SIGKILL, pid if leads_group else 0, self.cgroup)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    def _abort(self, pumps: list[Pump], ns: _namespaces.Spawn | None, fds: Sequence[int]) -> None:
        """Give back, in one place, everything a spawn that did not happen
        (or whose child failed before exec) took: pumps, our fds, the status
        pipe, the cgroup, the Seatbelt profile, the namespace sockets, the
        workspace."""
        for pump in pumps:
            pump.discard()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if self.status_fd >= 0:
            os.close(self.status_fd)
            self.status_fd = -1
        self.release_cgroup()
        self.close_belt()
        if ns is not None:
            ns.close()  # idempotent: the sockets of a spawn that did not happen
        self.stop_proxy()
        if self.workspace is not None:
            _workspace.remove(self.workspace)
            self.workspace = self.workspace_dir = None

    # -- the filtering proxy (allow_domains) ------------------------------------

    def _serve_proxy(self, fd: int | None) -> None:
        """Serve the listener the child made on its own loopback: from here
        on, the program's connections out are the proxy's to allow."""
        from . import _proxy

        if fd is None:  # it passed the step, so it sent one: a broken channel
            raise setup_error("ns:proxy", errno.EIO, self.plan.proxy_port)
        sock = socket.socket(fileno=fd)
        policy = self.policy
        assert policy is not None
        rules = _proxy.Rules.parse(policy.allow_domains, policy.deny_domains)
        limits = _proxy.ProxyLimits(connections=policy.proxy_connections, bytes=policy.proxy_bytes)
        self.proxy = _proxy.shared().serve(self.id, sock, rules, limits, self._net_event)

    def _net_event(self, ev: Any) -> None:
        if audit.active():
            audit.emit(
                ev.event,
                host=ev.host,
                port=ev.port,
                field="network",
                mechanism=f"proxy:{ev.protocol}",
                detail=ev.reason,
                observed=ev.bytes_up + ev.bytes_down,
                **self.audit_fields(),
            )

    def stop_proxy(self) -> None:
        """No more connections out: the program has ended (what it left
        running in its namespace must not go on using the proxy)."""
        if self.proxy is not None:
            self.proxy.close()

    def network_log(self) -> list[Any]:
        return self.proxy.events() if self.proxy is not None else []

    def run_target(
        self, parent_ends: tuple[int, ...], redirected: tuple[bool, bool, bool]
    ) -> NoReturn:
        """In a fork_only child, set up by the core: run the target and exit
        with its status, never returning into the caller's frames.  Streams
        the caller redirected are rebound to fds 0-2 at the Python level too
        (sys.stdout may be something else, e.g. a test runner's capture)."""
        code = 1
        try:
            # Other spawns' report pipes, copied by this fork: theirs to close.
            _seatbelt.close_others(self.belt)
            if self.belt is not None:  # macOS: the body runs under the profile, or not at all
                self.belt.apply_here()
            for fd in parent_ends:
                if fd > 2:
                    os.close(fd)
            if redirected[0]:
                sys.stdin = open(0, closefd=False)  # noqa: SIM115
            if redirected[1]:
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            if redirected[2]:
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            if self.plan.proxy_port and self.policy is not None:
                # No exec carries the environment here: the body's own
                # clients (urllib, requests) find the proxy through it.
                os.environ.update(proxy_env(self.policy, self.plan.proxy_port))
            assert self.target is not None
            result = self.target()
            code = result if isinstance(result, int) else 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            run_exit_steps()  # sandboxes the body started: no atexit runs after os._exit
            os._exit(code & 0xFF)

    # -- the Seatbelt profile (macOS) ----------------------------------------

    def _seatbelt_profile(self, stdio: tuple[int, int, int]) -> Belt:
        """The profile of this sandbox: its workspace named, the protected
        paths found for it, and the terminals on its stdio."""
        policy = self.policy
        assert policy is not None
        fds = [fd if fd != -1 else i for i, fd in enumerate(stdio)]
        profile = policy.seatbelt_profile(
            workspace=self.workspace or policy.workdir,
            ttys=terminal_devices(fds),
            protected=self.protected,
        )
        return Belt(profile)

    def _belt_started(self, pid: int) -> tuple[tuple[str, int, int, int] | None, str | None]:
        """Wait until the profile is in force; a refusal becomes the spawn's
        failure, with libsandbox's message (the child exits, reaped here)."""
        assert self.belt is not None
        got = self.belt.started()
        self.belt = None
        if got is None:
            return None, None
        step, err, message = got
        _, status = os.waitpid(pid, 0)
        return (step, err, 0, status), message or None

    def close_belt(self) -> None:
        belt, self.belt = self.belt, None
        if belt is not None:
            belt.close()

    # -- output pumps --------------------------------------------------------

    _pumps: list[Pump] = []  # noqa: RUF012  (replaced per instance)

    def _make_pumps(
        self,
        pumps: list[Pump],
        close_after: list[int],
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        devnull: int,
    ) -> tuple[int, int]:
        """Put a pump between the child and each capped stream; returns the
        fds the child writes to.  The pipes' write ends join close_after."""
        child_out = c2pwrite
        out = self._pump_for(c2pwrite, c2pread != -1, devnull, 1, "stdout")
        if out is not None:
            pumps.append(out[0])
            close_after.append(out[1])
            child_out = out[1]
        if (errwrite != -1 and errwrite == c2pwrite) or (c2pwrite == -1 and errwrite == 1):
            return child_out, child_out  # stderr=STDOUT: one stream
        child_err = errwrite
        err = self._pump_for(errwrite, errread != -1, devnull, 2, "stderr")
        if err is not None:
            pumps.append(err[0])
            close_after.append(err[1])
            child_err = err[1]
        return child_out, child_err

    def _pump_for(
        self, target: int, is_pipe: bool, devnull: int | None, inherited: int, stream: str
    ) -> tuple[Pump, int] | None:
        """A pump from a new pipe to the stream's destination; None when the
        stream goes to /dev/null (nothing to cap)."""
        if target != -1 and target == devnull:
            return None
        p = self.plan
        assert p.output is not None
        monitor = get_monitor()
        dst = os.dup(inherited if target == -1 else target)
        r = w = -1
        try:
            r, w = os.pipe()
            # The watch is attached once the pid is known.
            pump = Pump(
                monitor,
                None,
                r,
                dst,
                owned_dst=is_pipe,
                cap=p.output,
                truncate=p.truncate_output,
                stream=stream,
                warn_at=self.warn_at if audit.active() else None,
            )
        except BaseException:
            for fd in (dst, r, w):
                if fd >= 0:
                    os.close(fd)
            raise
        return pump, w

    # -- supervision ---------------------------------------------------------

    def started(self, pid: int, *, piped: bool, defer: bool = False) -> None:
        """The child exists: note what we may kill, and hand it to the
        supervisor where something must be watched.  `defer`: a watch of
        timers alone may be made late, by the supervisor, when the first
        of them is due (most programs have exited by then: no watch)."""
        try:
            self._started(pid, piped, defer)
        finally:
            # One wake-up for the pools taken from (spawn) and the watch.
            settle_monitor()

    def _started(self, pid: int, piped: bool, defer: bool) -> None:
        p = self.plan
        if p.active and audit.active():
            self.audit_spawn()
        if self.leads_group:
            self.pgid = pid
            if p.active:
                self.tree_pgid = pid
        pumps, self._pumps = self._pumps, []
        # The supervisor is needed for timers and samples, for pumps, and
        # to end leftovers at once when someone reads the output: a leftover
        # holding the pipe would otherwise keep communicate() waiting.
        quota = self.quota is not None
        if p.needs_monitor or pumps or (p.active and piped) or quota:
            due = self._first_due() if defer and not pumps and not piped and not quota else None
            if due is not None:
                self.deferred = True
                get_monitor().defer(self, due, self._hand_over)
            else:
                self._supervise(pid, pumps, piped or quota)
        elif self._warns() or (self.ws_fd >= 0 and self._warns_disk()):
            self._supervise(pid, pumps, piped)

    def _first_due(self) -> float | None:
        """When the supervisor would first look at a watch of timers
        alone (a deadline, samples of a tree without a cgroup), or None
        where it watches more (a cgroup's events, a workspace's size)."""
        p = self.plan
        if self.cgroup is not None or p.cg_ends or p.disk is not None or self.ws_fd >= 0:
            return None
        due = math.inf
        if p.wall_time is not None:
            due = self.start + p.wall_time
        if (
            p.watch_memory is not None
            or p.watch_pids is not None
            or p.watch_cpu_time is not None
            or self._warns()
        ):
            due = min(due, next_sample(self.start, self.interval))
        return None if due == math.inf else due  # (something else to watch: now)

    def _hand_over(self) -> None:
        """(The supervisor's thread, at the deferred watch's due time.)
        Against leader_exited: under the signal lock, either the watch is
        made before the leader's exit is handled (which unregisters it) or
        not at all."""
        lock = self.signal_lock
        assert lock is not None
        with lock:
            if self.exit_seen or self.gone:
                return
            try:
                self._supervise(self.pid, [], False)
            except BaseException:
                # Its limits would go unwatched: end it instead (fail closed;
                # the monitor logs why).
                signal_tree(self.pid, signal.SIGKILL, self.pgid, self.cgroup)
                raise
        settle_monitor()

    def _warn_memory(self) -> tuple[int, int, str] | None:
        if not self._warns():
            return None
        assert self.limits is not None and self.limits.memory is not None
        assert self.warn_at is not None
        n = self.limits.memory
        return (int(n * self.warn_at), n, self.plan.enforced.get("memory", ""))

    def _disk_watch(self) -> tuple[str | int, int] | None:
        """What the supervisor samples for disk: the workspace's path (the
        watchdog), or the tmpfs's fd (warnings only: the kernel holds it)."""
        p = self.plan
        if p.disk is None:
            return None
        if self.ws_fd >= 0:
            # The tmpfs holds a margin past the limit: sampled to end the
            # sandbox there (tolerated: to note that it was full).
            return (self.ws_fd, p.disk)
        path = self.disk_path()
        return (path, p.disk) if path else None

    def _warns_disk(self) -> bool:
        return self.warn_at is not None and audit.active()

    def _warns(self) -> bool:
        """A memory resource_warning is wanted: someone listens to audit
        events and there is a memory limit to warn about."""
        lim = self.limits
        return (
            self.warn_at is not None
            and lim is not None
            and lim.memory is not None
            and audit.active()
        )

    def _supervise(self, pid: int, pumps: list[Pump], piped: bool) -> None:
        p = self.plan
        monitor = get_monitor()
        cg = self.cgroup
        watch = self.watch = Watch(
            pid=pid,
            pgid=self.tree_pgid,
            start=self.start,
            wall_time=p.wall_time,
            memory=p.watch_memory,
            pids=p.watch_pids,
            grace=p.kill_grace,
            interval=self.interval,
            cgroup=cg,
            cg_ends=p.cg_ends if cg is not None else (),
            cpu_time=p.watch_cpu_time,
            reaper=bool(p.ns_flags & CLONE_NEWPID),
            warn_memory=self._warn_memory(),
            audit_fields=self.audit_fields() if audit.active() else None,
            disk=self._disk_watch(),
            disk_ends=not (p.disk_tmpfs and "disk" in p.tolerate),
        )
        for pump in pumps:
            pump.watch = watch
            monitor.add_pump(pump)
        # Output bound for our own pipe is drained by whoever reads it;
        # elsewhere (a file, the terminal, a foreign pipe) wait() also waits
        # for the pump to pass the last bytes on.
        self.flush = [pump for pump in pumps if pump.mode != "nonblock"]
        if watch.disk is not None and self.warn_at is not None and audit.active():
            watch.warn_disk = int(watch.disk[1] * self.warn_at)
        if self.quota is not None:
            # Room goes back when the program exits, reaped or not.
            watch.on_exit = self.release_quota
        timers = p.needs_monitor or watch.next_sample is not None
        monitor.register(watch, timers=timers, exit=piped or bool(pumps))

    # -- the end ---------------------------------------------------------------

    @property
    def reaps_carefully(self) -> bool:
        """Wait for the exit without reaping first (see reap())."""
        return (
            self.tree_pgid > 0
            or self.watch is not None
            or self.kill_group > 0
            or self.cgroup is not None
        )

    def reap(
        self,
        wait_flags: int,
        _waitid: Any = os.waitid,
        _wait4: Any = os.wait4,
        _P_PID: int = os.P_PID,
        _WNOWAIT: int = os.WEXITED | os.WNOWAIT,
        _WNOHANG: int = os.WNOHANG,
        _monotonic: Any = time.monotonic,
    ) -> tuple[int, int]:
        """Wait for the leader (`wait_flags`: 0 or WNOHANG) and reap it:
        (its pid, the wait status the caller sees), or (0, 0) while it runs.
        Callers serialize their reaps (Popen: its wait lock).

        A sandbox's leader is waited for *without* reaping first: while it
        is a zombie its process group id cannot be reused, so killing what
        it left behind in the group is safe.  Then wait4 reaps it, for the
        rusage."""
        pid = self.pid
        careful = self.reaps_carefully
        if careful:
            pinned = True
            try:
                info = _waitid(_P_PID, pid, _WNOWAIT | (wait_flags & _WNOHANG))
            except ChildProcessError:
                # Reaped elsewhere already (SIGCHLD ignored, a handler's
                # waitpid): no zombie pins its group id any more.
                info, pinned, self.gone = True, False, True
            if info is None:
                return (0, 0)
            self.leader_exited(_monotonic(), pinned=pinned)
        # The leader has exited (careful: seen above): its reap waits for
        # another thread's kill_tree() to send all its signals (see
        # signal_tree); otherwise, as in subprocess.
        lock = self.signal_lock if careful else None
        if lock is not None:
            lock.acquire()
        try:
            try:
                got, sts, rusage = _wait4(pid, wait_flags)
            except ChildProcessError:
                # SIGCHLD ignored or reaped elsewhere: status unknown (as in
                # subprocess), but the sandbox is over: clean up all the same.
                got, sts, rusage = pid, 0, None
            if got == pid:
                # Before the rest of the reap's work (a cgroup let go, a
                # workspace measured): from here on its pid and group may
                # be another's, and another thread's kill_tree() must not
                # signal them while this one still holds the wait lock.
                self.gone = True
                self.wait_status, self.rusage = sts, rusage
        finally:
            if lock is not None:
                lock.release()
        if got == pid:
            sts = self.reaped(sts, rusage, _monotonic())
        return (got, sts)

    def ours_to_signal(self) -> bool:
        """The program's pid and group are ours to signal: this process
        started it (a fork's copy owns nothing) and has not seen it reaped."""
        return not self.gone and self.owner_pid == os.getpid()

    def leader_exited(self, now: float, *, pinned: bool = True) -> None:
        """The leader exited, not yet reaped (its zombie pins its group id):
        end what it left behind.  Not `pinned`: reaped elsewhere already,
        so the group is signalled only while its id is still the
        sandbox's (_monitor.kill_group_left)."""
        if self.deferred and not get_monitor().take_back(self):
            # The supervisor is making the watch, or made it: wait for it.
            lock = self.signal_lock
            assert lock is not None
            with lock:
                self.exit_seen = True
        w = self.watch
        if w is not None:
            get_monitor().unregister(w)
            if w.exited_at is not None:
                now = min(now, w.exited_at)
        if self.end is None:
            self.end = now
        pgid = self.tree_pgid or self.kill_group
        if self.cgroup is not None:
            # End everything it left, wherever it went (v1: one read of a
            # task count when nothing is left, the common case).
            self.cgroup.kill(leader_gone=True)
        elif pgid > 0 and not pinned:
            kill_group_left(pgid)
        elif pgid > 0:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def reaped(self, sts: int, rusage: Any, now: float) -> int:
        """The leader was reaped: keep what the evidence needs; returns the
        wait status the caller sees (the target's, under a PID 1)."""
        sts = self._target_status(sts)
        if self.workspace is None or self.plan.keep_workspace:
            _namespaces.release_mounts(self.mnt_hold)
            self.mnt_hold = -1
        # else let go of by the supervisor right before it removes the
        # workspace (close_workspace): its teardown first, then the removal
        # finds no mount on the way.
        self.rusage = rusage
        if self.end is None:
            self.end = now
        if self.cgroup is not None:
            self.release_cgroup()
        if self.plan.active:  # the reap of a plain Popen stays as it was
            if self.ws_fd >= 0:
                self.disk, full = _workspace.tmpfs_usage(self.ws_fd)
                # Past the limit (the tmpfs has room past it, to tell), or
                # full: the limit was exceeded, whatever the program did next.
                limit = self.limits.disk if self.limits is not None else None
                self.disk_full = full or (limit is not None and self.disk > limit)
            elif self.workspace is not None and self.closed_at_reap:
                # Measured when someone asks, or right before the workspace
                # is removed (by the supervisor, or the janitor for a tree
                # its program left): off the caller's path.
                self.disk_size = _workspace.FinalSize(self.workspace)
            else:
                disk_path = self.disk_path()
                if disk_path is not None:
                    self.disk = _workspace.size(disk_path)
        self.status = sts
        return sts

    def _target_status(self, sts: int) -> int:
        """PID 1's status, or the target's when PID 1 passed it on (PID 1
        cannot die of a signal of its own; killed, it passes nothing)."""
        fd, self.status_fd = self.status_fd, -1
        if fd < 0:
            return sts
        try:
            data = os.read(fd, 16) if _readable(fd) else b""
        except OSError:
            data = b""
        finally:
            os.close(fd)
        return int.from_bytes(data[:4], sys.byteorder, signed=True) if len(data) >= 4 else sts

    def release_cgroup(self) -> None:
        """The leader is gone: keep the cgroup's final figures, then remove
        it (or hand it to the supervisor until its last process is gone)."""
        cg = self.cgroup
        if cg is None:
            return
        self.cgroup = None
        if self.watch is not None:
            self.watch.cgroup = None
        # Its final figures and its removal (a memcg's teardown above all)
        # are the supervisor's, off the caller's path; the outcome asks
        # for the figures when someone asks for it.  What the leader left
        # was killed at its exit (leader_exited).
        self.cgroup_figures = cg.ended()
        get_monitor().retire(cg)

    def exited(self, returncode: int) -> None:
        """The exit status is known: give the room back, close the way out,
        tell the audit."""
        self.returncode = returncode
        if self.quota is not None:
            self.release_quota()
        self.stop_proxy()
        if self.plan.active and audit.active():
            o = self.outcome(returncode, created=True)
            t, u = o.termination(), o.usage()  # the verdict computed the usage
            f = self.audit_fields()
            # Cause before effect: the limit, the kill it caused, the exit.
            if t.is_limit:
                kw = {"limit": t.limit, "observed": t.observed, "mechanism": t.mechanism}
                audit.emit("limit_exceeded", field=t.reason, **kw, **f)
                w = self.watch
                if w is not None and w.kill is not None:  # the supervisor ended it
                    audit.emit("killed", field=t.reason, detail="supervisor", **kw, **f)
            audit.emit(
                "exit",
                observed=returncode,
                detail=t.reason,
                memory_peak=u.memory_peak,
                cpu_time=u.cpu_total,
                wall_time=u.wall,
                **f,
            )

    # -- the caller's hand -----------------------------------------------------

    def caller_kills(self) -> None:
        """The caller ends the sandbox (kill_tree(), a cancelled asyncio
        wait): termination says so, and one `killed` event does."""
        if not self.ours_to_signal():
            return  # reaped already, or a fork's copy: nothing of ours to end
        self.kill_group = self.pgid
        if self.killed_by_caller:
            return
        self.killed_by_caller = True
        if self.plan.active and audit.active():
            audit.emit("killed", detail="kill_tree", **self.audit_fields())

    def signal_tree(self, sig: int) -> None:
        """`sig` to the whole tree: its cgroup, its group, its descendants
        (nothing once the leader was reaped: its ids may be another's).
        The leader's reap waits until the signals are sent: killed by the
        first of them, it must not be reaped, its pid given to another
        process, before the last."""
        if not self.ours_to_signal():
            return  # (before the lock: a fork's copy of it may be held for ever)
        lock = self.signal_lock
        if lock is None:
            signal_tree(self.pid, sig, self.pgid, self.cgroup)
            return
        with lock:
            if not self.gone:
                signal_tree(self.pid, sig, self.pgid, self.cgroup)

    # -- usage and evidence ------------------------------------------------------

    def live_usage(self) -> Usage:
        """What it uses now (it runs)."""
        w = self.watch
        wall = time.monotonic() - self.start
        cg = self.cgroup
        if cg is not None:
            return usage(
                wall=wall, disk=self.live_disk(), final=False, cgroup=cg.stats(evidence=False)
            )
        tree = w.fresh_tree(time.monotonic()) if w is not None else None
        if tree is None and _core.HAS_PROCTREE:
            try:
                m, t, _procs, cpu_u, cpu_s, _alive = _core.tree_sample(
                    self.pid, bool(self.plan.ns_flags & CLONE_NEWPID)
                )
                tree = (m, t, cpu_u, cpu_s)
                if w is not None:
                    warning = w.observe(m, t)
                    if warning is not None:
                        audit.emit("resource_warning", **warning)
            except OSError:
                pass
        samples = w.samples() if w is not None else None
        return usage(wall=wall, disk=self.live_disk(), final=False, samples=samples, tree=tree)

    def outcome(self, returncode: int, *, created: bool) -> Outcome:
        """The final facts, computed into Usage/Termination only when asked."""
        o = self._outcome
        if o is None:
            w = self.watch
            evidence = Evidence(
                program=self.program,
                returncode=returncode,
                created=created,
                wall=(self.end or time.monotonic()) - self.start,
                rusage=self.rusage,
                kill=w.kill if w is not None else None,
                hits=frozenset(w.hits) if w is not None else frozenset(),
                samples=w.samples() if w is not None else None,
                killed_by_caller=self.killed_by_caller,
                disk=self.disk,
                disk_full=self.disk_full,
            )
            cg, size = self.cgroup_figures, self.disk_size
            o = self._outcome = Outcome(
                evidence,
                self.limits,
                self.enforced,
                self.plan.memory_by,
                cgroup=cg.get if cg is not None else None,
                disk=size.get if size is not None else None,
            )
        return o

    def termination(self, returncode: int) -> Termination:
        return self.outcome(returncode, created=True).termination()

    def live_disk(self) -> int | None:
        if self.ws_fd >= 0:
            return _workspace.tmpfs_usage(self.ws_fd)[0]
        path = self.disk_path()
        return _workspace.size(path) if path is not None else None

    def disk_path(self) -> str | None:
        """Where `disk` is measured: the private workspace, else workdir."""
        if self.workspace is not None:
            return self.workspace
        pol = self.policy
        return pol.workdir if pol is not None and self.plan.disk is not None else None

    # -- audit events (sbxlimit.audit) -------------------------------------------

    def audit_fields(self) -> dict[str, Any]:
        return {"sandbox_id": self.id, "key": self.audit_key, "program": self.program.strip("`")}

    def audit_spawn(self) -> None:
        p, f = self.plan, self.audit_fields()
        audit.emit("spawn", **f)
        for field, reason in {**p.fallbacks, **p.downgrades}.items():
            held = p.held.get(field)
            mech = str(held) if isinstance(held, Held) else None  # the fallback, if any
            audit.emit("degraded", field=field, mechanism=mech, detail=reason, **f)

    # -- the workspace -------------------------------------------------------------

    def workspace_view(self) -> str | None:
        """The workspace as the caller reaches it: the tmpfs through the fd
        the sandbox handed back, else the directory (after close() too: the
        path stays meaningful, the fd's does not)."""
        if self.ws_fd >= 0 and self.workspace is not None:
            return _namespaces.fd_path(self.ws_fd)
        return self.workspace_dir

    def close_tmpfs(self, copy_to: str | None) -> None:
        fd, self.ws_fd = self.ws_fd, -1
        if fd < 0:
            return
        try:
            if copy_to is not None:
                _namespaces.copy_out(fd, copy_to)
        finally:
            os.close(fd)

    def close_workspace(self) -> None:
        """Remove the private workspace, unless kept (its files copied out
        of a tmpfs first)."""
        ws = self.workspace
        if ws is None or self.owner_pid != os.getpid():
            return  # a forked child's copy owns nothing (as in finalize)
        self.workspace = None
        keep = self.plan.keep_workspace
        try:
            self.close_tmpfs(copy_to=ws if keep else None)
        finally:
            if keep:
                _workspace.forget(ws)
                _namespaces.release_mounts(self.mnt_hold)
                self.mnt_hold = -1
            else:
                # Gone from its path now; it is removed by the supervisor
                # (or the janitor, for a tree), off the caller's path.
                hold, self.mnt_hold = self.mnt_hold, -1
                # Removal is best effort: say what is true.
                self.workspace_removed = get_monitor().remove_workspace(ws, hold, self.disk_size)

    @property
    def holds_files(self) -> bool:
        """A workspace, a tmpfs or a mount namespace to let go of (close()
        and finalize() have something to do)."""
        return self.workspace is not None or self.ws_fd >= 0 or self.mnt_hold >= 0

    def finalize(self, reaped: bool) -> None:
        """Dropped without close(): the workspace goes with it (if the
        program was reaped), the tmpfs fd in any case (unless kept).  Only
        in the process that made it: a forked child's copy, collected at
        its exit, must not remove its parent's workspace."""
        if self.owner_pid != os.getpid():
            return
        _namespaces.release_mounts(self.mnt_hold)
        self.mnt_hold = -1
        ws = self.workspace
        keep = self.plan.keep_workspace
        if ws is not None and reaped and not keep:
            self.workspace = None
            _workspace.remove(ws)
        if not keep:  # nobody can read it any more (with keep, close() copies it out)
            self.close_tmpfs(copy_to=None)
