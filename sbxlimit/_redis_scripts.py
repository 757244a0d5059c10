"""The Lua scripts of the Redis store: each admission decision is one script,
so it is atomic on the server whatever the number of workers and hosts.

Time is the server's (``TIME``), never a client's: hosts whose clocks
disagree still share one token bucket and one lease expiry.  Every script
that admits is idempotent for its lease id: a call retried after a lost
reply finds its lease and admits nothing twice.
"""

from __future__ import annotations

# The server's time in milliseconds.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: held (zset lease -> expiry ms), bucket (hash tokens, stamp),
#       queue (zset ticket -> arrival ms), alive (zset ticket -> expiry ms)
# ARGV: lease, lease_ms, max (-1: none), per_ms (0: no rate), capacity,
#       ticket ('' for a caller that does not queue), ticket_ttl_ms
# Returns {1} when admitted, else {0, kind (0 slots, 1 rate), eta_ms, ahead}.
GATE_ACQUIRE = (
    _NOW
    + """
local lease, lease_ms = ARGV[1], tonumber(ARGV[2])
local max, per_ms, cap = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ticket, ticket_ttl = ARGV[6], tonumber(ARGV[7])
if redis.call('ZSCORE', KEYS[1], lease) then
  return {1}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- waiters whose process stopped polling leave the queue
local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for _, d in ipairs(dead) do
  redis.call('ZREM', KEYS[3], d)
end
if #dead > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
end
local ahead = redis.call('ZCARD', KEYS[3])
if ticket ~= '' then
  redis.call('ZADD', KEYS[3], 'NX', now, ticket)
  redis.call('ZADD', KEYS[4], now + ticket_ttl, ticket)
  redis.call('PEXPIRE', KEYS[3], 2 * ticket_ttl)
  redis.call('PEXPIRE', KEYS[4], 2 * ticket_ttl)
  ahead = redis.call('ZRANK', KEYS[3], ticket)
end
local tokens = cap
if per_ms > 0 then
  local b = redis.call('HMGET', KEYS[2], 'tokens', 'stamp')
  if b[1] then
    tokens = math.min(cap, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * per_ms)
  end
end
local slot = max < 0 or redis.call('ZCARD', KEYS[1]) < max
local token = per_ms <= 0 or tokens >= 1 - 1e-9
if ahead > 0 or not slot or not token then
  local kind, eta = 0, 0
  if slot and per_ms > 0 then
    kind = 1
  end
  if per_ms > 0 then
    eta = math.max(0, (ahead + 1 - tokens) / per_ms)
  end
  return {0, kind, tostring(eta), ahead}
end
if per_ms > 0 then
  redis.call('HSET', KEYS[2], 'tokens', tostring(tokens - 1), 'stamp', now)
  redis.call('PEXPIRE', KEYS[2], math.ceil(cap / per_ms) + 1000)
end
redis.call('ZADD', KEYS[1], now + lease_ms, lease)
redis.call('PEXPIRE', KEYS[1], lease_ms + 1000)
if ticket ~= '' then
  redis.call('ZREM', KEYS[3], ticket)
  redis.call('ZREM', KEYS[4], ticket)
end
return {1}
"""
)

# KEYS: held, bucket, queue, alive.  ARGV: per_ms, capacity.
# Returns {in_flight, queued, tokens}.
GATE_SNAPSHOT = (
    _NOW
    + """
local per_ms, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local in_flight = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local queued = redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf')
local tokens = cap
if per_ms > 0 then
  local b = redis.call('HMGET', KEYS[2], 'tokens', 'stamp')
  if b[1] then
    tokens = math.min(cap, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * per_ms)
  end
end
return {in_flight, queued, tostring(tokens)}
"""
)

# KEYS: held.  ARGV: lease, lease_ms.  Extends a held lease; one that is
# gone (expired while its holder was cut off, or lost by a Redis restart)
# is put back, since its holder is alive and still uses the slot.
# Returns 1 if it was there, 0 if it was put back.
GATE_RENEW = (
    _NOW
    + """
local there = redis.call('ZSCORE', KEYS[1], ARGV[1]) and 1 or 0
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + 1000)
return there
"""
)

# Expired quota leases give their room back (run first by every quota script).
# KEYS: leases (zset lease -> expiry ms), held (hash lease -> "f n f n"),
#       used (hash field -> sum)
_QUOTA_PURGE = """
local function give_back(lease)
  local held = redis.call('HGET', KEYS[2], lease)
  if held then
    local f = nil
    for w in string.gmatch(held, '%S+') do
      if f == nil then
        f = w
      else
        redis.call('HINCRBY', KEYS[3], f, -tonumber(w))
        f = nil
      end
    end
    redis.call('HDEL', KEYS[2], lease)
  end
  redis.call('ZREM', KEYS[1], lease)
end
for _, e in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  give_back(e)
end
"""

# ARGV: lease, lease_ms, held ("f n f n"), then field, need, budget triples.
# Returns {1} when admitted, else {0, index of the field (1-based), in use}.
QUOTA_ADMIT = (
    _NOW
    + _QUOTA_PURGE
    + """
local lease, lease_ms = ARGV[1], tonumber(ARGV[2])
if redis.call('ZSCORE', KEYS[1], lease) then
  return {1}
end
local n = (#ARGV - 3) / 3
for i = 1, n do
  local f, need, budget = ARGV[3 * i + 1], tonumber(ARGV[3 * i + 2]), tonumber(ARGV[3 * i + 3])
  local used = tonumber(redis.call('HGET', KEYS[3], f) or '0')
  if used + need > budget then
    return {0, i, used}
  end
end
for i = 1, n do
  redis.call('HINCRBY', KEYS[3], ARGV[3 * i + 1], tonumber(ARGV[3 * i + 2]))
end
redis.call('HSET', KEYS[2], lease, ARGV[3])
redis.call('ZADD', KEYS[1], now + lease_ms, lease)
return {1}
"""
)

# ARGV: lease.  Gives the lease's room back once (a second release finds
# nothing).  Returns 1 if it was held.
QUOTA_RELEASE = (
    _NOW
    + _QUOTA_PURGE
    + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
give_back(ARGV[1])
return 1
"""
)

# ARGV: lease, lease_ms, held.  As GATE_RENEW: a lease that is gone is put
# back with its room.  Returns 1 if it was there, 0 if it was put back.
QUOTA_RENEW = (
    _NOW
    + _QUOTA_PURGE
    + """
local lease, lease_ms = ARGV[1], tonumber(ARGV[2])
if redis.call('ZSCORE', KEYS[1], lease) then
  redis.call('ZADD', KEYS[1], now + lease_ms, lease)
  return 1
end
local f = nil
for w in string.gmatch(ARGV[3], '%S+') do
  if f == nil then
    f = w
  else
    redis.call('HINCRBY', KEYS[3], f, tonumber(w))
    f = nil
  end
end
redis.call('HSET', KEYS[2], lease, ARGV[3])
redis.call('ZADD', KEYS[1], now + lease_ms, lease)
return 0
"""
)

# Returns the used hash as a flat list, after expired leases are purged.
QUOTA_IN_USE = (
    _NOW
    + _QUOTA_PURGE
    + """
return redis.call('HGETALL', KEYS[3])
"""
)

SCRIPTS = {
    "gate_acquire": GATE_ACQUIRE,
    "gate_snapshot": GATE_SNAPSHOT,
    "gate_renew": GATE_RENEW,
    "quota_admit": QUOTA_ADMIT,
    "quota_release": QUOTA_RELEASE,
    "quota_renew": QUOTA_RENEW,
    "quota_in_use": QUOTA_IN_USE,
}
