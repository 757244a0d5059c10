"""``Enforcement``: one value of ``Popen.enforced``, the readable string
with its structure (held or not, the mechanisms, the caveats), and
``Mechanism``, the kinds of mechanism those strings name.

A program that checks how a field is held should not match the text:
``"netns ..."`` as root is ``"userns+netns ..."`` unprivileged, and both
hold the network the same way.  ``Mechanism.NETNS in e.mechanisms`` is
true for both.  An ``Enforcement`` is a ``str``, so code that compares,
prints or JSON-dumps the value keeps working.

The grammar (docs/api.md, "enforced")::

    <kind>[:<name>][+<kind>[:<name>]...][ (<caveat>; ...)]
    unenforced: <reason>

``_plan`` builds each value from its ``Held`` or ``Unenforced``, where
the caveats are known apart from the mechanisms; ``Enforcement(text)``
parses a bare string (one read back from JSON), best effort for the
caveats, exactly for the kinds.
"""

from __future__ import annotations

import enum
import re
from typing import Any

__all__ = ["UNENFORCED", "Enforcement", "Mechanism", "split_mechanism"]

UNENFORCED = "unenforced: "


class Mechanism(enum.StrEnum):
    """A kind of mechanism an ``enforced`` value names: the word before the
    ``:`` (or the bare word) of each ``+``-joined part."""

    CGROUP2 = "cgroup2"  # a file of the sandbox's cgroup, written in the parent
    CGROUP1 = "cgroup1"
    RLIMIT = "rlimit"  # set in the child before exec
    WATCHDOG = "watchdog"  # the supervisor samples or times it and ends the tree
    SUPERVISOR = "supervisor"  # done by the parent or the supervisor
    TMPFS = "tmpfs"  # a size-capped tmpfs over the workspace
    USERNS = "userns"  # the namespaces after it are made inside a user namespace
    MOUNTNS = "mountns"
    NETNS = "netns"
    IPCNS = "ipcns"  # System V IPC of its own
    PIDNS = "pidns"
    LANDLOCK = "landlock"
    SECCOMP = "seccomp"
    PRCTL = "prctl"
    SESSION = "session"  # setsid: no controlling terminal
    SHARED = "shared"  # the caller's terminal, shared as asked (Policy(terminal=True))
    TREE_WALK = "tree walk"  # the supervisor walks the process tree to kill it
    SEATBELT = "seatbelt"  # macOS
    JOB = "job"  # a field of the sandbox's Windows Job Object (_winjob)


# Longest first: "tree walk" before any kind that could prefix it.
_KINDS = sorted(Mechanism, key=lambda m: -len(m.value))
# What a kind looks like where one is expected: a word, then ":" or the end.
_KIND_LIKE = re.compile(r"[a-z][a-z0-9_]*(?::|$)")


def _kind(segment: str) -> tuple[Mechanism, str] | None:
    for m in _KINDS:
        v = m.value
        if segment == v:
            return m, ""
        if segment.startswith((v + ":", v + " ")):
            return m, segment[len(v) + 1 :].strip()
    return None


def split_mechanism(text: str) -> tuple[tuple[tuple[Mechanism, str], ...], tuple[str, ...]]:
    """The (kind, name) parts of a ``Held`` mechanism (``"userns+netns"``,
    ``"rlimit:RLIMIT_DATA+watchdog:memory"``), and the segments that look
    like a kind no ``Mechanism`` names (a test keeps those empty).  A ``+``
    followed by no kind belongs to the name before it
    (``"seccomp:ptrace+process_vm_readv refused"``)."""
    parts: list[tuple[Mechanism, str]] = []
    unknown: list[str] = []
    for segment in text.split("+"):
        kind = _kind(segment)
        if kind is not None:
            parts.append(kind)
            continue
        if _KIND_LIKE.match(segment):
            unknown.append(segment)
        if parts:
            m, name = parts[-1]
            parts[-1] = (m, f"{name}+{segment}")
    return tuple(parts), tuple(unknown)


class Enforcement(str):
    """One value of ``enforced``: the readable string, with

    - ``held``: True when a mechanism holds the field (False: ``unenforced``);
    - ``mechanisms``: every kind the string names, in order
      (``userns+netns+seccomp:socket families``: USERNS, NETNS, SECCOMP);
    - ``mechanism``: the first of them (None when unenforced);
    - ``parts``: each kind with its name (``(CGROUP2, "memory.max")``,
      ``(NETNS, "")``);
    - ``caveats``: the notes in the parenthesis;
    - ``detail``: unenforced, the reason; held, the parts' names then the
      caveats, joined by ``"; "``.

    ``Enforcement(text)`` parses a string of that grammar.
    """

    __slots__ = ("_caveats", "_detail", "_held", "_parts")

    _caveats: tuple[str, ...]
    _detail: str
    _held: bool
    _parts: tuple[tuple[Mechanism, str], ...]

    def __new__(cls, text: str) -> Enforcement:
        if isinstance(text, Enforcement):
            return cls._make(str(text), text._held, text._parts, text._caveats, text._detail)
        text = str(text)
        if text.startswith(UNENFORCED):
            return cls._unenforced(text, text[len(UNENFORCED) :])
        mechanism, caveats = _split_caveats(text)
        return cls._held_by(text, mechanism, caveats)

    @classmethod
    def _make(
        cls,
        text: str,
        held: bool,
        parts: tuple[tuple[Mechanism, str], ...],
        caveats: tuple[str, ...],
        detail: str,
    ) -> Enforcement:
        e = str.__new__(cls, text)
        for name, value in (
            ("_held", held),
            ("_parts", parts),
            ("_caveats", caveats),
            ("_detail", detail),
        ):
            object.__setattr__(e, name, value)
        return e

    def __setattr__(self, name: str, value: object) -> None:
        # Frozen, as the string is: a value shared by a cached plan.
        raise AttributeError(f"Enforcement is read-only: cannot set {name!r}")

    @classmethod
    def _held_by(cls, text: str, mechanism: str, caveats: tuple[str, ...]) -> Enforcement:
        """`text` as rendered from a ``Held``: its mechanism and caveats."""
        parts, _unknown = split_mechanism(mechanism)
        names = [name for _m, name in parts if name]
        if not parts:  # no kind this version knows: the whole of it is detail
            names = [mechanism]
        return cls._make(text, True, parts, caveats, "; ".join([*names, *caveats]))

    @classmethod
    def _unenforced(cls, text: str, reason: str) -> Enforcement:
        return cls._make(text, False, (), (), reason)

    @property
    def held(self) -> bool:
        return self._held

    @property
    def mechanisms(self) -> tuple[Mechanism, ...]:
        return tuple(m for m, _name in self._parts)

    @property
    def mechanism(self) -> Mechanism | None:
        return self._parts[0][0] if self._parts else None

    @property
    def parts(self) -> tuple[tuple[Mechanism, str], ...]:
        return self._parts

    @property
    def caveats(self) -> tuple[str, ...]:
        return self._caveats

    @property
    def detail(self) -> str:
        return self._detail

    def __reduce__(self) -> tuple[Any, ...]:
        # The structure travels as is (a forked sandbox's pipe, a pytest
        # worker): parsing the text again could split caveats differently.
        return _restore, (str(self), self._held, self._parts, self._caveats, self._detail)


def _restore(
    text: str,
    held: bool,
    parts: tuple[tuple[Mechanism, str], ...],
    caveats: tuple[str, ...],
    detail: str,
) -> Enforcement:
    return Enforcement._make(text, held, parts, caveats, detail)


def _split_caveats(text: str) -> tuple[str, tuple[str, ...]]:
    """A rendered value's mechanism and caveats: the parenthesis that ends
    it (balanced), split at "; ".  Best effort: a mechanism may end in a
    parenthesis of its own ("session:setsid (no controlling terminal)"),
    read as a caveat here; its kinds are the same either way."""
    if not text.endswith(")"):
        return text, ()
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                if i < 2 or text[i - 1] != " ":
                    return text, ()
                return text[: i - 1], tuple(text[i + 1 : -1].split("; "))
    return text, ()
