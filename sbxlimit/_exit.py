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
  finalizers run before the threads are joined: the steps first do what
  the child does next (``threading._shutdown``), so that a thread still
  using a sandbox is not cut short;
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
    # What the child does next (threading._shutdown: its threading atexit
    # calls, which wake idle executor workers, then it joins the threads
    # left), done first: then a thread still using a sandbox is not cut
    # short.  It does nothing when called again.  Not from another thread:
    # it would wait for that thread itself.
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
    run()


class _Anchor:
    """What multiprocessing's after-fork registry holds (weakly) for us."""


_ANCHOR = _Anchor()
_after_forker_set = False  # inherited with the registry by a fork's child
_finalizer: object = None  # ours in this process's finalizer registry


def _finalize_here() -> None:
    global _finalizer
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    # A child's registry is emptied as it starts: one made before (in a
    # fork hook, by a grandchild) is gone.
    mine = _finalizer
    if isinstance(mine, util.Finalize) and mine._pid == os.getpid() and mine.still_active():
        return
    _finalizer = util.Finalize(None, _run_after_threads, exitpriority=-100)  # the last


def _after_mp_fork(_anchor: _Anchor) -> None:
    _finalize_here()


def _after_forker() -> bool:
    """Our after-fork function is registered with multiprocessing (False
    if it is not loaded)."""
    global _after_forker_set
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return False
    if not _after_forker_set:
        _after_forker_set = True
        util.register_after_fork(_ANCHOR, _after_mp_fork)
    return True


def watch_multiprocessing() -> None:
    """Run the steps among multiprocessing's finalizers in its children.
    A child empties its finalizers as it starts, after the fork hooks and
    after unpickling its target (which may import us), then calls its
    after-fork functions: one of those registers ours.  Called at import
    and at this process's first sandbox; in a child already running its
    target, it registers at once."""
    mp = sys.modules.get("multiprocessing")
    if _after_forker() and mp is not None and mp.parent_process() is not None:
        _finalize_here()


def _after_fork_in_child() -> None:
    # Not yet a multiprocessing child's run (parent_process() is still the
    # parent's own): the after-fork function registers, after the registry
    # is emptied.
    _after_forker()


atexit.register(run)
watch_multiprocessing()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
