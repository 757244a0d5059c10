"""The Redis store: :class:`sbxlimit.Gate` and :class:`sbxlimit.Quota`
admission shared by every process and host that names the same Redis.

Each decision is one Lua script (``_redis_scripts``), atomic on the server
and timed by the server's clock.  What a process holds (a gate's slot, a
quota's room) is a *lease*: it expires unless renewed, and this module's
keeper thread renews the leases of the live holders of this process, so a
crashed worker's leases are reclaimed after at most ``lease`` seconds, while
a live holder's are never lost (a renewal that finds its lease gone, after a
Redis restart without persistence, puts it back).

Failures: every call is bounded by ``timeout`` (connection and reply,
retried with the same lease id until then, so a retry admits nothing
twice); after that the store fails closed (:class:`StoreUnavailable`) or,
with ``fail="open"``, admits without counting and says so (a ``degraded``
audit event and a warning).  See docs/distributed.md.

``redis`` (redis-py) is imported only when a store is made: ``pip install
'sbxlimit[redis]'``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import threading
import time
import uuid
import weakref
from collections.abc import Hashable, Sequence
from typing import Any, Literal, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from . import audit
from ._errors import (
    ConcurrencyLimited,
    ConfigError,
    QuotaExceeded,
    RateLimited,
    StoreUnavailable,
    _key_text,
)
from ._redis_scripts import SCRIPTS
from ._units import parse_seconds

__all__ = ["RedisStore"]

_log = logging.getLogger("sbxlimit.store")

# A waiter that stops polling (its process died) leaves the queue after this.
_TICKET_TTL_MS = 3000
# The longest a waiter sleeps between polls (well under the ticket's life).
_MAX_PAUSE = 0.5
_OWN_QUERY = ("lease", "timeout", "fail", "prefix")

_stores: weakref.WeakSet[RedisStore] = weakref.WeakSet()
_shared: dict[str, RedisStore] = {}
_shared_lock = threading.Lock()


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _address(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return urlunsplit(parts._replace(query=""))
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host, query=""))


def _json_key(key: Hashable) -> str:
    """A gate key as stored: JSON, the same text in every process."""

    def plain(k: object) -> object:
        if k is None or isinstance(k, (str, int, float)):
            return k
        if isinstance(k, tuple):
            return [plain(x) for x in k]
        raise ConfigError(
            "key",
            key,
            "a shared store needs keys made of str, int, float, bool, None "
            "and tuples of them (they are stored as JSON)",
        )

    return json.dumps(plain(key), separators=(",", ":"), ensure_ascii=False)


class _Release:
    """One thing to give back: a gate slot (ZREM) or a quota's room (script)."""

    __slots__ = ("args", "keys", "script")

    def __init__(self, script: str | None, keys: tuple[str, ...], args: tuple[str, ...]) -> None:
        self.script = script
        self.keys = keys
        self.args = args


class Grant:
    """What one admission holds in Redis: a lease id and how to renew and
    give it back.  ``lease`` is None after a fail-open admission."""

    __slots__ = ("_done", "lease", "release", "renew")

    def __init__(self, lease: str | None, renew: _Release | None, release: _Release | None) -> None:
        self.lease = lease
        self.renew = renew
        self.release = release
        self._done = False


class RedisStore:
    """Admission state in Redis, shared by processes and hosts.

    ``RedisStore("redis://host:6379/0", lease="30s", timeout="1s",
    fail="closed")``; pass it, or just its URL, as ``Gate(..., store=...)``
    and ``Quota(..., store=...)``, or set ``SBXLIMIT_STORE`` to the URL.
    The URL may carry these settings as a query (``?lease=10s&fail=open``);
    arguments win over the query.  ``rediss://`` (TLS) and ``unix://`` URLs
    work as in redis-py.

    Args:
        lease: how long what a process holds outlives the process (renewed
            every third of it while the holder lives).  A crashed worker's
            slots and room come back after at most this long.
        timeout: the bound of one operation, connection included, retries
            included; the store then fails as ``fail`` says.
        fail: ``"closed"`` (the default): refuse with
            :class:`StoreUnavailable`; ``"open"``: admit without counting,
            with a warning and a ``degraded`` audit event.
        prefix: the first part of every Redis key (to share one database).
    """

    def __init__(
        self,
        url: str,
        *,
        lease: float | str | None = None,
        timeout: float | str | None = None,
        fail: Literal["closed", "open"] | None = None,
        prefix: str | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise ConfigError("store", url, "expected a redis:// URL")
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                "store", _address(url), "expected a redis://, rediss:// or unix:// URL"
            )
        query = parse_qsl(parts.query, keep_blank_values=True)
        own = {k: v for k, v in query if k in _OWN_QUERY}
        rest = [(k, v) for k, v in query if k not in _OWN_QUERY]
        self.url = urlunsplit(parts._replace(query=urlencode(rest)))
        self.address = _address(url)
        self.lease = parse_seconds("RedisStore.lease", lease or own.get("lease") or "30s")
        if self.lease < 0.3:
            raise ConfigError("RedisStore.lease", lease, "must be at least 0.3 s")
        self.timeout = parse_seconds("RedisStore.timeout", timeout or own.get("timeout") or "1s")
        how = fail or own.get("fail") or "closed"
        if how not in ("closed", "open"):
            raise ConfigError("RedisStore.fail", how, "expected 'closed' or 'open'")
        self.fail = cast(Literal["closed", "open"], how)
        self.prefix = prefix or own.get("prefix") or "sbxlimit"
        try:
            import redis
            import redis.asyncio
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ConfigError(
                "store", self.address, "needs redis-py: pip install 'sbxlimit[redis]'"
            ) from None
        self._redis = redis
        self._transient: tuple[type[BaseException], ...] = (
            redis.ConnectionError,
            redis.TimeoutError,
            OSError,
        )
        self._atransient = (TimeoutError, *self._transient)
        # The store retries itself, within `timeout`, with the same lease id.
        self._options: dict[str, Any] = {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
            "retry": Retry(NoBackoff(), 0),
            "decode_responses": True,
        }
        try:
            self._client = redis.Redis.from_url(self.url, **self._options)
        except ValueError as e:
            raise ConfigError("store", self.address, str(e)) from None
        self._scripts = {n: self._client.register_script(s) for n, s in SCRIPTS.items()}
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._held: dict[str, Grant] = {}  # lease -> grant, renewed by the keeper
        self._pending: list[_Release] = []  # releases that failed: retried by the keeper
        self._wake = threading.Event()
        # Held by the keeper while a round of renewals is on the wire: a
        # renewal that crossed a release would put the lease back.
        self._round = threading.Lock()
        self._keeper: threading.Thread | None = None
        self.reasserted = 0  # leases put back after Redis had lost them
        _stores.add(self)

    @classmethod
    def shared(cls, url: str) -> RedisStore:
        """One store per URL in a process: gates and quotas that name the
        same URL share its connections and its keeper thread."""
        with _shared_lock:
            store = _shared.get(url)
            if store is None:
                store = _shared[url] = cls(url)
            return store

    def __repr__(self) -> str:
        return (
            f"RedisStore({self.address!r}, lease={self.lease:g}, "
            f"timeout={self.timeout:g}, fail={self.fail!r})"
        )

    def key(self, tag: str, suffix: str) -> str:
        """A Redis key of one gate key or one quota (`tag`).  The braces make
        a Redis Cluster hash tag: all keys of one decision live on one node."""
        return f"{self.prefix}:{{{tag}}}:{suffix}"

    # -- calls, bounded by `timeout` -----------------------------------------

    def run(self, script: str, keys: Sequence[str], args: Sequence[str], op: str) -> Any:
        deadline = time.monotonic() + self.timeout
        pause = 0.005
        while True:
            try:
                return self._scripts[script](keys=list(keys), args=list(args))
            except self._transient as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreUnavailable(self.address, op, self.timeout, str(e)) from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.1)

    def _aclient(self) -> Any:
        loop = asyncio.get_running_loop()
        entry = self._aclients.get(loop)
        if entry is None:
            # A client holds its loop: entries of loops that ended are dropped
            # here (their sockets close when collected; aclose() is the clean way).
            for old in [lp for lp in self._aclients if lp.is_closed()]:
                del self._aclients[old]
            client = self._redis.asyncio.Redis.from_url(self.url, **self._options)
            scripts = {n: client.register_script(s) for n, s in SCRIPTS.items()}
            entry = self._aclients[loop] = (client, scripts)
        return entry

    async def arun(self, script: str, keys: Sequence[str], args: Sequence[str], op: str) -> Any:
        _, scripts = self._aclient()
        deadline = time.monotonic() + self.timeout
        pause = 0.005
        while True:
            try:
                return await asyncio.wait_for(
                    scripts[script](keys=list(keys), args=list(args)), self.timeout
                )
            except self._atransient as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreUnavailable(self.address, op, self.timeout, str(e)) from None
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, 0.1)

    def unavailable(self, err: StoreUnavailable, what: str, key: Hashable) -> Grant:
        """A failed admission: refuse (fail closed) or admit uncounted (open)."""
        if self.fail == "closed":
            raise err
        _log.warning("%s admitted without its limits (fail='open'): %s", what, err)
        if audit.active():
            audit.emit(
                "degraded",
                key=None if key is None else str(key),
                field="store",
                mechanism="redis",
                detail="store_unavailable",
            )
        return Grant(None, None, None)

    # -- leases ----------------------------------------------------------------

    def hold(self, grant: Grant) -> None:
        """Keep renewing `grant` until it is given back."""
        assert grant.lease is not None
        with self._lock:
            self._held[grant.lease] = grant
            if self._keeper is None:
                self._keeper = threading.Thread(
                    target=self._keep, name="sbxlimit-store-keeper", daemon=True
                )
                self._keeper.start()

    def _unhold(self, grant: Grant) -> _Release | None:
        with self._lock:
            if grant._done or grant.lease is None:
                return None
            grant._done = True
            self._held.pop(grant.lease, None)
            return grant.release

    def release(self, grant: Grant) -> None:
        """Give `grant` back now; if Redis cannot be reached, the keeper
        keeps trying (and the lease expires meanwhile anyway)."""
        with self._round:
            rel = self._unhold(grant)
            if rel is not None:
                try:
                    self._give_back(self._client, rel)
                except self._transient:
                    self.later(rel)

    async def arelease(self, grant: Grant) -> None:
        rel = self._unhold(grant)
        if rel is not None and self._round.locked():
            self.later(rel)  # after the keeper's round, which may renew it
        elif rel is not None:
            client, scripts = self._aclient()
            try:
                if rel.script is None:
                    coro = client.zrem(rel.keys[0], *rel.args)
                else:
                    coro = scripts[rel.script](keys=list(rel.keys), args=list(rel.args))
                await asyncio.wait_for(coro, self.timeout)
            except self._atransient:
                self.later(rel)

    def later(self, rel: _Release) -> None:
        """Give `rel` back when Redis answers again (an admission whose reply
        was lost may have happened: this undoes it)."""
        with self._lock:
            self._pending.append(rel)
            if self._keeper is None:
                self._keeper = threading.Thread(
                    target=self._keep, name="sbxlimit-store-keeper", daemon=True
                )
                self._keeper.start()
        self._wake.set()

    def _give_back(self, client: Any, rel: _Release) -> Any:
        if rel.script is None:
            return client.zrem(rel.keys[0], *rel.args)
        return self._scripts[rel.script](keys=list(rel.keys), args=list(rel.args), client=client)

    def _keep(self) -> None:
        """The keeper: renews this process's leases every third of their
        life and retries failed releases, until there is nothing to keep."""
        pause: float | None = self.lease / 3  # a lease is fresh when taken
        while pause is not None:
            if pause:
                self._wake.wait(pause)
                self._wake.clear()
            with self._round:
                pause = self._keep_round()

    def _keep_round(self) -> float | None:
        """One round of renewals and pending releases.  Returns the pause
        before the next round, or None when there is nothing left to keep
        (the keeper then ends)."""
        period = self.lease / 3
        with self._lock:
            if not self._held and not self._pending:
                self._keeper = None
                return None
            held = [g for g in self._held.values() if not g._done]
            pending, self._pending = self._pending, []
        try:
            pipe = self._client.pipeline(transaction=False)
            for g in held:
                assert g.renew is not None and g.renew.script is not None
                self._scripts[g.renew.script](
                    keys=list(g.renew.keys), args=list(g.renew.args), client=pipe
                )
            for rel in pending:
                self._give_back(pipe, rel)
            results = pipe.execute()
        except self._transient as e:
            _log.debug("store keeper: %s unreachable (%s); retrying", self.address, e)
            with self._lock:
                self._pending[:0] = pending
            return min(period, 0.2)
        back = sum(1 for g, r in zip(held, results, strict=False) if r == 0 and not g._done)
        if back:
            self.reasserted += back
            _log.warning(
                "%d lease(s) were gone from %s (a restart without persistence, "
                "or this process was cut off longer than the lease); put back",
                back,
                self.address,
            )
        # An async release that found this round on the wire left its grant
        # to us: give it back now that the round is over.
        with self._lock:
            again = [g.release for g in held if g._done and g.release is not None]
            self._pending.extend(again)
            return 0.0 if self._pending else period

    def close(self) -> None:
        """Close this process's connections (leases still held expire)."""
        self._client.close()
        self._aclients.clear()

    async def aclose(self) -> None:
        """Close the connections of the running event loop, as a
        ``redis.asyncio`` client must be closed before its loop ends."""
        try:
            entry = self._aclients.pop(asyncio.get_running_loop())
        except KeyError:
            return
        await entry[0].aclose()


def _forget_after_fork() -> None:
    # The keeper thread does not survive fork: the parent renews its own
    # leases, the child holds none.
    for store in list(_stores):
        store._lock = threading.Lock()
        store._held.clear()
        store._pending.clear()
        store._keeper = None
        store._aclients = weakref.WeakKeyDictionary()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def resolve(store: object, field: str) -> RedisStore | None:
    """`store=` of a Gate or Quota: None (then ``SBXLIMIT_STORE``, then this
    process's memory), ``"memory"``, a URL, or a :class:`RedisStore`."""
    if store is None:
        store = os.environ.get("SBXLIMIT_STORE") or None
        field = "SBXLIMIT_STORE"
    if store is None or store in ("memory", "memory://"):
        return None
    if isinstance(store, RedisStore):
        return store
    if isinstance(store, str) and urlsplit(store).scheme in ("redis", "rediss", "unix"):
        return RedisStore.shared(store)
    raise ConfigError(
        field,
        _address(store) if isinstance(store, str) else store,
        "expected 'memory', a redis://, rediss:// or unix:// URL, or a sbxlimit.RedisStore",
    )


# -- a Gate's admission -------------------------------------------------------


class RedisAdmission:
    """A :class:`sbxlimit.Gate`'s admission in Redis: the same decisions as
    the in-memory ``_admission.Admission`` (a slot, a token, no overtaking
    of queued callers), across processes.  Waiting callers poll (and the
    head of the queue wakes when its token is due)."""

    def __init__(
        self,
        store: RedisStore,
        name: str,
        *,
        max_concurrent: int | None,
        per_second: float | None,
        capacity: int | None,
        rate_text: str | None,
    ) -> None:
        self.store = store
        self.name = name
        self.max_concurrent = max_concurrent
        self.per_second = per_second
        self.capacity = capacity
        self.rate_text = rate_text
        self._lease_ms = str(math.ceil(store.lease * 1000))
        per_ms = 0.0 if per_second is None else per_second / 1000.0
        self._limits = (
            str(-1 if max_concurrent is None else max_concurrent),
            repr(per_ms),
            str(capacity or 0),
        )

    def _keys(self, key: Hashable) -> tuple[str, str, str, str]:
        tag = f"gate:{self.name}:{_json_key(key)}"
        s = self.store
        return (s.key(tag, "held"), s.key(tag, "bucket"), s.key(tag, "queue"), s.key(tag, "alive"))

    def _grant(self, keys: tuple[str, ...], lease: str) -> Grant:
        return Grant(
            lease,
            _Release("gate_renew", keys[:1], (lease, self._lease_ms)),
            _Release(None, keys[:1], (lease,)),
        )

    def _denial(
        self, key: Hashable, r: list[Any], waited: float
    ) -> RateLimited | ConcurrencyLimited:
        kind, eta_ms = int(r[1]), float(r[2])
        if kind == 0 or self.rate_text is None:
            assert self.max_concurrent is not None
            return ConcurrencyLimited(key, self.max_concurrent, waited)
        return RateLimited(key, self.rate_text, eta_ms / 1000.0)

    def _pause(self, r: list[Any], tries: int) -> float:
        """Seconds to sleep before polling again: the token's due time for
        the head short only of a token, else a back-off from 2 ms."""
        kind, eta_ms, ahead = int(r[1]), float(r[2]), int(r[3])
        if kind == 1 and ahead == 0:
            return min(max(eta_ms / 1000.0, 0.001), _MAX_PAUSE)
        return min(0.002 * 1.5**tries, 0.05)

    def _leave(self, keys: tuple[str, ...], ticket: str) -> None:
        try:
            pipe = self.store._client.pipeline(transaction=True)
            pipe.zrem(keys[2], ticket)
            pipe.zrem(keys[3], ticket)
            pipe.execute()
        except self.store._transient:
            pass  # the ticket expires on its own

    def _args(self, lease: str, ticket: str) -> tuple[str, ...]:
        return (lease, self._lease_ms, *self._limits, ticket, str(_TICKET_TTL_MS))

    def _give_up_now(self, r: list[Any], deadline: float | None, now: float) -> bool:
        """Refuse a head short only of a token due after its deadline."""
        if deadline is None:
            return False
        if now >= deadline:
            return True
        kind, eta_ms, ahead = int(r[1]), float(r[2]), int(r[3])
        return kind == 1 and ahead == 0 and now + eta_ms / 1000.0 > deadline

    def acquire(self, key: Hashable, wait: float | None) -> Grant:
        if wait != 0 and _in_event_loop():
            raise RuntimeError(
                "Gate: a blocking wait inside a running event loop would stall it. "
                "Hint: use `async with gate.call(key)` or `await gate.arun(...)` there, "
                "or pass wait=0."
            )
        keys = self._keys(key)
        lease = uuid.uuid4().hex
        ticket = "" if wait == 0 else uuid.uuid4().hex
        start = time.monotonic()
        deadline = None if wait is None else start + wait
        tries = 0
        try:
            while True:
                try:
                    r = self.store.run("gate_acquire", keys, self._args(lease, ticket), "admit")
                except StoreUnavailable as e:
                    self.store.later(_Release(None, keys[:1], (lease,)))
                    return self.store.unavailable(e, f"gate call for key {_key_text(key)}", key)
                if int(r[0]) == 1:
                    grant = self._grant(keys, lease)
                    self.store.hold(grant)
                    return grant
                now = time.monotonic()
                if wait == 0 or self._give_up_now(r, deadline, now):
                    raise self._denial(key, r, now - start)
                pause = self._pause(r, tries)
                if deadline is not None:
                    pause = min(pause, deadline - now)
                time.sleep(pause)
                tries += 1
        except BaseException:
            if ticket:
                self._leave(keys, ticket)
            raise

    async def aacquire(self, key: Hashable, wait: float | None) -> Grant:
        keys = self._keys(key)
        lease = uuid.uuid4().hex
        ticket = "" if wait == 0 else uuid.uuid4().hex
        start = time.monotonic()
        deadline = None if wait is None else start + wait
        tries = 0
        try:
            while True:
                try:
                    args = self._args(lease, ticket)
                    r = await self.store.arun("gate_acquire", keys, args, "admit")
                except StoreUnavailable as e:
                    self.store.later(_Release(None, keys[:1], (lease,)))
                    return self.store.unavailable(e, f"gate call for key {_key_text(key)}", key)
                if int(r[0]) == 1:
                    grant = self._grant(keys, lease)
                    self.store.hold(grant)
                    return grant
                now = time.monotonic()
                if wait == 0 or self._give_up_now(r, deadline, now):
                    raise self._denial(key, r, now - start)
                pause = self._pause(r, tries)
                if deadline is not None:
                    pause = min(pause, deadline - now)
                await asyncio.sleep(pause)
                tries += 1
        except BaseException:
            if ticket:
                self.store.later(_Release(None, keys[2:3], (ticket,)))
                self.store.later(_Release(None, keys[3:4], (ticket,)))
            raise

    def release(self, grant: Grant) -> None:
        self.store.release(grant)

    async def arelease(self, grant: Grant) -> None:
        await self.store.arelease(grant)

    def snapshot(self, key: Hashable) -> tuple[int, int, float | None]:
        per_ms, cap = self._limits[1], self._limits[2]
        r = self.store.run("gate_snapshot", self._keys(key), (per_ms, cap), "stats")
        tokens = None if self.per_second is None else float(r[2])
        return int(r[0]), int(r[1]), tokens


# -- a Quota's budget -----------------------------------------------------------


class RedisBudget:
    """A :class:`sbxlimit.Quota`'s budget in Redis: what every process's
    admitted sandboxes hold, with leases."""

    def __init__(self, store: RedisStore, name: str, budget: dict[str, int]) -> None:
        self.store = store
        self.name = name
        self.budget = budget
        tag = f"quota:{name}"
        self._keys = (store.key(tag, "leases"), store.key(tag, "held"), store.key(tag, "used"))
        self._lease_ms = str(math.ceil(store.lease * 1000))

    def _args(self, lease: str, need: dict[str, int]) -> tuple[list[str], str]:
        held = " ".join(f"{f} {n}" for f, n in need.items())
        args = [lease, self._lease_ms, held]
        for f, n in need.items():
            args += [f, str(n), str(self.budget[f])]
        return args, held

    def _grant(self, lease: str, held: str) -> Grant:
        return Grant(
            lease,
            _Release("quota_renew", self._keys, (lease, self._lease_ms, held)),
            _Release("quota_release", self._keys, (lease,)),
        )

    def _refusal(self, r: list[Any], need: dict[str, int], key: Hashable) -> QuotaExceeded:
        field = list(need)[int(r[1]) - 1]
        return QuotaExceeded(field, self.budget[field], need[field], int(r[2]), key)

    def admit(self, need: dict[str, int], key: Hashable, wait: float | None) -> Grant:
        lease = uuid.uuid4().hex
        args, held = self._args(lease, need)
        deadline = None if wait is None else time.monotonic() + wait
        tries = 0
        while True:
            try:
                r = self.store.run("quota_admit", self._keys, args, "admit")
            except StoreUnavailable as e:
                self.store.later(_Release("quota_release", self._keys, (lease,)))
                return self.store.unavailable(e, "a sandbox", key)
            if int(r[0]) == 1:
                grant = self._grant(lease, held)
                self.store.hold(grant)
                return grant
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise self._refusal(r, need, key)
            pause = min(0.005 * 1.5**tries, 0.1)
            time.sleep(pause if left is None else min(pause, left))
            tries += 1

    async def aadmit(self, need: dict[str, int], key: Hashable, wait: float | None) -> Grant:
        lease = uuid.uuid4().hex
        args, held = self._args(lease, need)
        deadline = None if wait is None else time.monotonic() + wait
        tries = 0
        while True:
            try:
                r = await self.store.arun("quota_admit", self._keys, args, "admit")
            except StoreUnavailable as e:
                self.store.later(_Release("quota_release", self._keys, (lease,)))
                return self.store.unavailable(e, "a sandbox", key)
            if int(r[0]) == 1:
                grant = self._grant(lease, held)
                self.store.hold(grant)
                return grant
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise self._refusal(r, need, key)
            pause = min(0.005 * 1.5**tries, 0.1)
            await asyncio.sleep(pause if left is None else min(pause, left))
            tries += 1

    def release(self, grant: Grant) -> None:
        self.store.release(grant)

    def in_use(self) -> dict[str, int]:
        flat = self.store.run("quota_in_use", self._keys, (), "in_use")
        got = {flat[i]: int(flat[i + 1]) for i in range(0, len(flat), 2)}
        return {f: got.get(f, 0) for f in self.budget}
