"""``sbxlimit.Popen``: :class:`subprocess.Popen` with limits and a sandbox.

Everything subprocess does in the parent (argument checks, pipes, text
mode, ``communicate``, ``wait``) is subprocess's own code: this class only
replaces how the child is made (``_execute_child``) and how it is reaped
(``wait4``, for rusage), and adds ``limits``, ``policy``, ``enforced``,
``usage()``, ``termination`` and ``kill_tree()``.  What the sandbox holds
and does is its ``Sandbox`` (``_sandbox``): this class is subprocess's plus
a handle to it.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._enforcement import Enforcement
from ._evidence import Usage
from ._exit import END_PROGRAMS, at_exit
from ._limits import Limits
from ._policy import Policy
from ._quota import Quota
from ._sandbox import DEFAULT_INTERVAL, Sandbox
from ._termination import Outcome, Termination, program_name
from ._units import parse_seconds

if TYPE_CHECKING:
    from ._proxy import NetEvent

__all__ = ["Popen"]

# Running sandboxes that hold a cgroup and die with this process
# (PR_SET_PDEATHSIG): ended and cleaned up at exit, see _end_at_exit.
# Emptied in a fork's child: its parent's sandboxes are not its own.
_dying_with_us: weakref.WeakSet[Popen] = weakref.WeakSet()
# Sandboxes started from another thread with the default die_with_parent
# (no parent-death signal: it would come when that thread ends): ended at
# exit all the same, as the main thread's are by the signal.  The exit
# takes their supervisor (wall_time, the watchdogs) and their workspace.
_ended_at_exit: weakref.WeakSet[Popen] = weakref.WeakSet()


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
        sample_interval: float | str = DEFAULT_INTERVAL,
        die_with_parent: bool | None = None,
        cgroup_parent: str | None = None,
        audit_key: str | None = None,
        quota: Quota | None = None,
        warn_at: float | None = 0.9,
        **kwargs: Any,
    ) -> None:
        # subprocess.Popen.__del__ reads this if we raise before it is set.
        self._child_created = False
        sbx = self._sbx_handle()
        sbx.configure(
            limits,
            policy,
            user=kwargs.get("user"),
            group=kwargs.get("process_group"),
            cgroup_parent=cgroup_parent,
            sample_interval=sample_interval,
            die_with_parent=die_with_parent,
            audit_key=audit_key,
            warn_at=warn_at,
            quota=quota,
        )
        self.limits, self.policy = sbx.limits, sbx.policy
        try:
            super().__init__(args, *popenargs, **kwargs)
        except BaseException:
            sbx.release_quota()
            raise

    def _sbx_handle(self) -> Sandbox:
        """This Popen's Sandbox (ForkedSandbox and the asyncio layer set
        theirs up before Popen's __init__ runs)."""
        sbx = self.__dict__.get("_sbx")
        if sbx is None:
            sbx = self._sbx = Sandbox()
        return sbx

    @property
    def program(self) -> str:
        """The program's name as messages and audit events show it: the
        executable's base name, never its arguments or a shell command
        line."""
        return self._sbx.program.strip("`")

    @property
    def sandbox_id(self) -> str:
        """A short id, unique in this process, for logs and audit events."""
        return self._sbx.id

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
        sbx = self._sbx
        # The name messages and audit events use: never argv beyond it, never
        # a shell command line (both may hold secrets).
        if sbx.target is None:
            sbx.program = program_name(args, shell=shell, executable=executable)
        else:  # a forked callable: its label, nothing is executed
            sbx.program = program_name(args)
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

        def handed_over() -> None:
            self._closed_child_pipe_fds = True

        try:
            pid = sbx.spawn(
                args,
                executable,
                env=env,
                cwd=cwd,
                preexec_fn=preexec_fn,
                close_fds=close_fds,
                pass_fds=pass_fds,
                stdio=(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite),
                devnull=getattr(self, "_devnull", -1),
                restore_signals=restore_signals,
                start_new_session=start_new_session,
                process_group=process_group,
                gid=gid,
                gids=gids,
                uid=uid,
                umask=umask,
                handed_over=handed_over,
            )
        except BaseException:
            status = sbx.failed_status
            if status is not None:  # the child was made and failed before exec
                self.returncode = os.waitstatus_to_exitcode(status) if status else 0
            raise
        self.pid = pid
        self._child_created = True
        if sbx.dies_with_us and sbx.cgroup is not None:
            _dying_with_us.add(self)
        elif sbx.plan.active and not sbx.dies_with_us and sbx.die_with_parent is None:
            _ended_at_exit.add(self)
        sbx.started(pid, piped=c2pread != -1 or errread != -1)

    # -- reaping ----------------------------------------------------------

    def _try_wait(self, wait_flags: int, _getpid: Any = os.getpid) -> tuple[int, int]:
        """All callers hold self._waitpid_lock (as in subprocess): the
        Sandbox's reap (rusage, and what the leader left ended first)."""
        sbx = self._sbx
        if sbx.owner_pid != _getpid():
            # A fork's copy owns nothing: as subprocess's, it finds no such
            # child and says it exited with 0.  It never ends, reaps or
            # removes what is its parent's (a child that polls, drops or
            # leaves a with-block of its copy would kill the sandbox).
            return (self.pid, 0)
        return sbx.reap(wait_flags)

    def _handle_exitstatus(self, sts: int, *args: Any) -> None:
        super()._handle_exitstatus(sts, *args)  # type: ignore[misc]
        if self._sbx.owner_pid == os.getpid():  # a fork's copy has no quota, proxy or audit to end
            self._sbx.exited(self.returncode)

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
        for pump in self._sbx.flush:
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
            if self._sbx.plan.active and self._child_created and self.returncode is None:
                self.kill_tree(grace=0)
            self.close()

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
            sbx = self.__dict__.get("_sbx")
            if sbx is not None:
                sbx.finalize(reaped=self.returncode is not None)
        except Exception:
            pass

    @property
    def workspace(self) -> str | None:
        """The private workspace (the program's cwd and TMPDIR), readable
        until close(); None when there is none (no policy, or the policy
        names a workdir).

        Where ``disk`` is held by a tmpfs in the sandbox's own mount
        namespace, this is ``/proc/<our pid>/fd/<n>``: the tmpfs, reached
        through the fd the sandbox handed back (the directory of the same
        name in the caller's namespace stays empty).  After close() it is
        the directory's path, removed unless ``keep_workdir`` (see
        ``workspace_removed``)."""
        return self._sbx.workspace_view()

    @property
    def workspace_removed(self) -> bool:
        """True once close() (the end of the ``with`` block, or run())
        removed the private workspace; False while it is readable, when it
        is kept (``keep_workdir``), or when there is none."""
        return self._sbx.workspace_removed

    def close(self) -> None:
        """Remove the private workspace, unless ``keep_workdir``; the end of
        the ``with`` block calls it.  Ends the sandbox first if it runs."""
        if self._sbx.workspace is None:  # none, or closed already
            return
        if self._child_created and self.returncode is None:
            self.kill_tree(grace=0)
        self._sbx.close_workspace()

    # -- sbxlimit's additions ---------------------------------------------

    @property
    def enforced(self) -> dict[str, Enforcement]:
        """For each limit and protection asked for, the mechanism that holds
        it (``"rlimit:RLIMIT_CPU"``, ``"watchdog:wall_time"``), or
        ``"unenforced: <why>"``: an ``Enforcement`` (held, mechanisms, ...)."""
        return self._sbx.enforced

    def network_log(self) -> list[NetEvent]:
        """Each connection the program tried through sbxlimit's filtering
        proxy (``Policy(network="proxy", allow_domains=...)``), in order:
        ``net_denied`` ones when refused, ``net_allowed`` ones when they
        ended, with host, port and bytes (never a URL or a header).  Empty
        without that proxy."""
        return list(self._sbx.network_log())

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
        sbx = self._sbx
        if not self._child_created or sbx.owner_pid != os.getpid():
            # A fork's copy owns nothing (its wait lock may even be held by
            # a thread that the fork did not copy).
            return
        # What the leader leaves in its group is killed at reap, while its
        # zombie still pins the group id (see Sandbox.reap).
        sbx.kill_group = sbx.pgid
        if self.poll() is None:
            sbx.caller_kills()
            sbx.signal_tree(signal.SIGTERM if grace > 0 else signal.SIGKILL)
            try:
                self.wait(timeout=grace if grace > 0 else None)
            except subprocess.TimeoutExpired:
                if self.poll() is None:
                    sbx.signal_tree(signal.SIGKILL)
                self.wait()

    def usage(self) -> Usage:
        """What the sandbox used: live while it runs, final once reaped."""
        if self.returncode is None and self._child_created:
            return self._sbx.live_usage()
        return self._sbx_outcome().usage()

    @property
    def termination(self) -> Termination | None:
        """How the sandbox ended (None while it runs)."""
        if self.returncode is None or not self._child_created:
            return None
        return self._sbx_outcome().termination()

    def _sbx_closed_at_reap(self) -> None:
        """run() (sync or asyncio) closes this sandbox right after the reap:
        its workspace's size may be measured later, off its path."""
        self._sbx.closed_at_reap = not self._sbx.plan.keep_workspace

    def _sbx_outcome(self) -> Outcome:
        """The final facts (sbxlimit.run and the asyncio layer read them)."""
        rc = self.returncode if self.returncode is not None else 0
        return self._sbx.outcome(rc, created=self._child_created)


@at_exit(END_PROGRAMS)
def _end_at_exit() -> None:
    """Sandboxes nobody waited for, and that die with this process anyway
    (the parent-death signal comes once it is gone): end them now, while
    their cgroups can still be removed (the monitor's exit drain does it).
    Then those started from another thread with the default
    die_with_parent, which no signal ends: their supervisor and their
    workspace go with this process."""
    end = time.monotonic() + 2.0
    for p in list(_dying_with_us):
        cg = p._sbx.cgroup
        if p.returncode is not None or cg is None or p._sbx.owner_pid != os.getpid():
            continue
        try:
            cg.kill()
            while p.poll() is None and time.monotonic() < end:
                time.sleep(0.005)
        except Exception:  # at exit: never let one sandbox stop the rest
            pass
    for p in list(_ended_at_exit):
        if p.returncode is not None or p._sbx.owner_pid != os.getpid():
            continue
        try:
            p.kill_tree(grace=0)
        except Exception:
            pass


def _forget_after_fork() -> None:
    _dying_with_us.clear()
    _ended_at_exit.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
