"""The fleet's state on Redis and the one Lua script that changes it.

Every key of one fleet gate carries the same hash tag, ``anygate:{<name>}:``, so a Redis
Cluster keeps them in one slot (one shard) and the script runs atomically on it.

State (all times are milliseconds of Redis ``TIME``, never a client clock):

``meta``   hash: ``cap`` (fleet capacity), ``epoch`` (changes when Redis lost our state),
           ``grace`` (no new grants before this time), ``last`` (time of the last call),
           ``lrate`` / ``rv`` (the live fleet rate and its version, see ``_ratescript``).
``held``   hash process -> leases it holds.
``pend``   hash process -> leases granted to it but not yet claimed (a short ticket TTL).
``dem``    hash process -> the demand it reported (in use + waiting locally): shares.
``wnt``    hash process -> the most leases it wants to hold now (demand, capped by its
           share while it is limited): grants never exceed it.
``exp``    sorted set process -> expiry of all its leases (one heartbeat renews them all).
``pexp``   sorted set process -> claim deadline of its pending grant.
``q``      sorted set process -> round-robin position, for processes with unmet demand.
``tix``    sorted set process -> ticket expiry (a waiter that stops renewing drops out).
``sl``     hash: the fleet rate's slope counts (see ``_ratescript``, which also keeps the
           rate budgets in ``meta``).
``seen``   sorted set process -> time of its last call (``SEEN_MS``): whom a live rate
           change wakes, idle processes included.
``w:<p>``  list: wake-up hints for process ``p``. Hints carry no state: a lost one only
           delays the process until its next call, never changes the count.

Why one script for everything: every call is then idempotent in what matters. A process
states what it *keeps* (``keep``: leases that may be in use) and what it could *use*
(``demand``); Redis answers how many it now holds. If a reply is lost (client deadline,
cancellation), resending the same statement gives the same state, so a lost reply can
neither leak a lease nor release one twice. A release that could not reach Redis is just
the next call's smaller ``keep``; the heartbeat is the same call.

Fairness between processes is max-min fair shares (water-filling over reported demands),
granted in round-robin order: a process below its share is served first, a process above
its share while another is below it is told its share (``limit``) and sheds down to it as
its slots free up. With more processes than capacity, shares are 0 and grants rotate.
"""

from __future__ import annotations

from ._ratescript import RATE

__all__ = ["KEY_NAMES", "SYNC", "keys_for", "prefix_for"]

KEY_NAMES = ("meta", "held", "pend", "dem", "exp", "pexp", "q", "tix", "wnt", "sl", "seen")

#: How long a process that stopped calling is still woken by a live rate change
#: (``seen``). A process idle since may hold an estimate of its next permit from before
#: the change (the wait Redis last told it, a minute at one request a minute) and refuse
#: callers by it; a wake makes it call and hear the rate. Ten minutes outlast any
#: per-minute budget's wait; a process idle for longer learns at its next call (a caller
#: it refused by the old estimate meanwhile could have waited for it at most that long).
SEEN_MS = 600_000


def prefix_for(name: str) -> str:
    """The key prefix of fleet gate ``name``: one hash tag, so one Cluster slot."""
    return f"anygate:{{{name}}}:"


def keys_for(name: str) -> list[str]:
    """The declared keys of the script, in ``KEY_NAMES`` order."""
    prefix = prefix_for(name)
    return [prefix + key for key in KEY_NAMES]


# ARGV: 1 process id, 2 keep, 3 demand, 4 capacity to restore if Redis lost it (or to set
# when 10 = "cap"), 5 lease TTL ms, 6 ticket TTL ms, 7 restart grace ms, 8 key prefix,
# 9 hint the over-share holders ("1") or not, 10 op: "sync" | "leave" | "cap" | "rate" |
# "hold" | "peek",
# 11 the most leases the caller wants to keep holding (its share caps it while others are
# short), 12 the epoch the caller last saw ("" if none), 13 the leases it could use (its
# ticket: grants never exceed it).
# 14-24: the fleet rate (see ``_ratescript``). 25: the newcomer's window after a server
# start, ms (see the restart detection). 26-33 (optional): the split token budgets.
# 34: the live fleet rate to set when 10 = "rate" (``_ratescript.rate_wire``), or the ms
# to hold the rate budgets when 10 = "hold"; 35: the live rate's version the caller knows
# ("" or "0": none).
# Reply: {held, limit (-1: none), epoch, cap, grace_left_ms, used, active, queued,
# permits granted, their tokens, ms until the next permit conforms (-1: none waits on it),
# their input tokens, their output tokens, the live rate's version (0: none), the live
# rate if the caller knows another version (else "")}.
_LEASES = r"""
local meta, held, pend, dem, exp, pexp, q, tix, wnt =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local pid = ARGV[1]
local keep = tonumber(ARGV[2])
local demand = tonumber(ARGV[3])
local argcap = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local tttl = tonumber(ARGV[6])
local grace = tonumber(ARGV[7])
local prefix = ARGV[8]
local hint = ARGV[9] == '1'
local op = ARGV[10]
local wantmax = tonumber(ARGV[11])
local want = tonumber(ARGV[13])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Restart detection. An empty Redis forgot every lease; one that was unreachable for a
-- whole TTL while leases existed let them all lapse unrenewed. Either way surviving
-- holders are still running: grant nothing new until they had time to re-assert.
local known = ARGV[12]
local m = redis.call('HMGET', meta, 'cap', 'epoch', 'grace', 'last', 'reset')
local cap = tonumber(m[1])
local epoch = m[2]
local grace_until = tonumber(m[3]) or 0
local last = tonumber(m[4]) or now
if cap == nil then
  cap = argcap
  epoch = t[1] .. '.' .. t[2]
  -- A caller that knew an earlier epoch, or holds leases, survived a reset: hold new
  -- grants back. A fresh fleet starting on an empty Redis does not wait.
  if known ~= '' or keep > 0 then
    grace_until = now + grace
    redis.call('HSET', meta, 'reset', '1')
  else
    -- A newcomer (a worker started during the outage) knows no epoch and holds nothing,
    -- yet may arrive before the survivors of an empty restart re-assert: granting it the
    -- capacity then double-admits (issue 27). A marker key of our own cannot tell a fresh
    -- fleet from a restart (the restart loses it too); the server's uptime can: state is
    -- absent and the server started less than a grace ago, so hold grants until a grace
    -- after its start. A fresh fleet on a server up for longer pays nothing. 'reset' stays
    -- unset, so the first survivor to arrive still starts a grace of its own.
    -- The window only has to cover the first survivor's return (ARGV 25: the agents'
    -- longest reconnect pause plus two calls' deadlines), not the whole grace: that
    -- survivor, knowing the old epoch, starts the full grace for the others below.
    local window = math.min(grace, tonumber(ARGV[25]) or grace)
    -- pcall: a managed Redis may rename or forbid INFO; without an uptime the server may
    -- have started just now, so the window runs from now (the cautious reading).
    local info = redis.pcall('INFO', 'server')
    local up = type(info) == 'string' and string.match(info, 'uptime_in_seconds:(%d+)')
    local started = now - (tonumber(up) or 0) * 1000  -- whole seconds: a later start, so longer
    if started + window > now then grace_until = started + window end
  end
  redis.call('HSET', meta, 'cap', cap, 'epoch', epoch, 'grace', grace_until)
elseif known ~= '' and known ~= epoch and m[5] ~= '1' then
  -- The first survivor to arrive after a newcomer re-created the state: the reset
  -- happened; stop granting until the other survivors had time to re-assert.
  grace_until = now + grace
  redis.call('HSET', meta, 'grace', grace_until, 'reset', '1')
elseif now - last > ttl and redis.call('HLEN', held) > 0 then
  grace_until = now + grace
  redis.call('HSET', meta, 'grace', grace_until)
end
if op == 'cap' then
  cap = argcap
  redis.call('HSET', meta, 'cap', cap)
end
redis.call('HSET', meta, 'last', now)
-- Who called lately, for the wake of a live rate change (an agent of an earlier version
-- passes no such key).
local seen = KEYS[11]
if seen then
  redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - SEEN_MS)
  if op == 'leave' then redis.call('ZREM', seen, pid) else redis.call('ZADD', seen, now, pid) end
end

local function num(key, p)
  return tonumber(redis.call('HGET', key, p)) or 0
end

local function forget(p)
  redis.call('HDEL', held, p)
  redis.call('HDEL', pend, p)
  redis.call('HDEL', dem, p)
  redis.call('HDEL', wnt, p)
  redis.call('ZREM', exp, p)
  redis.call('ZREM', pexp, p)
  redis.call('ZREM', q, p)
  redis.call('ZREM', tix, p)
end

-- Sweep: dead processes (lease TTL), unclaimed grants and silent waiters (ticket TTL).
for _, p in ipairs(redis.call('ZRANGEBYSCORE', exp, '-inf', now)) do forget(p) end
for _, p in ipairs(redis.call('ZRANGEBYSCORE', pexp, '-inf', now)) do
  redis.call('HDEL', pend, p)
  redis.call('ZREM', pexp, p)
end
for _, p in ipairs(redis.call('ZRANGEBYSCORE', tix, '-inf', now)) do
  redis.call('ZREM', q, p)
  redis.call('ZREM', tix, p)
  redis.call('HSET', wnt, p, num(held, p))
end

local function enqueue(p)
  if redis.call('ZSCORE', q, p) == false then
    local seq = redis.call('HINCRBY', meta, 'seq', 1)
    redis.call('ZADD', q, seq, p)
    return true
  end
  return false
end

-- The caller's statement.
local h = 0
local gotnow = 0  -- leases this call hands the caller (a claimed grant, or new ones)
local newticket = false
if op == 'leave' then
  forget(pid)
elseif op == 'sync' then
  h = num(held, pid)
  if h < keep then h = keep end  -- re-assert what may be in use (restart, lapsed lease)
  local top = math.max(keep, wantmax)
  if h > top then h = top end  -- give back what is neither kept nor wanted
  -- Then claim a pending grant: granted after the caller last looked, it is not surplus.
  gotnow = num(pend, pid)
  h = h + gotnow
  redis.call('HDEL', pend, pid)
  redis.call('ZREM', pexp, pid)
  -- Demand is recorded even when the caller may hold nothing (its share was 0): shares
  -- come from recorded demand, so an unrecorded one would stay at 0 for ever.
  if h > 0 or want > 0 or demand > 0 then
    redis.call('HSET', held, pid, h)
    redis.call('HSET', dem, pid, demand)
    redis.call('HSET', wnt, pid, want)
    redis.call('ZADD', exp, now + ttl, pid)
  else
    forget(pid)
  end
  if want > h then
    newticket = enqueue(pid)
    redis.call('ZADD', tix, now + tttl, pid)
  else
    redis.call('ZREM', q, pid)
    redis.call('ZREM', tix, pid)
  end
else
  -- 'cap' (and 'peek') change nothing the caller holds, but grant() below writes the
  -- caller's count as h + n: starting from 0 would make Redis forget the leases it holds
  -- (in use) and grant them again elsewhere (issue 27: 8 in use against 5). What may be
  -- in use is re-asserted as a sync would, in case Redis lost it.
  h = num(held, pid)
  if h < keep then
    h = keep
    redis.call('HSET', held, pid, h)
    redis.call('ZADD', exp, now + ttl, pid)
  end
end

-- Fair shares: max-min water-filling of the capacity over reported demands.
local procs = {}
local used = 0
local hv = redis.call('HGETALL', held)
local have = {}
for i = 1, #hv, 2 do have[hv[i]] = tonumber(hv[i + 1]); used = used + tonumber(hv[i + 1]) end
local pv = redis.call('HGETALL', pend)
for i = 1, #pv, 2 do
  have[pv[i]] = (have[pv[i]] or 0) + tonumber(pv[i + 1])
  used = used + tonumber(pv[i + 1])
end
local dv = redis.call('HGETALL', dem)
for i = 1, #dv, 2 do
  local d = math.max(tonumber(dv[i + 1]), 0)
  if d > 0 or (have[dv[i]] or 0) > 0 then
    table.insert(procs, {dv[i], d})
  end
end
-- Equal demands: the remainder of the division goes to processes holding nothing, then to
-- those that have waited longest (front of the round-robin queue), so with more processes
-- than slots the shares themselves rotate as processes are served.
local pos = {}
local qv = redis.call('ZRANGE', q, 0, -1, 'WITHSCORES')
for i = 1, #qv, 2 do pos[qv[i]] = tonumber(qv[i + 1]) end
local function rank(e)
  local seq = pos[e[1]] or math.huge
  if (have[e[1]] or 0) > 0 then return -seq - 2 ^ 52 end  -- holders first: smaller shares
  return -seq
end
table.sort(procs, function(a, b)
  if a[2] == b[2] then
    local ra, rb = rank(a), rank(b)
    if ra == rb then return a[1] < b[1] end
    return ra < rb
  end
  return a[2] < b[2]
end)
local share = {}
local remaining = math.max(cap, 0)
for i, e in ipairs(procs) do
  local fair = math.floor(remaining / (#procs - i + 1))
  local s = math.min(e[2], fair)
  share[e[1]] = s
  remaining = remaining - s
end

local function unmet(p)
  return num(wnt, p) - (have[p] or 0)
end

local granted = {}
local function grant(p, n)
  have[p] = (have[p] or 0) + n
  used = used + n
  if p == pid then
    h = h + n
    gotnow = gotnow + n
    redis.call('HSET', held, pid, h)
  else
    redis.call('HINCRBY', pend, p, n)
    redis.call('ZADD', pexp, now + tttl, p)
    granted[p] = true
  end
  if unmet(p) <= 0 then
    redis.call('ZREM', q, p)
    redis.call('ZREM', tix, p)
  else  -- round robin: served processes go to the back
    redis.call('ZADD', q, redis.call('HINCRBY', meta, 'seq', 1), p)
  end
end

local grace_left = math.max(grace_until - now, 0)
if grace_left == 0 then
  -- 1: processes below their fair share, in queue order, up to their share.
  local free = cap - used
  if free > 0 then
    for _, p in ipairs(redis.call('ZRANGE', q, 0, -1)) do
      if free <= 0 then break end
      local n = math.min(free, (share[p] or 0) - (have[p] or 0), unmet(p))
      if n > 0 then grant(p, n); free = free - n end
    end
  end
  -- 2: capacity nobody below share can use goes round robin to any unmet demand.
  free = cap - used
  while free > 0 do
    local head = redis.call('ZRANGE', q, 0, 0)[1]
    if head == nil then break end
    -- Spread over the waiting processes: one alone gets the batch, many share it.
    local spread = math.ceil(free / redis.call('ZCARD', q))
    local n = math.min(free, unmet(head), spread)
    if n <= 0 then
      redis.call('ZREM', q, head)
      redis.call('ZREM', tix, head)
    else
      grant(head, n); free = free - n
    end
  end
end

-- Is anyone still below its fair share with unmet demand, or the fleet over capacity
-- (after a lowering)? Then every process is held to its share.
local deficit = used > cap
local waiting = redis.call('ZRANGE', q, 0, -1)
for _, p in ipairs(waiting) do
  -- Short: below its share, or holding nothing at all (with more processes than slots
  -- every share is 0, and holders must still rotate).
  local n = have[p] or 0
  if p ~= pid and (n < (share[p] or 0) or n == 0) and unmet(p) > 0 then deficit = true end
end
local limit = -1
-- The caller sheds down to its share; what this very call handed it (a grant) it may use
-- once first, or a process at a share of 0 would give back every grant unused.
if deficit then limit = (share[pid] or 0) + gotnow end

local function wake(p)
  local key = prefix .. 'w:' .. p
  redis.call('LPUSH', key, '1')
  redis.call('LTRIM', key, 0, 0)
  redis.call('PEXPIRE', key, ttl)
end
for p, _ in pairs(granted) do wake(p) end
-- Tell holders above their share that someone is short, once per new shortage (a waiter
-- renewing its ticket does not re-hint), and everyone after a capacity change.
local mine = have[pid] or 0
local short = (mine < (share[pid] or 0) or mine == 0) and unmet(pid) > 0
if (hint and newticket and short) or (deficit and op == 'cap') then
  for p, n in pairs(have) do
    if p ~= pid and not granted[p] and n > (share[p] or 0) then wake(p) end
  end
end
if op == 'cap' then
  for p, _ in pairs(have) do if p ~= pid and not granted[p] then wake(p) end end
elseif op == 'rate' and seen then
  -- Idle ones too: their estimate of the next permit may be the old rate's.
  for _, p in ipairs(redis.call('ZRANGE', seen, 0, -1)) do
    if p ~= pid and not granted[p] then wake(p) end
  end
end

"""

_REPLY = r"""
-- The live rate's version, and the rate itself when the caller knows another version.
local lr = redis.call('HMGET', meta, 'rv', 'lrate')
local rv = tonumber(lr[1]) or 0
local told = ''
if tostring(rv) ~= (ARGV[35] or '') and lr[2] then told = lr[2] end
return {
  h, limit, epoch, cap, grace_left, used, #procs, #waiting, r_granted, t_granted, r_wait,
  i_granted, o_granted, rv, told
}
"""

SYNC = _LEASES.replace("SEEN_MS", str(SEEN_MS)) + RATE + _REPLY
