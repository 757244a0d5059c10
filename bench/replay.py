"""sbxlimit's own child path without its Python: the floor of this design.

Each variant is spawned once through sbxlimit.run, its call into the core
(_core.spawn) captured, and then replayed: the same child setup (cgroup
joins, namespaces, the read-only view, Landlock, seccomp, capabilities)
with nothing of the Python layer around it.  Each replay gets fresh copies
of the descriptors the core consumes, joins cgroups made for the replay
(as the pool's: made ahead), holds the mount namespace until the reap and
lets it go in a thread (as sbxlimit does), and is reaped with waitpid.
Interleaved and shuffled with subprocess.run and sbxlimit.run itself; the
difference between the replay and sbxlimit.run is the Python layer's.
Linux, root.

    python bench/replay.py [--rounds 300]
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

TRUE = shutil.which("true") or "/bin/true"
# _core.spawn's arguments that are fds the core consumes (see _core.pyi).
CLOSE_AFTER, LANDLOCK_FD, NS, CG_DIRFD, CG_PROCS = 9, 23, 24, 25, 26
NS_NETNS = 14
NS_IPCNS = 15
NS_LL = 8  # the child adds Landlock rules for its tmpfs
MNT_NS_ASK = -2  # _core.MNT_NS_ASK


class Capture:
    """One sbxlimit.run's call into the core, and copies of its fds."""

    def __init__(self, sbxlimit: Any, kw: dict[str, Any], made: list[str]) -> None:
        from sbxlimit import _core, _sandbox

        real, real_ruleset = _core.spawn, _core.landlock_ruleset
        got: list[list[Any]] = []
        ruleset: list[tuple[Any, ...]] = []

        def grab(*args: Any) -> Any:
            got.append(list(args))
            self.fds = {fd: self._copy(fd, args, made) for fd in self._fds(args)}
            return real(*args)

        def grab_ruleset(*args: Any) -> Any:
            ruleset.append(args)
            return real_ruleset(*args)

        _sandbox._core.spawn = grab
        _core.landlock_ruleset = grab_ruleset
        try:
            sbxlimit.run([TRUE], **kw)
        finally:
            _sandbox._core.spawn = real
            _core.landlock_ruleset = real_ruleset
        self.args = got[0]
        self.real = real
        # A child that adds Landlock rules (its tmpfs's) gets a ruleset of
        # its own, as in sbxlimit: made before each replay, untimed.
        ns = self.args[NS]
        self.ruleset = ruleset[-1] if ruleset and ns and ns[NS_LL] else None
        self.next_ruleset = -1
        cwd = self.args[3]
        if cwd and not os.path.isdir(cwd):  # its workspace, gone with it: one for the replay
            os.makedirs(os.path.join(cwd, "tmp"))
            made.append(os.fsdecode(cwd))

    @staticmethod
    def _fds(args: list[Any]) -> set[int]:
        fds = {*args[CLOSE_AFTER], *args[CG_PROCS], args[LANDLOCK_FD], args[CG_DIRFD]}
        if args[NS]:
            fds.update((args[NS][NS_NETNS], args[NS][NS_IPCNS]))
        return {fd for fd in fds if fd >= 0}

    @staticmethod
    def _copy(fd: int, args: tuple[Any, ...], made: list[str]) -> int:
        if fd not in args[CG_PROCS] and fd != args[CG_DIRFD]:
            return os.dup(fd)
        # The sandbox's cgroup (removed after it): the same file of a
        # cgroup made for the replay, beside it.
        path = os.readlink(f"/proc/self/fd/{fd}")
        if fd == args[CG_DIRFD]:  # v2: the child is born in the directory
            d = os.path.join(os.path.dirname(path), f"sbx-replay-{os.getpid()}")
        else:
            d = os.path.join(os.path.dirname(os.path.dirname(path)), f"sbx-replay-{os.getpid()}")
        if not os.path.isdir(d):
            os.mkdir(d)
            made.append(d)
        if fd == args[CG_DIRFD]:
            return os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return os.open(os.path.join(d, os.path.basename(path)), os.O_WRONLY | os.O_CLOEXEC)

    def prepare(self) -> None:
        """What sbxlimit's Python makes for each spawn: a ruleset."""
        if self.ruleset is not None:
            from sbxlimit import _core

            self.next_ruleset = _core.landlock_ruleset(*self.ruleset)[0]

    def spawn(self, drop: queue.SimpleQueue[int]) -> None:
        # Fresh copies of what the core closes; the cgroup's directory (v2)
        # is the replay cgroup's own, kept.
        a = list(self.args)
        a[CG_DIRFD] = self.fds.get(a[CG_DIRFD], -1)
        fresh = {fd: os.dup(src) for fd, src in self.fds.items() if fd != self.args[CG_DIRFD]}
        if self.next_ruleset >= 0:
            os.close(fresh[a[LANDLOCK_FD]])
            fresh[a[LANDLOCK_FD]], self.next_ruleset = self.next_ruleset, -1
        a[CLOSE_AFTER] = [fresh.get(fd, fd) for fd in a[CLOSE_AFTER]]
        a[CG_PROCS] = [fresh.get(fd, fd) for fd in a[CG_PROCS]]
        a[LANDLOCK_FD] = fresh.get(a[LANDLOCK_FD], a[LANDLOCK_FD])
        if a[NS]:
            ns = list(a[NS])
            for i in (NS_NETNS, NS_IPCNS):
                ns[i] = fresh.get(ns[i], ns[i])
            a[NS] = tuple(ns)
        pid, failure, _how, mnt_ns = self.real(*a)
        if failure is not None:
            raise RuntimeError(f"replay failed: {failure}")
        hold = mnt_ns if mnt_ns >= 0 else -1  # as sbxlimit holds it (_namespaces.hold_mounts)
        if a[NS] and mnt_ns == MNT_NS_ASK:
            try:
                hold = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass
        os.waitpid(pid, 0)
        if hold >= 0:
            drop.put(hold)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def _nothing() -> None:
    pass


def _let_go(drop: queue.SimpleQueue[int]) -> None:
    """Close the mount namespaces held, off the caller's path (as sbxlimit)."""
    while True:
        os.close(drop.get())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    a = ap.parse_args()
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        sys.exit("replay: Linux and root only (cgroups made for the replay)")
    import sbxlimit
    from sbxlimit import Limits, Policy

    variants = {
        "limits with a cgroup": {"limits": Limits(memory="256Mi", pids=64)},
        'Policy(workdir="/")': {"policy": Policy(workdir="/")},
        "Policy()": {"policy": Policy()},
        'Policy(workdir="/", network="deny")': {"policy": Policy(workdir="/", network="deny")},
        "typical": {
            "limits": Limits(memory="512Mi", pids=256, cpu_time=60, wall_time=120),
            "policy": Policy(network="deny"),
        },
    }
    made: list[str] = []
    drop: queue.SimpleQueue[int] = queue.SimpleQueue()
    threading.Thread(target=_let_go, args=(drop,), daemon=True).start()
    captures = {}
    try:
        for name, kw in variants.items():
            for _ in range(5):  # the pools (cgroups, network namespaces) fill
                sbxlimit.run([TRUE], **kw)
            time.sleep(0.3)
            captures[name] = Capture(sbxlimit, kw, made)
        run: dict[str, Callable[[], Any]] = {"subprocess.run": lambda: subprocess.run([TRUE])}
        prep: dict[str, Callable[[], Any]] = {}
        for name, kw in variants.items():
            c = captures[name]
            run[f"replay: {name}"] = lambda c=c: c.spawn(drop)
            prep[f"replay: {name}"] = c.prepare
            run[f"sbxlimit.run: {name}"] = lambda kw=kw: sbxlimit.run([TRUE], **kw)
        times: dict[str, list[float]] = {k: [] for k in run}
        for _ in range(20):
            for k, f in run.items():
                prep.get(k, _nothing)()
                f()
        for _ in range(a.rounds):
            order = list(run)
            random.shuffle(order)
            for k in order:
                prep.get(k, _nothing)()
                t = time.perf_counter()
                run[k]()
                times[k].append(time.perf_counter() - t)
    finally:
        for c in captures.values():
            c.close()
        time.sleep(0.1)  # the last namespaces let go of
        for path in reversed(made):
            if path.startswith("/sys/fs/cgroup"):
                os.rmdir(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
    base = statistics.median(times["subprocess.run"])
    print(f"# {a.rounds} rounds, medians; subprocess.run {base * 1e6:.0f} us")
    print("| variant | core alone (replay) | sbxlimit.run | the Python layer |")
    print("|---|---|---|---|")
    for name in variants:
        r = statistics.median(times[f"replay: {name}"])
        s = statistics.median(times[f"sbxlimit.run: {name}"])
        print(f"| {name} | {r / base:.2f}x | {s / base:.2f}x | +{(s - r) * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
