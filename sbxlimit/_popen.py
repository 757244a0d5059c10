"""``sbxlimit.Popen``: :class:`subprocess.Popen` with limits and a sandbox.

Everything subprocess does in the parent (argument checks, pipes, text
mode, ``communicate``, ``wait``) is subprocess's own code: this class only
replaces how the child is made (``_execute_child``, via the C core) and how
it is reaped (``wait4``, for rusage), and adds ``limits``, ``policy``,
``enforced``, ``usage()``, ``termination`` and ``kill_tree()``.
"""

from __future__ import annotations

import atexit
import errno
import itertools
import os
import pwd
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from . import _core, _landlock, _namespaces, _protected, _seatbelt, _workspace, audit
from . import _spawn as _spawn_mod
from ._cgroup import Cgroup, CgroupStats, discover, warn_explicit_site
from ._enforce import CLONE_NEWPID, Plan, plan, warn_downgrades
from ._errors import ConfigError, UnsupportedError, setup_error
from ._limits import Limits
from ._monitor import Pump, Watch, get_monitor, signal_tree
from ._policy import Policy
from ._quota import Quota
from ._seatbelt import Belt, proxy_env, terminal_devices
from ._spawn import child_error, resolve_executable
from ._termination import Outcome, Termination, Usage, program_name
from ._units import parse_seconds

__all__ = ["Popen"]

_ids = itertools.count(1)
_DEFAULT_INTERVAL = 0.1
# Running sandboxes that hold a cgroup and die with this process
# (PR_SET_PDEATHSIG): ended and cleaned up at exit, see _end_at_exit.
_dying_with_us: weakref.WeakSet[Popen] = weakref.WeakSet()
_NO_PLAN = Plan()  # a plain Popen: no limits, no policy
_LINUX = sys.platform.startswith("linux")


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


class Popen(subprocess.Popen):  # type: ignore[type-arg]
    """A drop-in :class:`subprocess.Popen` that runs the program in a sandbox.

    Every argument of :class:`subprocess.Popen` works as there.  Extra
    keyword-only arguments:

    limits: :class:`Limits` (or a dict of its fields): what the program may use.
    policy: :class:`Policy` (or a dict): what it may touch.
    sample_interval: seconds between the supervisor's samples of memory and
        task count (default 0.1), for the memory and pids watchdogs.
    die_with_parent: kill the program if the thread that started it dies
        (``PR_SET_PDEATHSIG``).  Linux ties this signal to the *thread*, so
        the default is True only when spawning from the main thread.
    cgroup_parent: the cgroup under which this sandbox's cgroup is made
        (default: ``$SBXLIMIT_CGROUP_PARENT``, else the first safe place
        found, see docs/cgroups.md); ``"none"`` runs without a cgroup.

    Without ``limits`` and ``policy`` the child is exactly what subprocess
    makes (plus ``usage`` and ``termination``).  With either, it also leads
    its own process group (unless you chose ``start_new_session`` or
    ``process_group``), so that the supervisor can end the whole tree, and
    whatever it leaves behind in that group is killed when it exits.

    ``preexec_fn`` still works, but forces a full ``fork()`` of this
    interpreter (slow for a large parent) and runs Python code in the
    child, which can deadlock if other threads hold locks.
    """

    # Class-level defaults: the spawn path of a plain Popen sets nothing it
    # does not need (every extra line there costs, cold, after each exec).
    _sbx_plan: Plan = _NO_PLAN
    _sbx_watch: Watch | None = None
    _sbx_rusage: Any = None
    _sbx_end: float | None = None
    _sbx_start = 0.0
    _sbx_final: Outcome | None = None
    _sbx_pgid = 0  # > 0 when the child leads that group and we may kill it
    _sbx_tree_pgid = 0  # same, and what it leaves there is killed at exit
    _sbx_interval = _DEFAULT_INTERVAL
    _sbx_die_with_parent: bool | None = None
    _sbx_id: str | None = None
    _sbx_kill_group = 0  # kill_tree() asked: kill the group at reap
    _sbx_killed_by_caller = False
    _sbx_flush: list[Pump] = []  # noqa: RUF012  (never mutated: replaced per instance)
    _sbx_cgroup: Cgroup | None = None
    _sbx_cgstats: CgroupStats | None = None
    _sbx_how = 0  # _core.HOW_* bits of the clone that made the child
    _sbx_target: Callable[[], Any] | None = None  # see sbxlimit._forked
    _sbx_belt: Belt | None = None  # macOS: the profile on its way in
    _sbx_audit_key: str | None = None
    _sbx_program = "the program"  # program_name(), set when the child is made
    _sbx_protected: tuple[str, ...] = ()  # what protect_dotfiles protects (_protected)
    _sbx_enforced: dict[str, str] = {}  # noqa: RUF012  (replaced, never mutated) this run's notes
    _sbx_warn_at: float | None = 0.9
    _sbx_workspace: str | None = None  # the private workspace, until close()
    _sbx_ws_fd = -1  # the size-capped tmpfs over it (mount namespace): its root
    # A PID namespace's PID 1 (our child) writes the target's wait status
    # here: the status the caller sees, signals included.
    _sbx_status_fd = -1
    _sbx_disk: int | None = None  # its size when the program ended
    _sbx_disk_full = False  # the tmpfs was full when the program ended
    _sbx_quota: Any = None  # a Quota admission, released at reap
    limits: Limits | None = None
    policy: Policy | None = None
    # subprocess.Popen's private members we rely on (3.11-3.13).
    _waitpid_lock: threading.Lock

    def __init__(
        self,
        args: Any,
        *popenargs: Any,
        limits: Limits | Mapping[str, Any] | None = None,
        policy: Policy | Mapping[str, Any] | None = None,
        sample_interval: float | str = _DEFAULT_INTERVAL,
        die_with_parent: bool | None = None,
        cgroup_parent: str | None = None,
        audit_key: str | None = None,
        quota: Quota | None = None,
        warn_at: float | None = 0.9,
        **kwargs: Any,
    ) -> None:
        # subprocess.Popen.__del__ reads this if we raise before it is set.
        self._child_created = False
        if cgroup_parent is not None and not isinstance(cgroup_parent, str):
            raise ConfigError("cgroup_parent", cgroup_parent, "expected a path or 'none'")
        if warn_at != 0.9:
            if warn_at is not None and (
                isinstance(warn_at, bool)
                or not isinstance(warn_at, (int, float))
                or not 0 < warn_at <= 1
            ):
                raise ConfigError("warn_at", warn_at, "expected a fraction in (0, 1], or None")
            self._sbx_warn_at = warn_at
        if audit_key is not None:
            if not isinstance(audit_key, str):
                raise ConfigError("audit_key", audit_key, "expected a str")
            self._sbx_audit_key = audit_key
        if limits is not None or policy is not None:
            group = kwargs.get("process_group")
            self._sbx_prepare(limits, policy, kwargs.get("user"), cgroup_parent, group)
            if self._sbx_plan.new_session and group is not None and group > 0:
                raise ConfigError(
                    "process_group",
                    group,
                    "a Policy sandbox gets a session of its own (no controlling terminal), so it "
                    "cannot join a group of the caller's; pass Policy(terminal=True) to share it",
                )
        if sample_interval is not _DEFAULT_INTERVAL:
            self._sbx_interval = parse_seconds("sample_interval", sample_interval)
        if die_with_parent is not None:
            if not isinstance(die_with_parent, bool):
                raise ConfigError("die_with_parent", die_with_parent, "expected a bool or None")
            if die_with_parent and not _LINUX:
                raise ConfigError(
                    "die_with_parent",
                    True,
                    "only Linux has a parent-death signal; end the sandbox with kill_tree(), a "
                    "with block or wall_time",
                )
            self._sbx_die_with_parent = die_with_parent
        if quota is not None:
            if not isinstance(quota, Quota):
                raise ConfigError("quota", quota, "expected a sbxlimit.Quota")
            # Admitted before anything starts; given back at reap (or now,
            # if the spawn fails).
            self._sbx_quota = quota.admit(self.limits, key=audit_key)
        try:
            super().__init__(args, *popenargs, **kwargs)
        except BaseException:
            self._sbx_quota_release()
            raise

    def _sbx_prepare(
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
        p = self._sbx_plan = plan(
            self.limits,
            self.policy,
            uid=_target_uid(user),
            site=site,
            no_reaper=_no_reaper(self._sbx_target is not None, group),
        )
        if p.ns_flags & CLONE_NEWPID and self._sbx_target is not None:
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
        strict = self.policy is not None and self.policy.strict
        if strict and (p.downgrades or p.fallbacks):
            raise UnsupportedError({**p.fallbacks, **p.downgrades})
        if p.downgrades:
            warn_downgrades(p)
        pol = self.policy
        if pol is not None and pol.protect_dotfiles and (p.landlock or p.ro_view or p.seatbelt):
            # The private workspace is new and empty: the roots to search
            # are the caller's.
            roots = [pol.workdir] if pol.workdir else []
            home = os.path.expanduser("~")
            found = _protected.protected(home, [*roots, *pol.writable_roots], darwin=p.seatbelt)
            self._sbx_protected = found.paths
            notes = []
            if not found.complete:
                # The protection is bounded by definition (SPEC 3): say
                # where this search stopped.
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
            if notes:
                held, said = p.enforced["protect_dotfiles"], "; ".join(notes)
                held = f"{held[:-1]}; {said})" if held.endswith(")") else f"{held} ({said})"
                self._sbx_enforced = {"protect_dotfiles": held}

    @property
    def program(self) -> str:
        """The program's name as messages and audit events show it: the
        executable's base name, never its arguments or a shell command
        line."""
        return self._sbx_program.strip("`")

    @property
    def sandbox_id(self) -> str:
        """A short id, unique in this process, for logs and audit events."""
        if self._sbx_id is None:
            self._sbx_id = f"{os.getpid():x}-{next(_ids)}"
        return self._sbx_id

    # -- the child --------------------------------------------------------

    def _execute_child(
        self,
        args: Any,
        executable: Any,
        preexec_fn: Any,
        close_fds: bool,
        pass_fds: Any,
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: int,
        shell: bool,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        restore_signals: bool,
        gid: int | None,
        gids: Any,
        uid: int | None,
        umask: int,
        start_new_session: bool,
        process_group: int,
    ) -> None:
        # The name messages and audit events use: never argv beyond it, never
        # a shell command line (both may hold secrets).
        if self._sbx_target is None:
            self._sbx_program = program_name(args, shell=shell, executable=executable)
        else:  # a forked callable: its label, nothing is executed
            self._sbx_program = program_name(args)
        if isinstance(args, (str, bytes)):
            args = [args]
        elif isinstance(args, os.PathLike):
            if shell:
                raise TypeError("path-like args is not allowed when shell is true")
            args = [args]
        else:
            args = list(args)
        if shell:
            args = ["/bin/sh", "-c", *args]
            if executable:
                args[0] = executable
        if executable is None:
            executable = args[0]
        sys.audit("subprocess.Popen", executable, args, cwd, env)

        p = self._sbx_plan
        implicit_cwd = cwd is None  # a cwd sbxlimit picks must not move "./prog"
        if p.active and self.policy is not None:
            env = self.policy.filter_env(os.environ if env is None else env)
            env.update(proxy_env(self.policy))
            if cwd is None and self.policy.workdir is not None:
                cwd = self.policy.workdir
        ns: _namespaces.Spawn | None = None
        if p.workspace:
            ws = self._sbx_workspace = _workspace.create(self.sandbox_id)
            if cwd is None:
                cwd = ws
            env = dict(os.environ if env is None else env)
            env["TMPDIR"] = os.path.join(ws, "tmp")
        try:
            env_list = None
            if env is not None:
                env_list = []
                for k, v in env.items():
                    k = os.fsencode(k)
                    if b"=" in k:
                        raise ValueError("illegal environment variable name")
                    env_list.append(k + b"=" + os.fsencode(v))
            exe = os.fsencode(executable)
            exec_paths: tuple[bytes, ...] | None
            if self._sbx_target is not None:
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
                belt = self._sbx_belt = self._sbx_seatbelt((p2cread, c2pwrite, errwrite))
                if exec_paths is not None:
                    exec_paths, args, belt_fds = belt.exec_through(
                        _seatbelt.HELPER, exec_paths, args
                    )
                    pass_fds = (*pass_fds, *belt_fds)

            # What subprocess's _close_pipe_fds would close; the core closes them
            # right after the child is made, on every path.
            devnull = getattr(self, "_devnull", -1)
            close_after = [devnull]
            if p2cread != -1 and p2cwrite != -1 and p2cread != devnull:
                close_after.append(p2cread)
            if c2pwrite != -1 and c2pread != -1 and c2pwrite != devnull:
                close_after.append(c2pwrite)
            if errwrite != -1 and errread != -1 and errwrite != devnull:
                close_after.append(errwrite)

            if p.ns_flags:
                memory = self.limits.memory if self.limits is not None else None
                ns = _namespaces.Spawn(
                    p, self.policy, self._sbx_workspace, uid, gid, memory, self._sbx_protected
                )

            pgid = process_group
            die = self._sbx_die_with_parent
            if die is None:  # default: sandboxes started from the main thread
                die = p.active and _LINUX and threading.current_thread() is threading.main_thread()
            pdeathsig = signal.SIGKILL if die else 0
            pumps: list[Pump] = []
            child_out, child_err = c2pwrite, errwrite
            if p.active:
                if p.new_session and process_group <= 0:
                    # A session of its own: no controlling terminal to type
                    # into, and a group of its own (the tree we can end).
                    start_new_session, pgid = True, -1
                elif not start_new_session and process_group == -1:
                    pgid = 0  # lead a group of our own: the tree we can end
                if p.output is not None:
                    try:
                        child_out, child_err = self._sbx_make_pumps(
                            pumps, close_after, c2pread, c2pwrite, errread, errwrite, devnull
                        )
                    except BaseException:
                        for pump in pumps:
                            pump.discard()
                        for fd in close_after[close_after.index(devnull) + 1 :]:
                            if fd not in (p2cread, c2pwrite, errwrite):
                                os.close(fd)
                        raise
            fail_step, fail_errno = _spawn_mod._fail_at or (0, 0)

            cg_dirfd = -1
            cg_procs: list[int] = []
            if p.site is not None:
                try:
                    cg = self._sbx_cgroup = Cgroup.create(
                        p.site, f"sbx-{self.sandbox_id}", p.cgroup_settings
                    )
                    cg_procs = cg.procs_fds()
                except BaseException as e:
                    for pump in pumps:
                        pump.discard()
                    if self._sbx_cgroup is not None:
                        self._sbx_cgroup.remove()
                        self._sbx_cgroup = None
                    if isinstance(e, OSError):
                        raise setup_error(
                            "cgroup:create", e.errno or errno.EIO, 0, e.filename
                        ) from e
                    raise
                cg_dirfd = cg.dirfd
                close_after += cg_procs

            landlock_fd = -1
            if p.landlock:
                assert self.policy is not None
                where = self._sbx_workspace or self.policy.workdir
                handled, ll_rules = _landlock.rules(
                    self.policy, where, p.landlock, self._sbx_protected, view=p.ro_view
                )
                try:
                    landlock_fd, _n = _core.landlock_ruleset(handled, ll_rules, *p.landlock_net)
                except OSError as e:
                    for pump in pumps:
                        pump.discard()
                    for fd in cg_procs:
                        os.close(fd)
                    self._sbx_release_cgroup()
                    raise setup_error("landlock:ruleset", e.errno or errno.EIO, 0) from e
                close_after.append(landlock_fd)
            if ns is not None and ns.child_end >= 0:
                close_after.append(ns.take_child_end())
            if ns is not None and ns.status_w >= 0:
                self._sbx_status_fd, status_w = ns.take_status_ends()
                close_after.append(status_w)
            self._sbx_start = time.monotonic()
            self._closed_child_pipe_fds = True  # the core closes them from here on
            try:
                pid, failure, self._sbx_how = _core.spawn(
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
                    restore_signals and self._sbx_target is None,
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
                    landlock_fd,
                    ns.args if ns is not None else None,
                    cg_dirfd,
                    cg_procs,
                    preexec_fn,
                    fail_step,
                    fail_errno,
                )
            except BaseException:
                for pump in pumps:
                    pump.discard()
                if self._sbx_status_fd >= 0:
                    os.close(self._sbx_status_fd)
                    self._sbx_status_fd = -1
                self._sbx_release_cgroup()
                self._sbx_close_belt()
                raise
            if ns is not None:
                if failure is None and pid != 0:
                    got = ns.receive_fd()  # may be 0: the caller may have closed stdin
                    self._sbx_ws_fd = -1 if got is None else got
                ns.close()
            reason = None
            if failure is None and self._sbx_belt is not None and pid != 0:
                failure, reason = self._sbx_belt_started(pid)
            if failure is not None:
                for pump in pumps:
                    pump.discard()
                self._sbx_release_cgroup()
                self._sbx_close_belt()
                step, err_no, detail, status = failure
                if self._sbx_status_fd >= 0:
                    os.close(self._sbx_status_fd)
                    self._sbx_status_fd = -1
                self.returncode = os.waitstatus_to_exitcode(status) if status else 0
                raise child_error(
                    step, err_no, detail, executable=executable, cwd=cwd, reason=reason
                )

            if pid == 0:  # only with a target: we are the forked child
                self._sbx_run_target(
                    (p2cwrite, c2pread, errread), (p2cread != -1, child_out != -1, child_err != -1)
                )
            self.pid = pid
            self._child_created = True
            if pdeathsig and self._sbx_cgroup is not None:
                _dying_with_us.add(self)
            if p.active and audit.active():
                self._sbx_audit_spawn()
            if start_new_session or pgid == 0:
                self._sbx_pgid = pid
                if p.active:
                    self._sbx_tree_pgid = pid
            # The supervisor is needed for timers and samples, for pumps, and to
            # end leftovers at once when someone reads the output: a leftover
            # holding the pipe would otherwise keep communicate() waiting.
            piped = c2pread != -1 or errread != -1
            quota = self._sbx_quota is not None
            if p.needs_monitor or pumps or (p.active and piped) or quota:
                self._sbx_supervise(pid, pumps, piped or quota)
            elif self._sbx_warns() or (self._sbx_ws_fd >= 0 and self._sbx_warns_disk()):
                self._sbx_supervise(pid, pumps, piped)
        except BaseException:
            if ns is not None:
                ns.close()  # idempotent: the sockets of a spawn that did not happen
            self._sbx_close_belt()
            if self._sbx_workspace is not None:
                _workspace.remove(self._sbx_workspace)
                self._sbx_workspace = None
            raise

    def _sbx_run_target(
        self, parent_ends: tuple[int, ...], redirected: tuple[bool, bool, bool]
    ) -> NoReturn:
        """In a fork_only child, set up by the core: run the target and exit
        with its status, never returning into the caller's frames.  Streams
        the caller redirected are rebound to fds 0-2 at the Python level too
        (sys.stdout may be something else, e.g. a test runner's capture)."""
        code = 1
        try:
            # Other spawns' report pipes, copied by this fork: theirs to close.
            _seatbelt.close_others(self._sbx_belt)
            if self._sbx_belt is not None:  # macOS: the body runs under the profile, or not at all
                self._sbx_belt.apply_here()
            for fd in parent_ends:
                if fd > 2:
                    os.close(fd)
            if redirected[0]:
                sys.stdin = open(0, closefd=False)  # noqa: SIM115
            if redirected[1]:
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            if redirected[2]:
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            assert self._sbx_target is not None
            result = self._sbx_target()
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
            os._exit(code & 0xFF)

    def _sbx_warn_memory(self) -> tuple[int, int, str] | None:
        if not self._sbx_warns():
            return None
        assert self.limits is not None and self.limits.memory is not None
        assert self._sbx_warn_at is not None
        n = self.limits.memory
        return (int(n * self._sbx_warn_at), n, self._sbx_plan.enforced.get("memory", ""))

    def _sbx_disk_watch(self) -> tuple[str | int, int] | None:
        """What the supervisor samples for disk: the workspace's path (the
        watchdog), or the tmpfs's fd (warnings only: the kernel holds it)."""
        p = self._sbx_plan
        if p.disk is None:
            return None
        if self._sbx_ws_fd >= 0:
            # The tmpfs holds a margin past the limit: sampled to end the
            # sandbox there (tolerated: to note that it was full).
            return (self._sbx_ws_fd, p.disk)
        path = self._sbx_disk_path()
        return (path, p.disk) if path else None

    def _sbx_warns_disk(self) -> bool:
        return self._sbx_warn_at is not None and audit.active()

    def _sbx_warns(self) -> bool:
        """A memory resource_warning is wanted: someone listens to audit
        events and there is a memory limit to warn about."""
        lim = self.limits
        return (
            self._sbx_warn_at is not None
            and lim is not None
            and lim.memory is not None
            and audit.active()
        )

    def _sbx_supervise(self, pid: int, pumps: list[Pump], piped: bool) -> None:
        p = self._sbx_plan
        monitor = get_monitor()
        cg = self._sbx_cgroup
        watch = self._sbx_watch = Watch(
            pid=pid,
            pgid=self._sbx_tree_pgid,
            start=self._sbx_start,
            wall_time=p.wall_time,
            memory=p.watch_memory,
            pids=p.watch_pids,
            grace=p.kill_grace,
            interval=self._sbx_interval,
            cgroup=cg,
            cg_ends=p.cg_ends if cg is not None else (),
            cpu_time=p.watch_cpu_time,
            reaper=bool(p.ns_flags & CLONE_NEWPID),
            warn_memory=self._sbx_warn_memory(),
            audit_fields=self._sbx_audit_fields() if audit.active() else None,
            disk=self._sbx_disk_watch(),
            disk_ends=not (p.disk_tmpfs and "disk" in p.tolerate),
        )
        for pump in pumps:
            pump.watch = watch
            monitor.add_pump(pump)
        # Output bound for our own pipe is drained by whoever reads it;
        # elsewhere (a file, the terminal, a foreign pipe) wait() also waits
        # for the pump to pass the last bytes on.
        self._sbx_flush = [pump for pump in pumps if pump.mode != "nonblock"]
        if watch.disk is not None and self._sbx_warn_at is not None and audit.active():
            watch.warn_disk = int(watch.disk[1] * self._sbx_warn_at)
        if self._sbx_quota is not None:
            # Room goes back when the program exits, reaped or not.
            watch.on_exit = self._sbx_quota_release
        timers = p.needs_monitor or watch.next_sample is not None
        monitor.register(watch, timers=timers, exit=piped or bool(pumps))

    def _sbx_make_pumps(
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
        out = self._sbx_pump_for(c2pwrite, c2pread != -1, devnull, 1, "stdout")
        if out is not None:
            pumps.append(out[0])
            close_after.append(out[1])
            child_out = out[1]
        if (errwrite != -1 and errwrite == c2pwrite) or (c2pwrite == -1 and errwrite == 1):
            return child_out, child_out  # stderr=STDOUT: one stream
        child_err = errwrite
        err = self._sbx_pump_for(errwrite, errread != -1, devnull, 2, "stderr")
        if err is not None:
            pumps.append(err[0])
            close_after.append(err[1])
            child_err = err[1]
        return child_out, child_err

    def _sbx_pump_for(
        self, target: int, is_pipe: bool, devnull: int | None, inherited: int, stream: str
    ) -> tuple[Pump, int] | None:
        """A pump from a new pipe to the stream's destination; None when the
        stream goes to /dev/null (nothing to cap)."""
        if target != -1 and target == devnull:
            return None
        p = self._sbx_plan
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
                warn_at=self._sbx_warn_at if audit.active() else None,
            )
        except BaseException:
            for fd in (dst, r, w):
                if fd >= 0:
                    os.close(fd)
            raise
        return pump, w

    # -- reaping ----------------------------------------------------------

    def _try_wait(
        self,
        wait_flags: int,
        _waitid: Any = os.waitid,
        _wait4: Any = os.wait4,
        _P_PID: int = os.P_PID,
        _WNOWAIT: int = os.WEXITED | os.WNOWAIT,
        _WNOHANG: int = os.WNOHANG,
        _monotonic: Any = time.monotonic,
    ) -> tuple[int, int]:
        """All callers hold self._waitpid_lock (as in subprocess).

        For a sandbox, wait for the exit *without* reaping first: while the
        leader is a zombie its process group id cannot be reused, so killing
        what it left behind in the group is safe.  Then reap with wait4 for
        the rusage.
        """
        if (
            self._sbx_tree_pgid > 0
            or self._sbx_watch is not None
            or self._sbx_kill_group > 0
            or self._sbx_cgroup is not None
        ):
            try:
                info = _waitid(_P_PID, self.pid, _WNOWAIT | (wait_flags & _WNOHANG))
            except ChildProcessError:
                info = True
            if info is None:
                return (0, 0)
            self._sbx_leader_exited(_monotonic())
        try:
            pid, sts, rusage = _wait4(self.pid, wait_flags)
        except ChildProcessError:
            # SIGCHLD ignored or reaped elsewhere: status unknown (as in
            # subprocess), but the sandbox is over: clean up all the same.
            pid, sts, rusage = self.pid, 0, None
        if pid == self.pid:
            sts = self._sbx_target_status(sts)
            self._sbx_rusage = rusage
            if self._sbx_end is None:
                self._sbx_end = _monotonic()
            if self._sbx_cgroup is not None:
                self._sbx_release_cgroup()
            if self._sbx_plan.active:  # the reap of a plain Popen stays as it was
                if self._sbx_ws_fd >= 0:
                    self._sbx_disk, self._sbx_disk_full = _workspace.tmpfs_usage(self._sbx_ws_fd)
                else:
                    disk_path = self._sbx_disk_path()
                    if disk_path is not None:
                        self._sbx_disk = _workspace.size(disk_path)
        return (pid, sts)

    def _sbx_target_status(self, sts: int) -> int:
        """PID 1's status, or the target's when PID 1 passed it on (PID 1
        cannot die of a signal of its own; killed, it passes nothing)."""
        fd, self._sbx_status_fd = self._sbx_status_fd, -1
        if fd < 0:
            return sts
        try:
            data = os.read(fd, 16) if _readable(fd) else b""
        except OSError:
            data = b""
        finally:
            os.close(fd)
        return int.from_bytes(data[:4], sys.byteorder, signed=True) if len(data) >= 4 else sts

    # -- audit events (sbxlimit.audit) ---------------------------------------

    def _sbx_audit_fields(self) -> dict[str, Any]:
        return {
            "sandbox_id": self.sandbox_id,
            "key": self._sbx_audit_key,
            "program": self._sbx_program.strip("`"),
        }

    def _sbx_audit_spawn(self) -> None:
        p, f = self._sbx_plan, self._sbx_audit_fields()
        audit.emit("spawn", **f)
        for field, reason in {**p.fallbacks, **p.downgrades}.items():
            held = p.enforced.get(field, "")
            mech = None if held.startswith("unenforced") else held  # the fallback, if any
            audit.emit("degraded", field=field, mechanism=mech, detail=reason, **f)

    def _handle_exitstatus(self, sts: int, *args: Any) -> None:
        super()._handle_exitstatus(sts, *args)  # type: ignore[misc]
        if self._sbx_quota is not None:
            self._sbx_quota_release()
        if self._sbx_plan.active and audit.active():
            t = self._sbx_outcome().termination()
            f = self._sbx_audit_fields()
            audit.emit("exit", observed=self.returncode, detail=t.reason, **f)
            if t.is_limit:
                kw = {"limit": t.limit, "observed": t.observed, "mechanism": t.mechanism}
                audit.emit("limit_exceeded", field=t.reason, **kw, **f)
                w = self._sbx_watch
                if w is not None and w.kill is not None:  # the supervisor ended it
                    audit.emit("killed", field=t.reason, detail="supervisor", **kw, **f)

    def _sbx_quota_release(self) -> None:
        admission, self._sbx_quota = self._sbx_quota, None
        if admission is not None:
            admission.release()

    def _sbx_seatbelt(self, stdio: tuple[int, int, int]) -> Belt:
        """The profile of this sandbox: its workspace named, the protected
        paths found for it, and the terminals on its stdio."""
        policy = self.policy
        assert policy is not None
        fds = [fd if fd != -1 else i for i, fd in enumerate(stdio)]
        profile = policy.seatbelt_profile(
            workspace=self._sbx_workspace or policy.workdir,
            ttys=terminal_devices(fds),
            protected=self._sbx_protected,
        )
        return Belt(profile)

    def _sbx_belt_started(self, pid: int) -> tuple[tuple[str, int, int, int] | None, str | None]:
        """Wait until the profile is in force; a refusal becomes the spawn's
        failure, with libsandbox's message (the child exits, reaped here)."""
        assert self._sbx_belt is not None
        got = self._sbx_belt.started()
        self._sbx_belt = None
        if got is None:
            return None, None
        step, err, message = got
        _, status = os.waitpid(pid, 0)
        return (step, err, 0, status), message or None

    def _sbx_close_belt(self) -> None:
        belt, self._sbx_belt = self._sbx_belt, None
        if belt is not None:
            belt.close()

    def _sbx_release_cgroup(self) -> None:
        """The leader is gone: keep the cgroup's final figures, then remove
        it (or hand it to the supervisor until its last process is gone)."""
        cg = self._sbx_cgroup
        if cg is None:
            return
        self._sbx_cgroup = None
        if self._sbx_watch is not None:
            self._sbx_watch.cgroup = None
        try:
            self._sbx_cgstats = cg.stats(final=True)
        except OSError:
            pass
        # rmdir (a memcg's teardown above all) is the slow part: the
        # supervisor does it, off the caller's path.  What the leader left
        # was killed at its exit (_sbx_leader_exited).
        get_monitor().retire(cg)

    def _sbx_leader_exited(self, now: float) -> None:
        w = self._sbx_watch
        if w is not None:
            get_monitor().unregister(w)
            if w.exited_at is not None:
                now = min(now, w.exited_at)
        if self._sbx_end is None:
            self._sbx_end = now
        pgid = self._sbx_tree_pgid or self._sbx_kill_group
        if self._sbx_cgroup is not None:
            self._sbx_cgroup.kill()  # everything it left, wherever it went
        elif pgid > 0:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _internal_poll(
        self,
        _deadstate: Any = None,
        _WNOHANG: int = os.WNOHANG,
        _ECHILD: int = errno.ECHILD,
    ) -> int | None:
        # subprocess's version calls waitpid directly; route it through
        # _try_wait so rusage and leftovers are handled on every path.
        if self.returncode is None:
            if not self._waitpid_lock.acquire(False):
                return None
            try:
                if self.returncode is not None:
                    return self.returncode
                pid, sts = self._try_wait(_WNOHANG)
                if pid == self.pid:
                    self._handle_exitstatus(sts)
            except OSError as e:
                if _deadstate is not None:
                    self.returncode = _deadstate
                elif e.errno == _ECHILD:
                    self.returncode = 0
            except Exception:
                # From __del__ at interpreter shutdown, modules may be gone.
                if _deadstate is None:
                    raise
                self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """As subprocess's wait(); a sandbox whose capped output goes to a
        file, the terminal or a foreign pipe is also done passing it on."""
        end = None if timeout is None else time.monotonic() + timeout
        rc: int = super().wait(timeout)
        for pump in self._sbx_flush:
            # One deadline for the whole wait, as subprocess has.
            left = None if end is None else max(0.0, end - time.monotonic())
            if not pump.done.wait(left):
                raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        return rc

    def __exit__(self, exc_type: Any, value: Any, traceback: Any) -> None:
        try:
            super().__exit__(exc_type, value, traceback)
        finally:
            # subprocess leaves the child running on KeyboardInterrupt; a
            # sandbox must not outlive its with-block.
            if self._sbx_plan.active and self._child_created and self.returncode is None:
                self.kill_tree(grace=0)
            self.close()

    def _sbx_live_disk(self) -> int | None:
        if self._sbx_ws_fd >= 0:
            return _workspace.tmpfs_usage(self._sbx_ws_fd)[0]
        path = self._sbx_disk_path()
        return _workspace.size(path) if path is not None else None

    def _sbx_disk_path(self) -> str | None:
        """Where `disk` is measured: the private workspace, else workdir."""
        if self._sbx_workspace is not None:
            return self._sbx_workspace
        pol = self.policy
        return pol.workdir if pol is not None and self._sbx_plan.disk is not None else None

    def __del__(self) -> None:
        # A sandbox dropped without close(): its workspace goes with it
        # (subprocess's __del__ reaps it later if it still runs; then the
        # interpreter's exit removes the workspace).  At interpreter exit the
        # modules this needs may be gone already: never raise from here.
        try:
            super().__del__()
        except Exception:
            pass
        try:
            ws = self._sbx_workspace
            keep = self._sbx_plan.keep_workspace
            if ws is not None and self.returncode is not None and not keep:
                self._sbx_workspace = None
                _workspace.remove(ws)
            if not keep:  # nobody can read it any more (with keep, close() copies it out)
                self._sbx_close_tmpfs(copy_to=None)
        except Exception:
            pass

    @property
    def workspace(self) -> str | None:
        """The private workspace (the program's cwd and TMPDIR), readable
        until close(); None when the policy names a workdir or after close.

        Where ``disk`` is held by a tmpfs in the sandbox's own mount
        namespace, this is ``/proc/<our pid>/fd/<n>``: the tmpfs, reached
        through the fd the sandbox handed back (the directory of the same
        name in the caller's namespace stays empty)."""
        if self._sbx_ws_fd >= 0 and self._sbx_workspace is not None:
            return _namespaces.fd_path(self._sbx_ws_fd)
        return self._sbx_workspace

    def _sbx_close_tmpfs(self, copy_to: str | None) -> None:
        fd, self._sbx_ws_fd = self._sbx_ws_fd, -1
        if fd < 0:
            return
        try:
            if copy_to is not None:
                _namespaces.copy_out(fd, copy_to)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Remove the private workspace, unless ``keep_workdir``; the end of
        the ``with`` block calls it.  Ends the sandbox first if it runs."""
        ws = self._sbx_workspace
        if ws is None:
            return
        if self._child_created and self.returncode is None:
            self.kill_tree(grace=0)
        self._sbx_workspace = None
        keep = self._sbx_plan.keep_workspace
        try:
            self._sbx_close_tmpfs(copy_to=ws if keep else None)
        finally:
            if keep:
                _workspace.forget(ws)
            else:
                _workspace.remove(ws)

    # -- sbxlimit's additions ---------------------------------------------

    @property
    def enforced(self) -> dict[str, str]:
        """For each limit and protection asked for, the mechanism that holds
        it (``"rlimit:RLIMIT_CPU"``, ``"watchdog:wall_time"``), or
        ``"unenforced: <why>"``."""
        return {**self._sbx_plan.enforced, **self._sbx_enforced}

    def kill_tree(self, grace: float | None = None) -> None:
        """End the program and everything it started, then reap it.

        SIGTERM to the whole tree (its process group and every descendant),
        SIGKILL after `grace` seconds (default: ``limits.kill_grace``, else
        5; 0 sends SIGKILL at once).  Processes that left the tree by
        double-forking *and* changing session cannot be found without a
        cgroup (docs/SECURITY.md).
        """
        if grace is None:
            grace = self.limits.kill_grace if self.limits is not None else 5.0
        grace = parse_seconds("grace", grace, allow_zero=True)
        if not self._child_created:
            return
        # What the leader leaves in its group is killed at reap, while its
        # zombie still pins the group id (see _try_wait).
        self._sbx_kill_group = self._sbx_pgid
        if self.poll() is None:
            self._sbx_caller_kills()
            sig = signal.SIGTERM if grace > 0 else signal.SIGKILL
            signal_tree(self.pid, sig, self._sbx_pgid, self._sbx_cgroup)
            try:
                self.wait(timeout=grace if grace > 0 else None)
            except subprocess.TimeoutExpired:
                if self.poll() is None:
                    signal_tree(self.pid, signal.SIGKILL, self._sbx_pgid, self._sbx_cgroup)
                self.wait()

    def _sbx_caller_kills(self) -> None:
        """The caller ends the sandbox (kill_tree(), a cancelled asyncio
        wait): termination says so, and one `killed` event does."""
        self._sbx_kill_group = self._sbx_pgid
        if self._sbx_killed_by_caller:
            return
        self._sbx_killed_by_caller = True
        if self._sbx_plan.active and audit.active():
            audit.emit("killed", detail="kill_tree", **self._sbx_audit_fields())

    def usage(self) -> Usage:
        """What the sandbox used: live while it runs, final once reaped."""
        w = self._sbx_watch
        cg = self._sbx_cgroup
        if self.returncode is None and self._child_created and cg is not None:
            st = cg.stats(evidence=False)
            return Usage(
                cpu_user=st.cpu_user,
                cpu_system=st.cpu_system,
                memory_now=st.memory_now,
                memory_peak=st.memory_peak,
                pids_now=st.pids_now,
                pids_peak=st.pids_peak,
                wall=time.monotonic() - self._sbx_start,
                disk=self._sbx_live_disk(),
                throttled_periods=st.throttled_periods,
                throttled_seconds=st.throttled_seconds,
            )
        if self.returncode is None and self._child_created:
            now = time.monotonic()
            memory = tasks = None
            cpu_u = cpu_s = None
            if _core.HAS_PROCTREE:
                try:
                    m, t, _procs, cpu_u, cpu_s, _alive = _core.tree_sample(
                        self.pid, bool(self._sbx_plan.ns_flags & CLONE_NEWPID)
                    )
                    memory, tasks = m, t
                    if w is not None:
                        warning = w.observe(m, t)
                        if warning is not None:
                            audit.emit("resource_warning", **warning)
                except OSError:
                    pass
            return Usage(
                cpu_user=cpu_u,
                cpu_system=cpu_s,
                memory_now=memory,
                memory_peak=max(w.memory_peak, memory or 0) if w is not None else memory,
                pids_now=tasks,
                pids_peak=max(w.tasks_peak, tasks or 0) if w is not None else tasks,
                wall=now - self._sbx_start,
                disk=self._sbx_live_disk(),
            )
        return self._sbx_outcome().usage()

    @property
    def termination(self) -> Termination | None:
        """How the sandbox ended (None while it runs)."""
        if self.returncode is None or not self._child_created:
            return None
        return self._sbx_outcome().termination()

    def _sbx_outcome(self) -> Outcome:
        """The final facts, computed into Usage/Termination only when asked."""
        o = self._sbx_final
        if o is None:
            lim = self.limits
            o = self._sbx_final = Outcome(
                program=self._sbx_program,
                returncode=self.returncode if self.returncode is not None else 0,
                rusage=self._sbx_rusage,
                wall=(self._sbx_end or time.monotonic()) - self._sbx_start,
                watch=self._sbx_watch,
                limits=lim,
                enforced={**self._sbx_plan.enforced, **self._sbx_enforced},
                created=self._child_created,
                killed_by_caller=self._sbx_killed_by_caller,
                cgroup=self._sbx_cgstats,
                disk=self._sbx_disk,
                disk_full=self._sbx_disk_full,
            )
        return o


@atexit.register
def _end_at_exit() -> None:
    """Sandboxes nobody waited for, and that die with this process anyway
    (the parent-death signal comes once it is gone): end them now, while
    their cgroups can still be removed (the monitor's exit drain does it)."""
    end = time.monotonic() + 2.0
    for p in list(_dying_with_us):
        if p.returncode is not None or p._sbx_cgroup is None:
            continue
        try:
            p._sbx_cgroup.kill()
            while p.poll() is None and time.monotonic() < end:
                time.sleep(0.005)
        except Exception:  # at exit: never let one sandbox stop the rest
            pass
