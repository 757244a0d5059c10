"""Windows: the limits a Job Object holds, and one job's life.

The planners (``PLANNERS``, listed by ``_platform.planners()`` on Windows)
decide, for each field, the job limit that holds it (``"job:JobMemoryLimit"``)
or why nothing here does; they are pure, and run on every OS in the tests
(tests/test_windows.py stands in for Windows as tests/test_macos.py does
for macOS).  ``Job`` is one sandbox's job (csrc/windows/, through
``_core.job_*``): made before the program with every limit set, the program
created inside it (``_winpopen``), and a supervisor thread that reads the
job's completion port: a limit message ends the whole job (the verdict
rule: a hard limit exceeded ends the sandbox, unless tolerated), wall_time
is timed here, and ``kill()`` is TerminateJobObject.  docs/windows.md.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any, cast

from . import _platform
from ._enforcement import Enforcement
from ._evidence import Evidence, KillRecord, Usage
from ._plan import Plan, Request
from ._supervisor import plan_no_pid_namespace, plan_output
from ._termination import Outcome
from ._workspace import plan_workdir, plan_workspace

if sys.platform == "win32":
    from . import _core
else:  # the planners run everywhere (the tests); a job only on Windows
    _core: Any = None

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._cgroup import Site
    from ._limits import Limits
    from ._policy import Policy

    Planner = Callable[[Plan, Request], None]

__all__ = [
    "ERROR_NOT_ENOUGH_QUOTA",
    "KILL_EXIT_CODE",
    "MECHANISMS",
    "PLANNERS",
    "Job",
    "JobLimits",
    "OutputPump",
    "env_block",
    "job_limits",
    "plan",
    "tree_size",
]

# What holds each field: the job's own limit, by the name Windows gives it.
MECHANISMS = {
    "memory": "job:JobMemoryLimit",
    "pids": "job:ActiveProcessLimit",
    "cpu_time": "job:PerJobUserTimeLimit",
    "cpu": "job:CpuRateControl",
    "die_with_parent": "job:KILL_ON_JOB_CLOSE",
    "breakaway": "job:no BREAKAWAY_OK",
}
# The exit status Windows gives every process of a job at its user-time limit.
ERROR_NOT_ENOUGH_QUOTA = 1816
# The exit status of a process the supervisor or kill_tree() ends (as
# subprocess's terminate() gives).
KILL_EXIT_CODE = 1

_NEXT_STEP = "an AppContainer or a restricted token, docs/windows.md: not built yet"


# -- the planners -------------------------------------------------------------


def plan_memory(p: Plan, r: Request) -> None:
    if r.limits is None or r.limits.memory is None or not p.takes("memory"):
        return
    p.hold(
        "memory",
        MECHANISMS["memory"],
        "memory committed by every process of the job: an allocation past it is refused",
    )


def plan_pids(p: Plan, r: Request) -> None:
    if r.limits is None or r.limits.pids is None or not p.takes("pids"):
        return
    p.hold("pids", MECHANISMS["pids"], "processes alive at once; threads are not counted")


def plan_cpu_time(p: Plan, r: Request) -> None:
    if r.limits is None or r.limits.cpu_time is None or not p.takes("cpu_time"):
        return
    p.hold(
        "cpu_time",
        MECHANISMS["cpu_time"],
        "user time of every process the job has had; kernel time is not counted",
    )


def plan_cpu(p: Plan, r: Request) -> None:
    if r.limits is None or r.limits.cpu is None or not p.takes("cpu"):
        return
    p.hold("cpu", MECHANISMS["cpu"], "hard cap (Windows 8 and later)")


def plan_wall_time(p: Plan, r: Request) -> None:
    if r.limits is None or r.limits.wall_time is None or not p.takes("wall_time"):
        return
    p.wall_time = r.limits.wall_time
    p.hold("wall_time", "watchdog:wall_time", "the job is terminated at once: no SIGTERM first")


def plan_disk(p: Plan, r: Request) -> None:
    """The workspace's size, sampled by the job's supervisor: the private
    one (made for it, as on POSIX), or workdir."""
    if r.limits is None or r.limits.disk is None or not p.takes("disk"):
        return
    p.disk = r.limits.disk
    p.hold(
        "disk",
        "watchdog:disk",
        "the workspace's file sizes, sampled; a burst between samples can pass the cap before "
        "the kill",
    )
    if r.policy is None or r.policy.workdir is None:
        p.workspace = True


def plan_unheld(p: Plan, r: Request) -> None:
    """The limits no job field holds, and why."""
    lim = r.limits
    if lim is None:
        return
    why = {
        "open_files": "Windows has no per-process handle limit that a job can set",
        "file_size": "Windows has no per-file size limit (RLIMIT_FSIZE has no counterpart)",
        "address_space": "a job limits committed memory (memory), not address space",
    }
    for field, reason in why.items():
        if getattr(lim, field) is not None and p.takes(field):
            p.downgrade(field, reason)


def plan_job(p: Plan, r: Request) -> None:
    """What every sandbox's job holds, asked or not."""
    del r
    p.hold("die_with_parent", MECHANISMS["die_with_parent"], "the job dies with its last handle")


def plan_files(p: Plan, r: Request) -> None:
    """File and network rules need an AppContainer or a restricted token."""
    policy = r.policy
    if policy is None:
        return
    p.downgrade("files", f"no file rules on Windows without {_NEXT_STEP}")
    if policy.protect_dotfiles:
        p.downgrade("protect_dotfiles", f"no file rules on Windows without {_NEXT_STEP}")
    if policy.network != "allow":
        p.downgrade(
            "network",
            "denying the network on Windows needs an AppContainer without the internetClient "
            f"capability or a firewall rule (administrator); {_NEXT_STEP}",
        )
    if policy.unix_sockets:
        p.downgrade("unix_sockets", f"no rule for Unix sockets on Windows without {_NEXT_STEP}")


def plan_env(p: Plan, r: Request) -> None:
    policy = r.policy
    if policy is None:
        return
    env = "allow-list" if policy.env != "sanitize" else "sanitized"
    if policy.drop_secrets:
        env += "; names with KEY, SECRET, TOKEN or PASSWORD dropped"
    p.hold("env", "supervisor:env", env)


def plan_harden(p: Plan, r: Request) -> None:
    if r.policy is None or not r.policy.harden:
        return
    p.hold("breakaway", MECHANISMS["breakaway"], "every process it starts is in the job")
    p.downgrade("no_new_privs", f"Windows has no no_new_privs; {_NEXT_STEP}")


def plan_terminal(p: Plan, r: Request) -> None:
    if r.policy is None:
        return
    if r.policy.terminal:
        p.hold("terminal", "shared: Policy(terminal=True)")
        return
    p.downgrade(
        "terminal", "the program shares the caller's console (no session of its own on Windows)"
    )


PLANNERS: tuple[Planner, ...] = (
    plan_memory,
    plan_pids,
    plan_cpu_time,
    plan_cpu,
    plan_wall_time,
    plan_disk,
    plan_output,
    plan_unheld,
    plan_job,
    plan_workspace,
    plan_workdir,
    plan_files,
    plan_no_pid_namespace,
    plan_env,
    plan_harden,
    plan_terminal,
)


@dataclasses.dataclass(frozen=True, slots=True)
class _NoCgroup:
    """Request.site on Windows: there is no cgroup to consider."""

    version: int = 0
    reason: str = "Windows has no cgroups: a Job Object holds the limits"


def plan(limits: Limits | None, policy: Policy | None) -> Plan:
    """The plan of one Windows sandbox (``_plan.plan``'s counterpart: no
    rlimits to clamp, no cgroup site), from the planners the platform layer
    lists for Windows."""
    p = Plan(active=limits is not None or policy is not None)
    if not p.active:
        return p
    if limits is not None:
        p.kill_grace = limits.kill_grace
        p.tolerate = limits.tolerate
    r = Request(limits, policy, 0, False, cast("Site", _NoCgroup()), "")
    for planner in _platform.planners():
        planner(p, r)
    return p


# -- what the job is made with -------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class JobLimits:
    """The job's fields (0: none), from a plan: only what it holds."""

    memory: int = 0  # bytes
    pids: int = 0
    cpu_time_100ns: int = 0
    cpu_millicores: int = 0


def _held_by_job(p: Plan, field: str) -> bool:
    held = p.held.get(field)
    return held is not None and str(held).startswith(MECHANISMS[field])


def job_limits(p: Plan, limits: Limits | None) -> JobLimits:
    """The job's fields for a plan: a field the plan gave to the job, and
    nothing it did not."""
    if limits is None:
        return JobLimits()
    return JobLimits(
        memory=limits.memory or 0 if _held_by_job(p, "memory") else 0,
        pids=limits.pids or 0 if _held_by_job(p, "pids") else 0,
        # At least one tick: 0 would mean "no limit".
        cpu_time_100ns=max(1, round((limits.cpu_time or 0) * 10_000_000))
        if _held_by_job(p, "cpu_time")
        else 0,
        cpu_millicores=limits.cpu or 0 if _held_by_job(p, "cpu") else 0,
    )


def tree_size(path: str) -> int:
    """Bytes of the files under path (links not followed).  Not
    ``_workspace.size``: Windows's stat has no st_blocks."""
    total = 0
    stack = [path]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    return total


def env_block(env: dict[str, str]) -> str:
    """CreateProcessW's Unicode environment block: "K=V\\0" each, sorted as
    Windows sorts it (case-insensitively), then a final NUL."""
    items = []
    for k, v in env.items():
        k, v = os.fsdecode(k), os.fsdecode(v)
        if "\0" in k or "\0" in v or "=" in k[1:] or not k:
            # subprocess's own check (a leading '=' is Windows's =C: kind).
            raise ValueError(f"illegal environment variable name or value: {k!r}")
        items.append((k.upper(), k, v))
    items.sort()
    return "".join(f"{k}={v}\0" for _u, k, v in items) + "\0" * (2 if not items else 1)


class OutputPump:
    """One output stream, child -> pump -> its destination, counted: past
    `cap` the rest is discarded (after a mark, with `truncate`) or
    `over(stream, written)` ends the sandbox.  A thread of its own: Windows
    cannot select() on pipes.  `src` and `dst` are unbuffered binary files,
    closed at the end (the destination's reader then sees EOF)."""

    def __init__(
        self,
        src: IO[bytes],
        dst: IO[bytes],
        *,
        cap: int,
        truncate: bool,
        stream: str,
        over: Callable[[str, int], None],
    ) -> None:
        self.src, self.dst = src, dst
        self.cap, self.truncate, self.stream, self.over = cap, truncate, stream, over
        self.count = 0  # bytes the program wrote
        self.passed = 0  # bytes passed on
        self.discarding = False
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sbxlimit-{stream}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        from ._pump import _MARK, _utf8_cut

        try:
            while True:
                try:
                    data = self.src.read(65536)
                except OSError:  # the write end is gone (ERROR_BROKEN_PIPE)
                    break
                if not data:
                    break
                self.count += len(data)
                if self.discarding:
                    continue
                room = self.cap - self.passed
                if len(data) <= room:
                    self._write(data)
                    continue
                self._write(_utf8_cut(data[:room]))
                self.discarding = True
                if self.truncate:
                    self._write(_MARK % self.cap)
                else:
                    self.over(self.stream, self.count)
        finally:
            for f in (self.dst, self.src):
                try:
                    f.close()
                except OSError:
                    pass
            self.done.set()

    def _write(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                n = self.dst.write(view) or 0
                view = view[n:]
            self.passed += len(data)
        except OSError:  # nobody reads any more: count on, pass nothing
            self.discarding = True


# -- one job -------------------------------------------------------------------


class Job:
    """One sandbox's Job Object and the thread that reads its port.

    The verdict's evidence is gathered here: `kill` (the first limit that
    ended the job, as the POSIX supervisor's KillRecord), `hits` (every
    limit message seen), and the final usage, read before the job closes.
    """

    def __init__(self, limits: Limits | None, plan: Plan, program: str) -> None:
        self.limits = limits
        self.plan = plan
        self.program = program
        self.job_limits = job_limits(plan, limits)
        jl = self.job_limits
        self.handle, self.cpu_rate, self.cpu_rate_error = _core.job_create(
            jl.memory, jl.pids, jl.cpu_time_100ns, jl.cpu_millicores
        )
        self.how = 0  # _core.JOB_HOW_* once the program is in it
        self.kill: KillRecord | None = None
        self.hits: set[str] = set()
        self.killed_by_caller = False
        self.started = 0.0
        self.ended: float | None = None
        # The disk watchdog: the directory, how often, and its last size.
        self.watch_dir: str | None = None
        self.interval = 0.1
        self.disk: int | None = None
        self.final: Usage | None = None
        self._lock = threading.Lock()
        self._empty = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.closed = False

    # -- while it runs ---------------------------------------------------------

    def start(self, how: int) -> None:
        """The program is in the job: time it and read the port."""
        self.how = how
        self.started = time.monotonic()
        self._thread = threading.Thread(
            target=self._supervise, name=f"sbxlimit-job-{self.program}", daemon=True
        )
        self._thread.start()

    def _supervise(self) -> None:
        core = _core
        deadline = None if self.plan.wall_time is None else self.started + self.plan.wall_time
        sample = self.started if self.plan.disk is not None and self.watch_dir else None
        while not self._stop:
            wait = 0.1  # how soon a stop is seen
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            if sample is not None:
                if time.monotonic() >= sample:
                    sample = self._sample_disk(sample)
                if sample is not None:
                    wait = max(0.0, min(wait, sample - time.monotonic()))
            try:
                event = core.job_next_event(self.handle, int(wait * 1000))
            except (OSError, ValueError):  # the job was closed under us
                break
            # Checked after every message too: a stream of them (a fork
            # loop's) must not hold the deadline off.
            if deadline is not None and time.monotonic() >= deadline:
                self._end("wall_time", self.plan.wall_time, time.monotonic() - self.started)
                deadline = None
            if event is None:
                continue
            msg, _pid = event
            reason = core.job_msg_reason(msg)
            if reason is not None:
                self._hit(reason)
            elif msg == core.JOB_MSG_ACTIVE_PROCESS_ZERO:
                self.ended = time.monotonic()
                self._empty.set()
                break

    def output_over(self, stream: str, written: int) -> None:
        """An output pump passed its cap: the job ends (reason output)."""
        self.hits.add("output")
        self._end("output", self.plan.output, written, stream)

    def _sample_disk(self, at: float) -> float | None:
        """Measure the workspace; past the cap the job ends (unless
        tolerated).  The next sample's time, None when done."""
        assert self.watch_dir is not None and self.plan.disk is not None
        self.disk = tree_size(self.watch_dir)
        if self.disk <= self.plan.disk:
            return max(at + self.interval, time.monotonic())
        self.hits.add("disk")
        if "disk" in self.plan.tolerate:
            return max(at + self.interval, time.monotonic())
        self._end("disk", self.plan.disk, self.disk)
        return None

    def _hit(self, reason: str) -> None:
        """A limit message: hit, and the end of the job unless tolerated
        (END_OF_JOB_TIME: Windows has ended it already)."""
        self.hits.add(reason)
        lim = self.limits
        if lim is None or (reason in lim.tolerate and reason != "cpu_time"):
            return
        limit: float | int | None = getattr(lim, reason)
        observed: float | int | None = None
        try:
            u = _core.job_usage(self.handle)
            observed = {"memory": u[8], "pids": u[3], "cpu_time": u[0] / 1e7}.get(reason)
        except OSError:
            pass
        # pids: Windows refused the process that would pass the limit.
        self._end(reason, limit, observed, "1" if reason == "pids" else "")

    def _end(
        self,
        reason: str,
        limit: float | int | None,
        observed: float | int | None,
        detail: str = "",
    ) -> None:
        with self._lock:
            if self.kill is None:
                held = self.plan.held.get(reason)
                mech = getattr(held, "mechanism", reason)
                self.kill = KillRecord(reason, limit, observed, mech, detail)
        self.terminate()

    def terminate(self) -> None:
        """TerminateJobObject: every process of the job, at once."""
        try:
            _core.job_kill(self.handle, KILL_EXIT_CODE)
        except (OSError, ValueError):  # ended already, or closed
            pass

    def caller_kills(self) -> None:
        self.killed_by_caller = self.kill is None
        self.terminate()

    def usage(self) -> Usage:
        """What the job used, live (final once finished)."""
        if self.final is not None:
            return self.final
        return self._usage(time.monotonic())

    def _usage(self, now: float) -> Usage:
        wall = (self.ended or now) - self.started if self.started else 0.0
        try:
            u = _core.job_usage(self.handle)
        except (OSError, ValueError):
            return Usage(wall=wall, disk=self.disk)
        user, kernel, _total, active = u[0], u[1], u[2], u[3]
        return Usage(
            cpu_user=user / 1e7,
            cpu_system=kernel / 1e7,
            memory_peak=u[8] or None,
            pids_now=active,
            wall=wall,
            disk=self.disk,
        )

    # -- the end ---------------------------------------------------------------

    def finish(self, returncode: int) -> None:
        """The program (the job's first process) has exited: whatever it
        left in the job ends with it, the port is drained, the usage read,
        and the job closed.  Called once, on the reaping thread."""
        if self.closed:
            return
        if not self._empty.is_set():
            self.terminate()  # the sandbox ends with its program, as on POSIX
            self._empty.wait(5.0)
        self._stop = True
        if self._thread is not None:
            self._thread.join(5.0)
        if self.ended is None:
            self.ended = time.monotonic()
        if self.watch_dir is not None and self.plan.disk is not None:
            self.disk = tree_size(self.watch_dir)  # what it left
        if (
            self.limits is not None
            and self.limits.cpu_time is not None
            and self.kill is None
            and returncode == ERROR_NOT_ENOUGH_QUOTA
        ):
            # Windows ends every process of the job at its user-time limit
            # with this status and posts nothing (TERMINATE_AT_END_OF_JOB):
            # the job's own count proves it.
            try:
                if _core.job_cpu_time_reached(self.handle):
                    self.hits.add("cpu_time")
                    used = _core.job_usage(self.handle)[0] / 1e7
                    self.kill = KillRecord(
                        "cpu_time", self.limits.cpu_time, used, MECHANISMS["cpu_time"]
                    )
            except OSError:
                pass
        self.final = self._usage(self.ended)
        self.close()

    def outcome(self, returncode: int, enforced: dict[str, Enforcement]) -> Outcome:
        """The verdict's evidence, as ``_termination`` decides from it: the
        job's kill record and hits, and its usage (no rusage here)."""
        u = self.usage()
        evidence = Evidence(
            program=self.program,
            returncode=returncode,
            created=True,
            wall=u.wall,
            kill=self.kill,
            hits=frozenset(self.hits),
            killed_by_caller=self.killed_by_caller,
            disk=self.disk,
        )
        outcome = Outcome(evidence, self.limits, enforced)
        outcome._usage = u
        return outcome

    def close(self) -> None:
        """Close the job (KILL_ON_JOB_CLOSE: nothing of it survives)."""
        if self.closed:
            return
        self.closed = True
        self._stop = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        _core.job_close(self.handle)
