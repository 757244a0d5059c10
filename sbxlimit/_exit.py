"""What this process does as it ends, wherever it ends.

The modules that own something a sandbox leaves behind (a program still
running, its cgroups, its workspace) register their last step here rather
than with ``atexit``, each in its phase (`END_PROGRAMS` first, then
`DRAIN`, `CGROUPS`, `WORKSPACES`: a workspace goes once nothing runs in
it).  The steps run:

* at interpreter exit (``atexit``);
* when a ``multiprocessing`` child ends.  Its fork and forkserver children
  end with ``os._exit`` once ``multiprocessing``'s own finalizers ran and
  its threads were joined, never ``atexit``'s: every sandbox a ``Process``
  or a pool worker (closed and joined, or a ``ProcessPoolExecutor`` shut
  down) started would leave its cgroups and its workspace behind.  The
  finalizers run before the threads are joined: the steps join them first
  (as ``multiprocessing`` is about to), so that a thread still using a
  sandbox is not cut short;
* before a forked body's ``os._exit`` (call-level limits).

A worker that is killed (``Pool.terminate()`` sends SIGTERM) runs nothing:
the next process's first sandbox, or ``sbxlimit gc``, collects what it left.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable

END_PROGRAMS, DRAIN, CGROUPS, WORKSPACES = range(4)

_steps: list[tuple[int, Callable[[], None]]] = []
_done_in = 0  # the pid that ran the steps: once per process


def at_exit(phase: int) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Register a step in `phase` (a decorator)."""

    def register(step: Callable[[], None]) -> Callable[[], None]:
        _steps.append((phase, step))
        return step

    return register


def run() -> None:
    """The steps, phase by phase, once per process; one that fails does not
    stop the rest."""
    global _done_in
    if _done_in == os.getpid():
        return
    _done_in = os.getpid()
    for _phase, step in sorted(_steps, key=lambda s: s[0]):
        try:
            step()
        except Exception:  # at exit: never let one owner stop the rest
            pass


def _run_after_threads() -> None:
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon and t.is_alive():
            t.join()
    run()


class _Anchor:
    """What multiprocessing's after-fork registry holds (weakly) for us."""


_ANCHOR = _Anchor()
_after_forker_set = False  # inherited with the registry by a fork's child
_finalizer_in = 0  # the pid whose multiprocessing finalizers run the steps


def _finalize_here() -> None:
    global _finalizer_in
    util = sys.modules.get("multiprocessing.util")
    if util is None or _finalizer_in == os.getpid():
        return
    _finalizer_in = os.getpid()
    util.Finalize(None, _run_after_threads, exitpriority=-100)  # the last of them


def _after_mp_fork(_anchor: _Anchor) -> None:
    _finalize_here()


def watch_multiprocessing() -> None:
    """Run the steps among multiprocessing's finalizers in its children.
    A child empties its finalizers as it starts, after the fork hooks and
    after unpickling its target (which may import us), then calls its
    after-fork functions: one of those registers ours.  Called at import,
    in a fork's child and at this process's first sandbox (in a child
    already running its target, it registers at once)."""
    global _after_forker_set
    util = sys.modules.get("multiprocessing.util")
    mp = sys.modules.get("multiprocessing")
    if util is None or mp is None:
        return  # no multiprocessing here (a child of its would have it)
    if not _after_forker_set:
        _after_forker_set = True
        util.register_after_fork(_ANCHOR, _after_mp_fork)
    if mp.parent_process() is not None:
        _finalize_here()


atexit.register(run)
watch_multiprocessing()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=watch_multiprocessing)
