"""What this process does as it ends, wherever it ends.

The modules that own something a sandbox leaves behind (its cgroups, its
workspace, a program still running) register their last step here rather
than with ``atexit``.  The steps run, newest first as ``atexit`` runs them:

* at interpreter exit (``atexit``);
* when a ``multiprocessing`` child ends.  Its fork and forkserver children
  end with ``os._exit`` once ``multiprocessing``'s own finalizers ran, never
  ``atexit``'s: every sandbox a ``Process`` or a pool worker (closed and
  joined, or a ``ProcessPoolExecutor`` shut down) started would leave its
  cgroups and its workspace behind;
* before a forked body's ``os._exit`` (call-level limits).

A worker that is killed (``Pool.terminate()`` sends SIGTERM) runs nothing:
``sbxlimit gc`` collects what it left.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable

_steps: list[Callable[[], None]] = []
_done_in = 0  # the pid that ran the steps: once per process
_watched_in = 0  # the pid whose multiprocessing exit runs them


def at_exit(step: Callable[[], None]) -> Callable[[], None]:
    """Register `step` (a decorator, as ``atexit.register``)."""
    _steps.append(step)
    return step


def run() -> None:
    """The steps, newest first, once per process; one that fails does not
    stop the rest."""
    global _done_in
    if _done_in == os.getpid():
        return
    _done_in = os.getpid()
    for step in reversed(_steps):
        try:
            step()
        except Exception:  # at exit: never let one owner stop the rest
            pass


def watch_multiprocessing() -> None:
    """In a ``multiprocessing`` child, run the steps with its finalizers.
    Called as this process first needs them (its first sandbox): a fork
    child's registry is emptied as it starts, after any fork hook."""
    global _watched_in
    if _watched_in == os.getpid():
        return
    _watched_in = os.getpid()
    util = sys.modules.get("multiprocessing.util")
    mp = sys.modules.get("multiprocessing")
    if util is None or mp is None or mp.parent_process() is None:
        return  # not a multiprocessing child: atexit runs the steps
    util.Finalize(None, run, exitpriority=0)


atexit.register(run)
