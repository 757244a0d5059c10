"""``Quota``: a budget shared by sandboxes (issue 7).

A quota caps what the sandboxes admitted through it hold *at once*: how
many run, and the sum of their ``memory``, ``cpu`` and ``pids`` limits.  A
new sandbox is admitted only if its limits fit what is left; otherwise
:class:`QuotaExceeded` is raised before anything starts (or, with
``wait``, the caller queues until enough is released).  What a sandbox holds
is given back when it is reaped.  Budgets count limits, not usage: a
sandbox limited to 1 GiB holds 1 GiB of the budget however little it uses,
which is what makes the sum a guarantee.

The budget lives in this process's memory, or in a Redis shared by every
process and host that names it (``store=``; ``_redis.RedisBudget``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from . import audit
from ._errors import ConfigError, QuotaExceeded
from ._limits import Limits
from ._units import parse_bytes, parse_count, parse_millicores, parse_seconds

__all__ = ["Admission", "Quota"]

if TYPE_CHECKING:
    from ._redis import Grant, RedisBudget, RedisStore

_FIELDS = ("sandboxes", "memory", "cpu", "pids")
_DEFAULT: Any = object()


class Admission:
    """What one admitted sandbox holds; ``release()`` gives it back (once)."""

    __slots__ = ("_generation", "_grant", "_held", "_quota")

    def __init__(self, quota: Quota, held: dict[str, int], grant: Grant | None = None) -> None:
        self._quota: Quota | None = quota
        self._held = held
        self._grant = grant  # the lease in a shared store
        # The process that holds the room (a fork's child starts anew: its
        # copies of its parent's admissions give nothing back there).
        self._generation = quota._generation

    def release(self) -> None:
        """Give the room back; safe to call from several threads, twice."""
        q = self._quota
        if q is not None:
            q._release(self)


class Quota:
    """A budget across sandboxes: ``Quota(max_sandboxes=8, memory="4Gi",
    cpu="4", pids=512, wait=0)``; pass it as ``Popen(..., quota=q)`` (or
    ``sbxlimit.run``, ``sbxlimit.asyncio``).

    wait: seconds a sandbox may queue for room (0: refuse at once, the
    default; None: wait for ever).

    store: where the budget is kept: this process's memory (the default,
    or ``"memory"``), or a Redis shared by every process and host that
    names it (``"redis://host:6379/0"`` or a :class:`sbxlimit.RedisStore`;
    ``SBXLIMIT_STORE`` when not given).  name: what makes quotas in
    different processes the same quota there (default: the budget, so
    quotas made alike share it).  See docs/distributed.md.
    """

    def __init__(
        self,
        *,
        max_sandboxes: int | str | None = None,
        memory: int | str | None = None,
        cpu: int | float | str | None = None,
        pids: int | str | None = None,
        wait: float | str | None = 0,
        store: str | RedisStore | None = None,
        name: str | None = None,
    ) -> None:
        budget: dict[str, int] = {}
        if max_sandboxes is not None:
            budget["sandboxes"] = parse_count("Quota.max_sandboxes", max_sandboxes)
        if memory is not None:
            budget["memory"] = parse_bytes("Quota.memory", memory)
        if cpu is not None:
            budget["cpu"] = int(parse_millicores("Quota.cpu", cpu))
        if pids is not None:
            budget["pids"] = parse_count("Quota.pids", pids)
        if not budget:
            raise ConfigError(
                "Quota", None, "give at least one of max_sandboxes, memory, cpu, pids"
            )
        self.budget = budget
        self.wait = None if wait is None else parse_seconds("Quota.wait", wait, allow_zero=True)
        self._used = dict.fromkeys(budget, 0)
        self._cond = threading.Condition()
        self._generation = 0  # a fork's child starts the next (_forget_after_fork)
        _quotas.add(self)
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError("Quota.name", name, "expected a non-empty string")
        from ._redis import resolve

        self._store = resolve(store, "Quota.store")
        self.name = name or "-".join(f"{f}{n}" for f, n in budget.items())
        self._shared: RedisBudget | None = None
        if self._store is not None:
            from ._redis import RedisBudget

            self._shared = RedisBudget(self._store, self.name, budget)

    def __repr__(self) -> str:
        return f"Quota(budget={self.budget}, in_use={self.in_use()})"

    @property
    def store(self) -> str:
        """Where the budget is kept: ``"memory"`` or the store's address."""
        return "memory" if self._store is None else self._store.address

    def in_use(self) -> dict[str, int]:
        """What admitted sandboxes hold now, per budget (in a shared store:
        every process's)."""
        if self._shared is not None:
            return self._shared.in_use()
        with self._cond:
            return dict(self._used)

    def _needs(self, limits: Limits | None) -> dict[str, int | None]:
        need: dict[str, int | None] = {}
        for field in self.budget:
            if field == "sandboxes":
                need[field] = 1
            else:
                value = getattr(limits, field) if limits is not None else None
                need[field] = None if value is None else int(value)
        return need

    def _misfit(self, need: dict[str, int | None]) -> str | None:
        """The first budget `need` does not fit now, else None.  Lock held."""
        for field, n in need.items():
            if n is None or self._used[field] + n > self.budget[field]:
                return field
        return None

    def _refuse(self, field: str, need: dict[str, int | None], key: Hashable) -> QuotaExceeded:
        return QuotaExceeded(field, self.budget[field], need[field], self._used[field], key)

    def _never_fits(self, need: dict[str, int | None]) -> str | None:
        for field, n in need.items():
            if n is None or n > self.budget[field]:
                return field
        return None

    def _fits_ever(self, need: dict[str, int | None], key: Hashable) -> dict[str, int]:
        """`need` as whole numbers, or the refusal of one that never fits."""
        bad = self._never_fits(need)
        if bad is not None:
            used = self.in_use()[bad] if self._shared is not None else self._used[bad]
            raise QuotaExceeded(bad, self.budget[bad], need[bad], used, key)
        return {f: int(n or 0) for f, n in need.items()}

    def _take(self, need: dict[str, int | None]) -> Admission:
        held = {f: int(n or 0) for f, n in need.items()}
        for f, n in held.items():
            self._used[f] += n
        return Admission(self, held)

    def admit(
        self, limits: Limits | None, *, key: Hashable = None, wait: Any = _DEFAULT
    ) -> Admission:
        """Hold room for a sandbox with `limits`, or raise QuotaExceeded
        (after waiting up to `wait` seconds, default the quota's)."""
        try:
            return self._admit_locked(limits, key, wait)
        except QuotaExceeded as e:
            _audit_denied(e)  # outside the lock: a subscriber may use the quota
            raise

    def _wait_for(self, wait: Any) -> float | None:
        """A call's `wait` in seconds (the quota's own by default)."""
        if wait is _DEFAULT:
            return self.wait
        return None if wait is None else parse_seconds("wait", wait, allow_zero=True)

    def _admit_locked(self, limits: Limits | None, key: Hashable, wait: Any) -> Admission:
        need = self._needs(limits)
        wait = self._wait_for(wait)
        if self._shared is not None:
            held = self._fits_ever(need, key)
            return Admission(self, held, self._shared.admit(held, key, wait))
        with self._cond:
            bad = self._never_fits(need)
            if bad is not None:
                raise self._refuse(bad, need, key)
            deadline = None if wait is None else time.monotonic() + wait
            while (bad := self._misfit(need)) is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise self._refuse(bad, need, key)
                self._cond.wait(left)
            return self._take(need)

    async def aadmit(
        self, limits: Limits | None, *, key: Hashable = None, wait: Any = _DEFAULT
    ) -> Admission:
        """admit() for asyncio code: waits without blocking the loop."""
        try:
            return await self._aadmit(limits, key, wait)
        except QuotaExceeded as e:
            _audit_denied(e)
            raise

    async def _aadmit(self, limits: Limits | None, key: Hashable, wait: Any) -> Admission:
        need = self._needs(limits)
        wait = self._wait_for(wait)
        if self._shared is not None:
            held = self._fits_ever(need, key)
            return Admission(self, held, await self._shared.aadmit(held, key, wait))
        deadline = None if wait is None else time.monotonic() + wait
        delay = 0.005
        while True:
            with self._cond:
                bad = self._never_fits(need)
                if bad is None:
                    bad = self._misfit(need)
                    if bad is None:
                        return self._take(need)
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise self._refuse(bad, need, key)
                else:
                    raise self._refuse(bad, need, key)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _release(self, adm: Admission) -> None:
        if adm._grant is not None:
            grant, adm._grant, adm._quota = adm._grant, None, None
            assert self._shared is not None
            self._shared.release(grant)  # once: Grant knows whether it was given back
            return
        with self._cond:
            if adm._quota is None:
                return  # released already, by another thread
            adm._quota = None
            if adm._generation != self._generation:
                return  # held in the parent of this fork's child: not its room
            for f, n in adm._held.items():
                self._used[f] -= n
            self._cond.notify_all()


# In-memory quotas, for a fork's child: what they hold is its parent's.
_quotas: weakref.WeakSet[Quota] = weakref.WeakSet()


def _forget_after_fork() -> None:
    # A fork's child holds none of its parent's admissions (a fork's copy
    # owns nothing: it never gives them back), and a lock held by another
    # thread at the fork would never be released.
    for q in list(_quotas):
        q._cond = threading.Condition()
        q._used = dict.fromkeys(q.budget, 0)
        q._generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _audit_denied(err: QuotaExceeded) -> None:
    if audit.active():
        audit.emit(
            "quota_denied",
            key=None if err.key is None else str(err.key),
            field=err.field,
            limit=err.limit,
            observed=err.in_use,
            detail="unbounded" if err.requested is None else "full",
        )
