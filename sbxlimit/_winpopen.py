"""``sbxlimit.Popen`` on Windows: :class:`subprocess.Popen` whose program is
born inside a Job Object (``_winjob``, csrc/windows/).

Everything subprocess does in the parent (its handles and pipes, text
mode, ``communicate``, ``wait``, ``creationflags``, ``startupinfo``) is
subprocess's own code: this class replaces only the ``CreateProcess`` of
``_execute_child`` with the core's spawn into the job, given subprocess's
own prepared arguments, and adds ``limits``, ``policy``, ``enforced``,
``usage()``, ``termination`` and ``kill_tree()``.  Without limits and
policy it is subprocess's Popen, plus ``usage`` and ``termination``.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from ._enforcement import Enforcement
from ._errors import ConfigError, UnsupportedError
from ._evidence import Evidence, Usage
from ._limits import Limits
from ._plan import Plan, warn_downgrades
from ._policy import Policy
from ._termination import Outcome, Termination, program_name
from ._units import parse_seconds
from ._winjob import Job, OutputPump, env_block, plan

if sys.platform == "win32":
    import _winapi
    import msvcrt

    from . import _core
else:  # imported everywhere (mypy, the tests' imports); used on Windows only
    _winapi: Any = None
    msvcrt: Any = None
    _core: Any = None

__all__ = ["Popen"]

_ids = itertools.count(1)
STARTF_USESHOWWINDOW = 0x1


class Popen(subprocess.Popen):  # type: ignore[type-arg]
    """A drop-in :class:`subprocess.Popen` that runs the program in a Job
    Object holding its limits (docs/windows.md).

    The keyword-only arguments are those of the POSIX ``Popen``
    (``limits``, ``policy``, ...); ``die_with_parent`` is always true here
    (the job dies with its last handle, this process's), and
    ``cgroup_parent`` has nothing to choose; ``sample_interval`` is the
    disk watchdog's.
    With limits or a policy, the program inherits its standard handles and
    ``startupinfo.lpAttributeList["handle_list"]``, never every
    inheritable handle (``close_fds=False`` has no effect).
    """

    limits: Limits | None = None
    policy: Policy | None = None

    def __init__(
        self,
        args: Any,
        *popenargs: Any,
        limits: Limits | Mapping[str, Any] | None = None,
        policy: Policy | Mapping[str, Any] | None = None,
        sample_interval: float | str | None = None,
        die_with_parent: bool | None = None,
        cgroup_parent: str | None = None,
        audit_key: str | None = None,
        quota: Any = None,
        warn_at: float | None = 0.9,
        **kwargs: Any,
    ) -> None:
        # subprocess.Popen.__del__ reads this if we raise before it is set.
        self._child_created = False
        self._job: Job | None = None
        self._reaped = False
        self._reap_lock = threading.Lock()
        self._id = f"{os.getpid():x}-w{next(_ids)}"
        self._program = ""
        self._workspace: str | None = None
        self._workspace_removed = False
        self._started = time.monotonic()
        self._wall: float | None = None
        self._pumps: list[OutputPump] = []
        self._child_ends: list[int] = []  # the pumps' pipe ends the child inherits
        del warn_at, audit_key  # no memory warning to give here, no audit events yet
        self._interval = 0.1
        if sample_interval is not None:
            self._interval = parse_seconds("sample_interval", sample_interval)
        if die_with_parent is False:
            raise ConfigError(
                "die_with_parent",
                False,
                "on Windows the job dies with its last handle (KILL_ON_JOB_CLOSE): a sandbox "
                "never outlives this process",
            )
        if cgroup_parent not in (None, "none"):
            raise ConfigError("cgroup_parent", cgroup_parent, "Windows has no cgroups")
        if quota is not None:
            raise ConfigError("quota", quota, "quotas are not implemented on Windows yet")
        self.limits = Limits.coerce(limits)
        self.policy = Policy.coerce(policy)
        self._plan: Plan = plan(self.limits, self.policy)
        p = self._plan
        if self.policy is not None and self.policy.strict and (p.downgrades or p.fallbacks):
            raise UnsupportedError({**p.fallbacks, **p.downgrades})
        if p.downgrades:
            warn_downgrades(p)
        super().__init__(args, *popenargs, **kwargs)

    @property
    def program(self) -> str:
        return self._program.strip("`")

    @property
    def sandbox_id(self) -> str:
        return self._id

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
        p2cread: Any,
        p2cwrite: Any,
        c2pread: Any,
        c2pwrite: Any,
        errread: Any,
        errwrite: Any,
        *unused: Any,
    ) -> None:
        self._program = program_name(args, shell=shell, executable=executable)
        if not self._plan.active:
            super()._execute_child(  # type: ignore[misc]
                args,
                executable,
                preexec_fn,
                close_fds,
                pass_fds,
                cwd,
                env,
                startupinfo,
                creationflags,
                shell,
                p2cread,
                p2cwrite,
                c2pread,
                c2pwrite,
                errread,
                errwrite,
                *unused,
            )
            self._started = time.monotonic()
            return
        try:
            self._spawn_in_job(
                args,
                executable,
                cwd,
                env,
                startupinfo,
                creationflags,
                shell,
                p2cread,
                c2pwrite,
                errwrite,
            )
        finally:
            # As subprocess does: the child's ends are the child's now.
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]

    def _spawn_in_job(
        self,
        args: Any,
        executable: Any,
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: int,
        shell: bool,
        p2cread: Any,
        c2pwrite: Any,
        errwrite: Any,
    ) -> None:
        """subprocess's preparation of CreateProcess's arguments (3.11-3.13),
        then the core's spawn into the job instead of _winapi.CreateProcess."""

        if isinstance(args, str):
            pass
        elif isinstance(args, bytes):
            if shell:
                raise TypeError("bytes args is not allowed on Windows")
            args = subprocess.list2cmdline([args])
        elif isinstance(args, os.PathLike):
            if shell:
                raise TypeError("path-like args is not allowed when shell is true")
            args = subprocess.list2cmdline([args])
        else:
            args = subprocess.list2cmdline(args)
        if executable is not None:
            executable = os.fsdecode(executable)
        startup_flags, show_window = 0, 0
        handles: list[int] = []
        if startupinfo is not None:
            startup_flags = int(startupinfo.dwFlags)
            show_window = int(startupinfo.wShowWindow)
            handles = list((startupinfo.lpAttributeList or {}).get("handle_list", []))
        if shell:
            startup_flags |= STARTF_USESHOWWINDOW
            show_window = _winapi.SW_HIDE
            if not executable:
                comspec = os.environ.get("ComSpec")  # noqa: SIM112  (subprocess's spelling)
                if not comspec:
                    system_root = os.environ.get("SystemRoot", "")  # noqa: SIM112
                    comspec = os.path.join(system_root, "System32", "cmd.exe")
                    if not os.path.isabs(comspec):
                        raise FileNotFoundError(
                            "shell not found: neither %ComSpec% nor %SystemRoot% is set"
                        )
                if os.path.isabs(comspec):
                    executable = comspec
            else:
                comspec = executable
            args = f'{comspec} /c "{args}"'

        job = Job(self.limits, self._plan, self._program)
        if job.cpu_rate_error is not None:
            # Known once the job exists, still before the program does.
            step, code = job.cpu_rate_error
            self._plan.downgrade("cpu", f"{step} failed with Windows error {code}")
            if self.policy is not None and self.policy.strict:
                job.close()
                raise UnsupportedError(dict(self._plan.downgrades))
        try:
            pol = self.policy
            if self._plan.workspace:
                from . import _workspace

                self._workspace = _workspace.create(self._id, keep=self._plan.keep_workspace)
            if pol is not None:
                env = pol.filter_env(os.environ if env is None else env)
            if self._workspace is not None:
                tmp = os.path.join(self._workspace, "tmp")
                env = {**(os.environ if env is None else env), "TMP": tmp, "TEMP": tmp}
            if cwd is None:
                cwd = (pol.workdir if pol is not None else None) or self._workspace
            job.interval = self._interval
            job.watch_dir = (pol.workdir if pol is not None else None) or self._workspace
            if cwd is not None:
                cwd = os.fsdecode(cwd)
            block = None if env is None else env_block(dict(env))
            sys.audit("subprocess.Popen", executable, args, cwd, env)

            # As subprocess: the three handles, or none (one is missing when
            # this process has no console: the child then gets the defaults).
            trio = (p2cread, c2pwrite, errwrite)
            std: list[int | None] = [None] * 3 if -1 in trio else [int(h) for h in trio]
            if self._plan.output is not None and std[1] is not None:
                std[1], std[2] = self._pumped(job, std[1], std[2])
            hp, ht, pid, _tid, how = job_spawn(
                job,
                executable,
                args,
                cwd,
                block,
                std,
                handles,
                creationflags,
                startup_flags,
                show_window,
            )
        except BaseException:
            job.close()
            for pump in self._pumps:  # never started: their ends go now
                pump.src.close()
                pump.dst.close()
            self._pumps = []
            self.close()  # the workspace, if one was made
            raise
        finally:
            for h in self._child_ends:  # the child has its copies
                _winapi.CloseHandle(h)
            self._child_ends = []
        for pump in self._pumps:
            pump.start()
        self._job = job
        self._child_created = True
        self._handle = subprocess.Handle(hp)  # type: ignore[attr-defined]
        self.pid = pid
        _winapi.CloseHandle(ht)
        self._started = time.monotonic()
        job.start(how)

    def _pumped(self, job: Job, out: int, err: int | None) -> tuple[int, int | None]:
        """stdout and stderr through an OutputPump each (one when stderr is
        stdout): the child gets a pipe of ours, the pump passes what comes
        out on to the destination subprocess prepared (a duplicate: its
        own is closed after the spawn), up to the cap."""
        assert self._plan.output is not None
        me = _winapi.GetCurrentProcess()
        given: dict[int, int] = {}
        for h, stream in ((out, "stdout"), (err, "stderr")):
            if h is None or h in given:
                continue
            r, w = _winapi.CreatePipe(None, 0)
            w_child = _winapi.DuplicateHandle(me, w, me, 0, True, _winapi.DUPLICATE_SAME_ACCESS)
            _winapi.CloseHandle(w)
            self._child_ends.append(w_child)
            dst = _winapi.DuplicateHandle(me, h, me, 0, False, _winapi.DUPLICATE_SAME_ACCESS)
            self._pumps.append(
                OutputPump(
                    os.fdopen(msvcrt.open_osfhandle(r, os.O_RDONLY), "rb", buffering=0),
                    os.fdopen(msvcrt.open_osfhandle(dst, 0), "wb", buffering=0),
                    cap=self._plan.output,
                    truncate=self._plan.truncate_output,
                    stream=stream,
                    over=job.output_over,
                )
            )
            given[h] = w_child
        return given[out], None if err is None else given[err]

    def wait(self, timeout: float | None = None) -> int:
        """As subprocess's wait(); with an output cap, also until what the
        program wrote has been passed on."""
        end = None if timeout is None else time.monotonic() + timeout
        rc: int = super().wait(timeout)
        for pump in self._pumps:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not pump.done.wait(left):
                raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        return rc

    # -- reaping ----------------------------------------------------------

    def _internal_poll(self, *args: Any, **kwargs: Any) -> int | None:
        rc: int | None = super()._internal_poll(*args, **kwargs)  # type: ignore[misc]
        if rc is not None:
            self._sbx_reaped(rc)
        return rc

    def _wait(self, timeout: float | None) -> int:
        rc: int = super()._wait(timeout)  # type: ignore[misc]
        self._sbx_reaped(rc)
        return rc

    def _sbx_reaped(self, returncode: int) -> None:
        """The program exited: the job ends with it (once)."""
        with self._reap_lock:
            if self._reaped:
                return
            self._reaped = True
            self._wall = time.monotonic() - self._started
            if self._job is not None:
                self._job.finish(returncode)

    def __exit__(self, exc_type: Any, value: Any, traceback: Any) -> None:
        try:
            super().__exit__(exc_type, value, traceback)
        finally:
            if self._plan.active and self._child_created and self.returncode is None:
                self.kill_tree(grace=0)
            self.close()

    @property
    def workspace(self) -> str | None:
        """The private workspace (cwd, TMP and TEMP), until close()."""
        return None if self._workspace_removed else self._workspace

    @property
    def workspace_removed(self) -> bool:
        return self._workspace_removed

    def close(self) -> None:
        """End the sandbox if it runs, then remove the private workspace
        unless ``keep_workdir``."""
        if self._child_created and self.returncode is None and self._plan.active:
            self.kill_tree(grace=0)
        ws = self._workspace
        if ws is not None and not self._workspace_removed and not self._plan.keep_workspace:
            from . import _workspace

            _workspace.remove(ws)
            self._workspace_removed = True

    # -- sbxlimit's additions ---------------------------------------------

    @property
    def enforced(self) -> dict[str, Enforcement]:
        return self._plan.enforced

    def network_log(self) -> list[Any]:
        """Always empty: there is no filtering proxy on Windows yet."""
        return []

    def kill_tree(self, grace: float | None = None) -> None:
        """End the program and everything it started: TerminateJobObject,
        at once (Windows has no SIGTERM for a tree: `grace` is not waited),
        then reap it.  Without limits or policy, the program alone."""
        del grace
        if not self._child_created:
            return
        if self.poll() is None:
            if self._job is not None:
                self._job.caller_kills()
            else:
                self.kill()
            self.wait()

    def usage(self) -> Usage:
        """What the job used: live while it runs, final once reaped."""
        job = self._job
        if job is not None:
            return job.usage()
        wall = self._wall if self._wall is not None else time.monotonic() - self._started
        return Usage(wall=wall)

    @property
    def termination(self) -> Termination | None:
        if self.returncode is None or not self._child_created:
            return None
        return self._sbx_outcome().termination()

    def _sbx_closed_at_reap(self) -> None:
        """As _popen's (the job measures its directory at the exit)."""

    def _sbx_outcome(self) -> Outcome:
        rc = self.returncode if self.returncode is not None else 0
        if self._job is not None:
            return self._job.outcome(rc, self.enforced)
        u = self.usage()
        evidence = Evidence(self._program, rc, self._child_created, u.wall)
        outcome = Outcome(evidence, self.limits, self.enforced)
        outcome._usage = u
        return outcome


def job_spawn(
    job: Job,
    executable: str | None,
    args: str,
    cwd: str | None,
    block: str | None,
    std: list[int | None],
    handles: list[int],
    creationflags: int,
    startup_flags: int,
    show_window: int,
) -> tuple[int, int, int, int, int]:
    """The core's spawn into `job` (Windows only)."""
    spawned: tuple[int, int, int, int, int] = _core.job_spawn(
        job.handle,
        executable,
        args,
        cwd,
        block,
        std[0],
        std[1],
        std[2],
        [int(h) for h in handles],
        creationflags,
        startup_flags,
        show_window,
    )
    return spawned
