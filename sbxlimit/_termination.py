"""How a sandbox ended: ``Termination``, decided from its evidence.

``classify`` is the one place that decides the reason from the evidence
(``_evidence.Evidence``): the wait status, the rusage, what the supervisor
did (its kill record), the cgroup's counters.
Messages are for people: which limit, how much was used, by which mechanism,
what to do.  They never contain argv beyond the program's name, environment
values or program output.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal as _signal
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, get_args

from ._enforcement import Enforcement
from ._evidence import Evidence, KillRecord, Usage, usage
from ._plan import Holder
from ._units import format_bytes, format_seconds

if TYPE_CHECKING:
    from ._cgroup import CgroupStats
    from ._limits import Limits

__all__ = [
    "LIMIT_REASONS",
    "REASONS",
    "KillRecord",
    "Outcome",
    "Reason",
    "Termination",
    "Usage",
    "classify",
    "program_name",
]

# Termination.reason, for type checkers; REASONS is the same, in order.
Reason = Literal[
    "exited",
    "signaled",
    "memory",
    "cpu_time",
    "cpu",
    "pids",
    "file_size",
    "disk",
    "wall_time",
    "output",
]
REASONS: tuple[Reason, ...] = get_args(Reason)
# Reasons that mean "a limit ended it"; run(check=True) raises LimitExceeded.
LIMIT_REASONS: frozenset[Reason] = frozenset(
    {"memory", "cpu_time", "pids", "file_size", "disk", "wall_time", "output"}
)


@dataclasses.dataclass(frozen=True, slots=True)
class Termination:
    """How a sandbox ended.

    Attributes:
        reason: one of ``exited``, ``signaled``, ``memory``, ``cpu_time``,
            ``cpu`` (never a kill reason: throttling only), ``pids``,
            ``file_size``, ``disk``, ``wall_time``, ``output`` (``Reason``).
        limit: the limit that ended it (bytes, seconds, count), else None.
        observed: how much was used when it ended, else None.
        mechanism: what held the limit (``"rlimit:RLIMIT_CPU"``), else None.
        message: one paragraph for people: what, how much, what to do.
        returncode: as ``Popen.returncode`` (negative: killed by that signal).
        signal: the signal that ended the program, if one did.
        hits: every limit that was hit at least once (the program may have
            survived some: a truncated output, a refused fork).
    """

    reason: Reason
    limit: float | int | None
    observed: float | int | None
    mechanism: str | None
    message: str
    returncode: int | None
    signal: int | None = None
    hits: tuple[Reason, ...] = ()

    @property
    def is_limit(self) -> bool:
        """True when a limit ended the program."""
        return self.reason in LIMIT_REASONS

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["hits"] = list(self.hits)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Termination:
        """The inverse of ``to_dict()`` (after a JSON round trip too); keys
        it does not know are ignored (a newer version's)."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in d.items() if k in known}
        fields["reason"] = _reason(fields.get("reason"))
        fields["hits"] = tuple(_reason(h) for h in fields.get("hits", ()))
        return cls(**fields)


def _reason(value: object) -> Reason:
    if value not in REASONS:
        raise ValueError(f"not a termination reason: {value!r} (one of {', '.join(REASONS)})")
    return value


_PLAIN_WORD = re.compile(r"[\w.+/-]+")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def program_name(args: Any, *, shell: bool = False, executable: Any = None) -> str:
    """The program's name only, for messages and audit events: argv beyond
    it may hold secrets, and so may a shell command line (``TOKEN=... cmd``,
    a pipeline, a script).  With ``shell=True`` the name is the first
    command word that is not an assignment, if it is a plain word, else the
    shell's name; ``executable=`` names the program that really runs."""
    if shell:
        line = os.fsdecode(args if isinstance(args, (str, bytes)) else (args[0] if args else ""))
        words = line.split()
        while words and _ASSIGNMENT.match(words[0]):
            words.pop(0)
        if words and _PLAIN_WORD.fullmatch(words[0]):
            first = words[0]
        else:
            first = os.fsdecode(executable) if executable is not None else "/bin/sh"
    elif executable is not None:
        first = os.fsdecode(executable)
    elif isinstance(args, (str, bytes, os.PathLike)):
        first = os.fsdecode(args)
    else:
        first = os.fsdecode(args[0]) if args else ""
    name = os.path.basename(first)
    return f"`{name}`" if name else "the program"


def _signame(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _amount(reason: str, value: float | int | None) -> str:
    if value is None:
        return "an unknown amount"
    if reason in ("memory", "output", "file_size", "disk"):
        return format_bytes(value)
    if reason in ("cpu_time", "wall_time"):
        return format_seconds(float(value))
    return str(int(value))


_ADVICE = {
    "memory": "If it legitimately needs more, raise Limits.memory; otherwise look for a "
    "leak or an unbounded buffer.",
    "cpu_time": "Raise Limits.cpu_time if the work is expected to take longer, or look for "
    "an endless loop.",
    "wall_time": "Raise Limits.wall_time if the work is expected to take longer, or make "
    "the program finish (or stop waiting) sooner.",
    "output": "Raise Limits.output, write bulk data to a file instead, or pass "
    "truncate_output=True to keep it running with the rest discarded.",
    "file_size": "Raise Limits.file_size if such files are expected, or make the program "
    "write less.",
    "pids": "Raise Limits.pids if it needs more processes or threads; a program that "
    "forks without bound is a bug.",
    "disk": "Raise Limits.disk, or have the program clean up what it writes.",
}


# Why the figure read can fall short of a limit that was reached (the
# kernel decided on its own count): said instead of "used X; its limit is Y"
# with X < Y, which reads as a contradiction.
_SHORT = {
    "memory": "The peak read is {used}: the kernel does not grant the allocation that would "
    "pass the limit, so the peak stays below it.",
    "cpu_time": "The CPU time read is {used}: the kernel fires the limit on its own count, "
    "which this figure can trail.",
    "disk": "The workspace held {used} at the end.",
}


def _reached(
    program: str, reason: str, limit: Any, observed: Any, mechanism: str, detail: str
) -> str | None:
    """The message of a limit reached whose figure is below it (or
    unknown), else None: then "used X; its limit is Y" reads right."""
    if reason not in _SHORT or detail == "refused" or limit is None:
        return None
    if observed is not None and observed >= limit:
        return None
    cap = _amount(reason, limit)
    what = {
        "memory": f"{program} was killed on reaching its memory limit of {cap}"
        + (f", where the OOM killer had killed {detail} of its processes" if detail else ""),
        "cpu_time": f"{program} was stopped on reaching its CPU-time limit of {cap}",
        "disk": f"{program} filled its workspace to its limit of {cap}",
    }[reason]
    short = _SHORT[reason].format(used=_amount(reason, observed)) if observed is not None else ""
    return " ".join(x for x in (f"{what} ({mechanism}).", short, _ADVICE[reason]) if x)


def _limit_message(
    program: str, reason: str, limit: Any, observed: Any, mechanism: str, detail: str
) -> str:
    reached = _reached(program, reason, limit, observed, mechanism, detail)
    if reached is not None:
        return reached
    used, cap = _amount(reason, observed), _amount(reason, limit)
    what = {
        "memory": f"{program} failed after its memory reached {used}, near its limit of "
        f"{cap}: an allocation past the limit was refused (inferred: no counter records "
        "the refusal)"
        if detail == "refused"
        else f"{program} was ended after using {used} of memory; its limit is {cap}, and "
        f"the OOM killer had killed {detail} of its processes"
        if detail.isdigit()
        else f"{program} was killed after using {used} of memory; its limit is {cap}",
        "cpu_time": f"{program} was stopped after {used} of CPU time; its limit is {cap}",
        "wall_time": f"{program} was still running after {used} and was terminated; "
        f"its limit is {cap}",
        "output": f"{program} wrote {used} to {detail or 'its output'}; its limit is {cap}, "
        "so capture stopped there and the sandbox was killed",
        "file_size": f"{program} tried to write a file larger than its limit of {cap} and "
        "was stopped by SIGXFSZ",
        "pids": f"{program} tried to run more than {cap} processes and threads, its limit; "
        f"the kernel refused {detail} of its forks and thread starts"
        if detail.isdigit()
        else f"{program} ran {used} processes and threads; its limit is {cap}, so the "
        "sandbox was killed",
        "disk": f"{program} wrote {used} into its workspace; its limit is {cap}",
    }[reason]
    return f"{what} ({mechanism}). {_ADVICE[reason]}"


def classify(
    *,
    program: str,
    returncode: int,
    cpu_time_limit: float | None,
    file_size_limit: int | None,
    memory_limit: int | None,
    enforced: dict[str, Enforcement],
    usage: Usage,
    kill: KillRecord | None,
    hits: Iterable[str] = (),
    killed_by_caller: bool = False,
    pids_limit: int | None = None,
    oom_kills: int = 0,
    pids_refused: int = 0,
    oom_kills_outside: int = 0,
    disk_limit: int | None = None,
    disk_full: bool = False,
    tolerate: Iterable[str] = (),
    memory_by: Holder = Holder.NONE,
) -> Termination:
    """Decide why a sandbox ended, from evidence only.

    `oom_kills` and `pids_refused` are the cgroup's event counters
    (memory.events oom_kill, pids.events max): a limit that was hit is in
    ``hits`` whatever happened next, and is the reason when the program
    then failed.  `oom_kills_outside`: OOM kills in the sandbox that its
    own limit did not cause (memory ran out above it): no limit of the
    sandbox's, so never its verdict, but said in the message.
    `disk_full`: the size-capped tmpfs workspace was past the limit at
    the end, or full (writes past it failed with ENOSPC)."""
    hit = set(hits)
    sig = -returncode if returncode < 0 else None
    cpu_used = usage.cpu_total

    def ended(
        reason: Reason, limit: Any, observed: Any, mechanism: str, detail: str = ""
    ) -> Termination:
        hit.add(reason)
        mechanism = str(mechanism)  # an enforced value: the text, not an Enforcement
        message = _limit_message(program, reason, limit, observed, mechanism, detail)
        return Termination(
            reason=reason,
            limit=limit,
            observed=observed,
            mechanism=mechanism,
            message=message + _on_the_way(hit, oom_kills, pids_refused, reason),
            returncode=returncode,
            signal=sig,
            hits=tuple(r for r in REASONS if r in hit),
        )

    if oom_kills and memory_limit is not None:
        hit.add("memory")
    if pids_refused and pids_limit is not None:
        hit.add("pids")
    # Past the limit at the end: the tmpfs says so (full, or into its room
    # past the limit); a watched workdir's final size too.
    disk_over = disk_limit is not None and (
        disk_full or (usage.disk is not None and usage.disk > disk_limit)
    )
    if disk_over:
        hit.add("disk")
    # What the supervisor did is the strongest evidence: it acted first.
    if kill is not None:
        return ended(_reason(kill.reason), kill.limit, kill.observed, kill.mechanism, kill.detail)
    ends = not killed_by_caller
    if oom_kills and memory_limit is not None and (returncode != 0 or "memory" not in tolerate):
        # Untolerated, an OOM kill ends the sandbox: the verdict even when
        # the program exited before the supervisor's next sample.
        mech = enforced.get("memory", "cgroup")
        return ended("memory", memory_limit, usage.memory_peak, mech)
    if sig is not None and cpu_time_limit is not None:
        mech = enforced.get("cpu_time", "rlimit:RLIMIT_CPU")
        # The kernel's SIGXCPU comes at the limit (RLIMIT_CPU, whole
        # seconds, rounded up): with less used, the program sent it itself.
        if sig == _signal.SIGXCPU and (cpu_used is None or cpu_used >= cpu_time_limit * 0.9):
            return ended("cpu_time", cpu_time_limit, cpu_used, mech)
        # The hard limit (soft + 1 s) kills with SIGKILL a program that
        # caught or ignored SIGXCPU; rusage proves the CPU was used.  Not
        # when the caller's kill_tree() sent the SIGKILL: rusage counts the
        # children it reaped too, so it proves nothing about the limit.
        if (
            sig == _signal.SIGKILL
            and not killed_by_caller
            and cpu_used is not None
            and cpu_used >= cpu_time_limit
        ):
            return ended("cpu_time", cpu_time_limit, cpu_used, mech)
    if sig is not None and file_size_limit is not None and sig == _signal.SIGXFSZ:
        return ended(
            "file_size", file_size_limit, None, enforced.get("file_size", "rlimit:RLIMIT_FSIZE")
        )

    failed = returncode != 0 and not killed_by_caller
    if pids_refused and pids_limit is not None and (failed or (ends and "pids" not in tolerate)):
        mech = enforced.get("pids", "cgroup")
        return ended("pids", pids_limit, usage.pids_peak, mech, str(pids_refused))
    if disk_over and (failed or (ends and "disk" not in tolerate)):
        # Exceeded ends the sandbox, as the supervisor's sample would have
        # had the program not ended first; the same mechanism its kill
        # names (see _monitor).
        mech = "tmpfs:size" if disk_full else enforced.get("disk", "watchdog:disk")
        return ended("disk", disk_limit, usage.disk, mech)
    if (
        failed
        and memory_limit is not None
        and memory_by is Holder.RLIMIT
        and usage.memory_peak is not None
        and usage.memory_peak >= memory_limit * DATA_EVIDENCE
    ):
        # No counter records an allocation refused by RLIMIT_DATA: a program
        # that failed after its memory reached the limit's neighbourhood is
        # judged to have run out of it.
        return ended("memory", memory_limit, usage.memory_peak, "rlimit:RLIMIT_DATA", "refused")

    hits_t = tuple(r for r in REASONS if r in hit)
    on_the_way = _on_the_way(hit, oom_kills, pids_refused)
    outside = _outside(oom_kills_outside, memory_limit, usage.memory_peak)
    if sig is not None:
        message = f"{program} was killed by {_signame(sig)} ({sig})."
        if killed_by_caller:
            message += " kill_tree() was called."
        elif sig == _signal.SIGKILL and outside:
            message += outside
            outside = ""
        elif sig == _signal.SIGKILL:
            message += (
                " Nothing in sbxlimit sent it; the kernel's OOM killer or another process may have."
            )
        elif sig == _signal.SIGSEGV:
            message += _tight(
                enforced,
                memory_limit,
                "The kernel also kills a program so when its image does not fit under",
                ("memory", "address_space"),
            )
        return Termination(
            "signaled", None, None, None, message + on_the_way + outside, returncode, sig, hits_t
        )
    message = f"{program} exited with status {returncode}.{on_the_way}{outside}"
    if returncode == 127:
        message += _tight(
            enforced,
            memory_limit,
            "127 is also the dynamic loader's status when it cannot load the program's "
            "libraries, which these limits can cause:",
            ("memory", "address_space", "open_files"),
        )
    return Termination("exited", None, None, None, message, returncode, None, hits_t)


_RLIMIT_OF = {"memory": "RLIMIT_DATA", "address_space": "RLIMIT_AS", "open_files": "RLIMIT_NOFILE"}


def _tight(
    enforced: dict[str, Enforcement], memory_limit: int | None, said: str, fields: tuple[str, ...]
) -> str:
    """A failure at the program's start that per-process limits can cause
    (the loader cannot map or open a library: 127; the kernel cannot map
    the image past exec's point of no return: SIGSEGV), naming those
    limits: the program never got to say anything itself."""
    tight = []
    for field in fields:
        rlimit = _RLIMIT_OF[field]
        if rlimit in str(enforced.get(field, "")):
            size = f" of {format_bytes(memory_limit)}" if field == "memory" and memory_limit else ""
            tight.append(f"{field} ({rlimit}{size})")
    if not tight:
        return ""
    return f" {said} {', '.join(tight)}. Raise the limit if it is that."


# Without a cgroup, a failed program whose memory (sampled, or its reaped
# peak) reached this share of the limit ran out of it (RLIMIT_DATA).
DATA_EVIDENCE = 0.75


def _outside(kills: int, memory_limit: int | None, peak: int | None) -> str:
    """OOM kills in the sandbox that its own limit did not cause: who ran
    out of memory, and what to do."""
    if not kills:
        return ""
    own = ""
    if memory_limit is not None:
        used = f"; its peak: {format_bytes(peak)}" if peak is not None else ""
        own = f", not at the sandbox's own limit of {format_bytes(memory_limit)}{used}"
    return (
        f" The kernel's OOM killer killed {kills:,} of its processes: memory ran out"
        f" above the sandbox (a cgroup above it, or the host){own}."
        " Give the machine or that cgroup more memory, or run fewer sandboxes at once."
    )


def _on_the_way(hit: set[str], oom_kills: int, pids_refused: int, reason: str = "") -> str:
    """Limits hit without ending the sandbox (tolerated, or survived), with
    counts where the kernel keeps them."""
    parts = []
    if "pids" in hit and reason != "pids":
        n = f"{pids_refused:,} " if pids_refused else ""
        parts.append(f"the kernel refused {n}forks or threads (pids)")
    if "memory" in hit and reason != "memory":
        n = f"{oom_kills:,} " if oom_kills else ""
        parts.append(f"{n}process(es) were killed by the OOM killer (memory)")
    if "disk" in hit and reason != "disk":
        parts.append("the workspace was full (disk)")
    if "output" in hit and reason != "output":
        parts.append("output was truncated (output)")
    return f" On the way: {'; '.join(parts)}." if parts else ""


class Outcome:
    """A reaped sandbox's evidence, turned into Usage and Termination only
    when someone asks (and then once)."""

    __slots__ = (
        "_cgroup",
        "_disk",
        "_termination",
        "_usage",
        "enforced",
        "evidence",
        "limits",
        "memory_by",
    )

    def __init__(
        self,
        evidence: Evidence,
        limits: Limits | None,
        enforced: dict[str, Enforcement],
        memory_by: Holder = Holder.NONE,
        cgroup: Callable[[], CgroupStats | None] | None = None,
        disk: Callable[[], int | None] | None = None,
    ) -> None:
        self.evidence = evidence
        self.limits = limits
        self.enforced = enforced
        self.memory_by = memory_by
        # The cgroup's final figures and the workspace's size, fetched when
        # first needed: the supervisor reads them off the caller's path
        # (Cgroup.final, _workspace.FinalSize).
        self._cgroup = cgroup
        self._disk = disk
        self._usage: Usage | None = None
        self._termination: Termination | None = None

    def __getstate__(self) -> object:
        # Pickled (a result sent back from a worker process): with its
        # figures, not the fetchers (a lock inside) that would read them.
        self._facts()
        return object.__getstate__(self)

    def _facts(self) -> Evidence:
        cgroup, disk = self._cgroup, self._disk
        if cgroup is not None or disk is not None:
            e = self.evidence
            self.evidence = dataclasses.replace(
                e,
                cgroup=cgroup() if cgroup is not None else e.cgroup,
                disk=disk() if disk is not None else e.disk,
            )
            self._cgroup = self._disk = None
        return self.evidence

    def usage(self) -> Usage:
        if self._usage is None:
            e = self._facts()
            self._usage = usage(
                wall=e.wall,
                disk=e.disk,
                final=True,
                cgroup=e.cgroup,
                samples=e.samples,
                rusage=e.rusage,
                created=e.created,
            )
        return self._usage

    def termination(self) -> Termination:
        if self._termination is None:
            e, lim = self._facts(), self.limits
            self._termination = classify(
                program=e.program,
                returncode=e.returncode,
                cpu_time_limit=lim.cpu_time if lim else None,
                file_size_limit=lim.file_size if lim else None,
                memory_limit=lim.memory if lim else None,
                enforced=self.enforced,
                usage=self.usage(),
                kill=e.kill,
                hits=e.hits,
                killed_by_caller=e.killed_by_caller,
                pids_limit=lim.pids if lim else None,
                oom_kills=e.cgroup.oom_kills if e.cgroup is not None else 0,
                oom_kills_outside=e.cgroup.oom_kills_outside if e.cgroup is not None else 0,
                pids_refused=e.cgroup.pids_refused if e.cgroup is not None else 0,
                disk_limit=lim.disk if lim else None,
                disk_full=e.disk_full,
                tolerate=lim.tolerate if lim else (),
                memory_by=self.memory_by,
            )
        return self._termination
