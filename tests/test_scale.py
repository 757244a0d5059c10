"""Many live sandboxes: the supervisor works on events, not on polling.

The kernel says when a cgroup's limit is hit (an eventfd for a v1 OOM kill,
kernfs POLLPRI on v2's *.events), deadlines and samples sit in one heap, and
an idle sandbox costs its caller no periodic work.  Real sandboxes, real OOM
kills and refused forks; the supervisor's wake-ups are counted, never timed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import sbxlimit
from sbxlimit._cgroup import discover
from sbxlimit._monitor import get_monitor

from .conftest import kept_in_a_fork

SITE = discover()


def _needs(*controllers: str) -> None:
    if not SITE.version:
        pytest.skip(f"no cgroup here: {SITE.reason}")
    for c in controllers:
        if not SITE.has(c):
            pytest.skip(f"the {c} controller is not delegated here")


def _takes(mib: int) -> str:
    """Python code that takes `mib` MiB at once, its pages populated in one
    system call: a bytearray faults them in one at a time, some 50 us each
    in the User-Mode-Linux guest (64 MiB in 3.7 s), slower than these
    tests' deadlines."""
    flags = "mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE"
    return f"import mmap\nb = mmap.mmap(-1, {mib} << 20, flags={flags})\n"


def _wakeups_in_a_second(procs: list[sbxlimit.Popen]) -> int:
    """The supervisor's loop iterations in one second, counted (not timed)
    once the first wake-ups (ready cgroups, first samples) are past."""
    mon = get_monitor()
    time.sleep(0.5)
    before = mon.wakeups
    time.sleep(1.0)
    woke = mon.wakeups - before
    assert all(p.poll() is None for p in procs)
    return woke


def _kill_all(procs: list[sbxlimit.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def test_an_oom_kill_ends_the_sandbox_without_a_sample():
    # One process of the tree is OOM-killed (all of it on v2); its parent
    # sleeps on.  Samples are a minute apart: only the kernel's event can
    # end the sandbox before its wall_time.
    _needs("memory")
    code = textwrap.dedent(
        """
        import os, time
        if os.fork() == 0:
            b = bytearray(256 << 20)
            os._exit(0)
        os.wait()
        time.sleep(60)
        """
    )
    limits = sbxlimit.Limits(memory="64Mi", wall_time=20)
    r = sbxlimit.run([sys.executable, "-c", code], limits=limits, sample_interval=60)
    t = r.termination
    assert t.reason == "memory", t
    assert t.mechanism.startswith("cgroup"), t
    assert "wall_time" not in t.hits, t


def test_a_refused_fork_ends_the_sandbox_even_if_it_then_idles():
    # v1 gives no event for pids: the files are read in batches, skipped
    # while the cgroups' parent has used no CPU.  The fork loop stops and
    # sleeps after its first refusal: the batch must still see it.
    _needs("pids")
    code = textwrap.dedent(
        """
        import os, time
        kids = []
        try:
            while True:
                pid = os.fork()
                if pid == 0:
                    time.sleep(60)
                    os._exit(0)
                kids.append(pid)
        except OSError:
            pass
        time.sleep(60)
        """
    )
    limits = sbxlimit.Limits(pids=6, wall_time=20)
    r = sbxlimit.run([sys.executable, "-c", code], limits=limits, sample_interval=0.05)
    assert r.termination.reason == "pids", r.termination


def test_idle_sandboxes_do_not_wake_the_supervisor():
    # memory (and on v2 pids) are the kernel's: nothing to sample.
    _needs("memory")
    fields = {"memory": "64Mi", "wall_time": 120}
    if SITE.version == 2 and SITE.has("pids"):
        fields["pids"] = 16
    procs = [sbxlimit.Popen(["sleep", "120"], limits=fields) for _ in range(20)]
    try:
        woke = _wakeups_in_a_second(procs)
        # Sampling every 0.1 s would wake it ten times or more.
        assert woke <= 3, f"{woke} wake-ups in a second with 20 idle sandboxes"
    finally:
        _kill_all(procs)


def test_the_timer_heap_forgets_ended_sandboxes():
    # Each short-lived sandbox leaves a wall_time entry an hour away; they
    # must not pile up (each holds its Watch, its cgroup, its evidence).
    mon = get_monitor()
    for _ in range(300):
        sbxlimit.run(["true"], limits={"wall_time": 3600}, cgroup_parent="none")
    assert len(mon._heap) < 200, len(mon._heap)


def test_deadlines_fire_in_order_among_many():
    # Registered out of order; each ends at its own wall_time, and the long
    # ones are still running when the short ones are done.
    walls = [1.5, 0.3, 60, 0.6, 60, 0.9]
    procs = [
        sbxlimit.Popen(["sleep", "120"], limits={"wall_time": w}, cgroup_parent="none")
        for w in walls
    ]
    try:
        for p, w in zip(procs, walls, strict=True):
            if w < 60:
                p.wait(timeout=30)
                assert p.termination is not None and p.termination.reason == "wall_time"
        assert all(p.poll() is None for p, w in zip(procs, walls, strict=True) if w == 60)
    finally:
        _kill_all(procs)


def test_event_fds_never_take_the_last_quarter_of_the_fd_table():
    # With 64 fds allowed, 45 memory-limited sandboxes: events for some,
    # the counter files read in batch (no fd held) for the rest; nothing
    # fails with EMFILE, and an OOM kill in the last one still ends it.
    _needs("memory")
    code = textwrap.dedent(
        """
        import resource, sys, os
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        import sbxlimit
        lim = sbxlimit.Limits(memory="64Mi", wall_time=60)
        procs = [sbxlimit.Popen(["sleep", "60"], limits=lim) for _ in range(45)]
        # usage()'s files, kept open for the next call, within the budget too.
        assert all(p.usage().memory_now is not None for p in procs)
        high = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        batched = sum(bool(p._sbx.watch.read_paths) for p in procs)
        hog = "import mmap, os\\nif os.fork() == 0:\\n"
        hog += " b = mmap.mmap(-1, 256 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS"
        hog += " | mmap.MAP_POPULATE)\\n os._exit(0)\\nos.wait()\\nimport time\\ntime.sleep(120)"
        # Its own wall_time comes before the others' end (and with it, CPU
        # used in the parent cgroup that would say "read the counters").
        hog_lim = sbxlimit.Limits(memory="64Mi", wall_time=20)
        r = sbxlimit.run([sys.executable, "-c", hog], limits=hog_lim, sample_interval=0.1)
        for p in procs:
            p.kill()
            p.wait()
        print(high, batched, r.termination.reason, "wall_time" in r.termination.hits)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    high, batched, reason, timed_out = out.stdout.split()
    assert int(high) < 56, out.stdout
    assert int(batched) > 0, out.stdout  # past 3/4 of the table: read in batch
    assert reason == "memory", out.stdout
    # Seen when it happened, not in the final figures after the wall_time.
    assert timed_out == "False", out.stdout


def test_a_forked_child_does_not_keep_the_event_fds():
    _needs("memory")
    p = sbxlimit.Popen(["sleep", "60"], limits={"memory": "64Mi", "wall_time": 60})
    try:
        theirs = {fd for fd, _f in (p._sbx.watch.cgroup.events if p._sbx.watch else [])}
        assert theirs, "no event fd: nothing to check"
        kept = kept_in_a_fork(theirs)
        assert not kept, kept
    finally:
        p.kill()
        p.wait()


# -- trees without a cgroup: one sweep, unchanged trees answered cheaply ----

_WAKE_AND_GROW = """
import os, threading, time
def grow():
    time.sleep(2.5)  # a few samples find nothing changed
    pid = os.fork()
    b = bytearray(40 << 20)  # both processes: 80 MiB and more in all
    time.sleep(30)
{how}
"""


@pytest.mark.parametrize(
    "how",
    [
        pytest.param("grow()", id="main-thread"),
        # The main thread sleeps in join: only the other thread runs.
        pytest.param("t = threading.Thread(target=grow); t.start(); t.join()", id="other-thread"),
    ],
)
def test_a_tree_that_idles_then_grows_is_seen_at_the_next_sample(how):
    # Samples 1 s apart; a full walk is forced only every 10: an unchanged
    # tree's answer must not hide what ran since.
    code = _WAKE_AND_GROW.format(how=how)
    limits = sbxlimit.Limits(memory="64Mi", wall_time=8)
    r = sbxlimit.run(
        [sys.executable, "-c", code], limits=limits, sample_interval=1, cgroup_parent="none"
    )
    t = r.termination
    assert t.reason == "memory", t
    assert t.mechanism.endswith("watchdog:memory"), t


def test_many_trees_are_sampled_in_one_sweep():
    # Twenty trees with the same interval: one wake-up samples them all.
    limits = sbxlimit.Limits(memory="64Mi", wall_time=120)
    procs = [
        sbxlimit.Popen(["sleep", "120"], limits=limits, cgroup_parent="none", sample_interval=0.2)
        for _ in range(20)
    ]
    try:
        woke = _wakeups_in_a_second(procs)
        # 5 sweeps a second; each tree on its own would be 100 wake-ups.
        assert woke <= 8, f"{woke} wake-ups in a second for 20 trees sampled every 0.2 s"
    finally:
        _kill_all(procs)


def test_usage_of_a_sampled_tree_reads_the_sweeps_figures(monkeypatch):
    from sbxlimit import _sandbox

    limits = sbxlimit.Limits(memory="64Mi", wall_time=60)
    p = sbxlimit.Popen(["sleep", "60"], limits=limits, cgroup_parent="none", sample_interval=0.2)
    try:
        time.sleep(0.5)  # swept at least once
        walks = []
        real = _sandbox._core.tree_sample

        def counted(*a):
            walks.append(a)
            return real(*a)

        monkeypatch.setattr(_sandbox._core, "tree_sample", counted)
        seen = [p.usage() for _ in range(50)]
        assert all(u.memory_now is not None and u.memory_now > 0 for u in seen), seen[-1]
        assert len(walks) <= 2, f"usage() walked the tree {len(walks)} times in 50 calls"
    finally:
        p.kill()
        p.wait()


def test_a_v1_memory_warning_comes_as_an_event(events):
    # A usage threshold on the cgroup's eventfd: no sample is needed (they
    # are a minute apart here).  v2 has no threshold event: it samples.
    _needs("memory")
    if SITE.version != 1:
        pytest.skip("cgroup v2 has no usage threshold event; its warning is sampled")
    hog = "b = bytearray(80 << 20); import time; time.sleep(60)"
    limits = sbxlimit.Limits(memory="128Mi", wall_time=3)
    sbxlimit.run([sys.executable, "-c", hog], limits=limits, sample_interval=60, warn_at=0.5)
    warn = [e for e in events if e.name == "resource_warning"]
    assert len(warn) == 1 and warn[0].field == "memory", warn
    assert warn[0].observed >= 0.5 * warn[0].limit


def test_a_fast_allocating_tree_is_ended_within_the_stated_bound():
    # The bound (docs/api.md, the supervisor): ended at the first sample
    # past the limit; each process held by RLIMIT_DATA meanwhile.  Four
    # processes allocate as fast as they can, 1 MiB at a time.
    code = textwrap.dedent(
        """
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                break
        chunks = []
        try:
            for _ in range(200):
                chunks.append(bytearray(1 << 20))
        except MemoryError:
            pass
        time.sleep(60)
        """
    )
    limit = 64 << 20
    r = sbxlimit.run(
        [sys.executable, "-c", code],
        limits={"memory": limit, "wall_time": 20},
        cgroup_parent="none",
        sample_interval=0.05,
    )
    t = r.termination
    assert t.reason == "memory", t
    assert limit < t.observed <= 4 * limit, t


# -- the registration: the supervisor's thread installs what was armed ahead --


_MEMORY_ONLY = {"memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.max"}
_MEMORY_ONLY |= {"memory.swap.max", "memory.oom.group"}


def _warm_pool(limits: dict[str, object]) -> None:
    """A cgroup made and armed ahead for `limits`, 64 MiB of memory (the
    first sandbox of a kind makes its own; the supervisor then keeps the
    next one ready)."""

    def memory_only(settings: tuple[tuple[str, str, str], ...]) -> bool:
        names = {fname for _c, fname, _v in settings}
        return names <= _MEMORY_ONLY and str(64 << 20) in str(settings)

    _warm_pool_for(limits, memory_only)


def _warm_pool_for(limits: dict[str, object], kind=None) -> None:
    """A cgroup made and armed ahead for `limits` (`kind`: tells its
    settings; by default the only kind with a pids.max of limits' pids)."""
    if kind is None:

        def kind(settings):
            return [(f, v) for _c, f, v in settings] == [("pids.max", str(limits["pids"]))]

    sbxlimit.run(["true"], limits=limits)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pool = get_monitor()._pool
        with pool._lock:
            if any(cgs and kind(settings) for (_s, settings), cgs in pool._ready.items()):
                return
        time.sleep(0.02)
    pytest.fail("the supervisor made no cgroup ahead")


def test_a_watch_armed_ahead_is_installed_by_the_supervisor_and_enforced(monkeypatch, caplog):
    # The caller leaves the watch to the supervisor's thread, which must
    # install it before anything of it is due: the wall_time still ends
    # the sandbox, and an OOM kill at once is still the verdict.
    _needs("memory")
    import logging
    import threading

    # No audit listener: no memory warning, whose v1 threshold is the
    # sandbox's own (installed by the caller).
    caplog.set_level(logging.WARNING, "sbxlimit.audit")

    from sbxlimit._monitor import Monitor

    installers: list[str] = []
    real = Monitor._install

    def install(self, w, *a):
        installers.append(threading.current_thread().name)

        return real(self, w, *a)

    monkeypatch.setattr(Monitor, "_install", install)
    limits = {"memory": "64Mi", "wall_time": 0.5}
    _warm_pool(limits)
    installers.clear()
    r = sbxlimit.run(["sleep", "30"], limits=limits)
    assert r.termination.reason == "wall_time", r.termination
    assert installers == ["sbxlimit-monitor"], installers
    _warm_pool(limits)
    code = _takes(256) + "import time\ntime.sleep(30)"
    # The same cgroup settings; time for the interpreter to start (0.6 s in
    # the UML guest).
    hog_limits = {**limits, "wall_time": 30}
    r = sbxlimit.run([sys.executable, "-c", code], limits=hog_limits, sample_interval=60)
    assert r.termination.reason == "memory", r.termination


def test_sandboxes_that_end_before_the_supervisor_looks_leave_nothing():
    # Never installed: each one's pidfd (output read: the exit is watched)
    # is closed at its end, and nothing of it stays with the supervisor.
    _needs("memory")
    limits = {"memory": "64Mi", "wall_time": 60}
    _warm_pool(limits)
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(30):
        r = sbxlimit.run(["echo", "hi"], limits=limits, capture_output=True)
        assert r.stdout == b"hi\n"
    mon = get_monitor()
    assert mon.drain(5)
    deadline = time.monotonic() + 5
    while mon._by_pidfd and time.monotonic() < deadline:
        time.sleep(0.02)  # those installed: closed at the thread's exit poll
    with mon._lock:
        assert not mon._pending and not mon._by_pidfd and not mon._watches
    left = set(os.listdir("/proc/self/fd")) - before
    assert not left, {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in left if fd.isdigit()}


def test_a_counter_that_moved_before_the_watch_was_installed_is_still_read(monkeypatch):
    # v1 pids: read in batches, skipped while the parent cgroup's CPU
    # counter (the gate) has not moved.  Installed at the supervisor's pass,
    # a watch may come after the program refused a fork and went idle, and
    # after a read of the gate that already counted that CPU: the watch's
    # first batch must be read all the same.  Here the install waits for
    # the refusal and a read of the gates right before it.
    _needs("pids")
    if SITE.version != 1:
        pytest.skip("cgroup v1 only (v2 reports pids through an event)")
    import threading

    from sbxlimit._cgroup import read_quiet
    from sbxlimit._monitor import Monitor

    code = textwrap.dedent(
        """
        import os, time
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
        except OSError:
            pass
        time.sleep(60)
        """
    )
    limits = {"pids": 6, "wall_time": 10}
    _warm_pool_for(limits)
    real = Monitor._install

    def install(self, w, *a):
        if threading.current_thread().name == "sbxlimit-monitor" and w.read_paths == []:
            time.sleep(1.0)  # the fork refused, the program idle
            for gate in list(self._gates):
                self._gates[gate] = read_quiet(gate)
        return real(self, w, *a)

    monkeypatch.setattr(Monitor, "_install", install)
    r = sbxlimit.run([sys.executable, "-c", code], limits=limits, sample_interval=0.05)
    assert r.termination.reason == "pids", r.termination
    assert "wall_time" not in r.termination.hits, r.termination


_MARKS_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: open(sys.argv[1], "w").close())
time.sleep(60)
"""


def _deadline_keeper(marker: str, wall_time: float) -> sbxlimit.Popen:
    """A sandbox whose one timer, its wall_time, keeps the supervisor asleep
    until then; its SIGTERM (kill_grace: the SIGKILL much later) leaves
    `marker`, so what else ended before that deadline can be told."""
    return sbxlimit.Popen(
        [sys.executable, "-c", _MARKS_SIGTERM, marker],
        limits={"wall_time": wall_time, "kill_grace": 30},
    )


def test_an_oom_kill_before_the_install_is_acted_on_at_once(tmp_path, monkeypatch):
    # The OOM event of a watch left to the supervisor's next pass goes into
    # its epoll at the registration: it must not wait for that pass (here
    # planned at another sandbox's deadline, 3 s away; samples 5 s apart;
    # and no wake-up at the spawn, as when the pools need no refill).
    _needs("memory")
    from sbxlimit._monitor import Monitor

    limits = {"memory": "64Mi"}
    _warm_pool(limits)
    marker = str(tmp_path / "deadline")
    keeper = _deadline_keeper(marker, 3.0)
    try:
        time.sleep(0.2)
        take = _takes(256).replace("\n", "\n ")
        hog = f"import os, time\nif os.fork() == 0:\n {take}\ntime.sleep(30)"
        with monkeypatch.context() as m:
            m.setattr(Monitor, "settle", lambda self: None)
            p = sbxlimit.Popen([sys.executable, "-c", hog], limits=limits, sample_interval=5)
        p.wait(timeout=30)
        assert p.termination.reason == "memory", p.termination
        assert not os.path.exists(marker), "the OOM kill was acted on only at the next pass"
    finally:
        keeper.kill_tree(grace=0)


def test_a_tree_s_first_sample_counts_from_its_start_not_its_install(tmp_path):
    # Without a cgroup the memory watchdog samples the tree every interval
    # from the start.  Installed at the supervisor's next pass (here at
    # another sandbox's deadline, just before that first sample), the
    # watch must still sample then, not an interval after the install.
    # Two seconds apart: the UML guest takes one to start the four.
    waker = _deadline_keeper(str(tmp_path / "first"), 1.95)
    marker = str(tmp_path / "deadline")
    keeper = _deadline_keeper(marker, 3.2)
    try:
        time.sleep(0.05)
        hog = "import os, time\nos.fork(); os.fork()\n" + _takes(30) + "time.sleep(30)"
        r = sbxlimit.run(
            [sys.executable, "-c", hog],
            limits={"memory": "64Mi"},
            cgroup_parent="none",
            sample_interval=2.0,
        )
        assert r.termination.reason == "memory", r.termination
        assert not os.path.exists(marker), "the first sample came an interval late"
    finally:
        waker.kill_tree(grace=0)
        keeper.kill_tree(grace=0)


def test_a_watch_that_fails_to_install_leaves_the_others_of_its_pass(monkeypatch, caplog):
    # The supervisor installs what register() left in one pass: an error
    # installing one watch (here injected) must not drop the others.
    from sbxlimit._monitor import Monitor

    real = Monitor._install

    def install(self, w, *a):
        if w.wall_time == 0.31:
            raise RuntimeError("injected")
        return real(self, w, *a)

    monkeypatch.setattr(Monitor, "_install", install)
    # No cgroup (here or anywhere): nothing to open, both left to the pass.
    limits = {"wall_time": 0.3}
    with monkeypatch.context() as m:
        m.setattr(Monitor, "settle", lambda self: None)  # one pass for both
        bad = sbxlimit.Popen(["sleep", "30"], limits={"wall_time": 0.31}, cgroup_parent="none")
        good = sbxlimit.Popen(["sleep", "30"], limits=limits, cgroup_parent="none")
    try:
        good.wait(timeout=20)
        assert good.termination.reason == "wall_time", good.termination
        assert "could not be installed" in caplog.text
    finally:
        bad.kill_tree(grace=0)
        good.kill_tree(grace=0)
