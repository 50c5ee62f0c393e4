"""The rate part of the fleet script: GCRA budgets and the slope bound on Redis time.

Appended to the lease part of ``_scripts.SYNC`` (one script, one round trip: a cold
acquire gets its lease and its permit in the same call). It sees the lease part's locals
(``now``, ``h``, ``limit``, ``meta``, ``op``).

State, beside the leases (times in ms of Redis ``TIME``):

``meta``  fields ``rtat`` / ``ttat``: the theoretical arrival times of the fleet's request
          and token budgets (GCRA, virtual scheduling, as ``anygate._gate.rate_math``: allow a cost
          ``c`` at ``now >= tat - tau + min(c * T, tau)``, then ``tat = max(tat, now) +
          c * T``). Missing (first use, or Redis lost its data): the budget starts empty,
          ``tat = now + tau``, as the local gate's does, so a restart never grants a burst.
``sl``    hash tick index -> admissions granted in that tick (``window / 10`` ms on Redis
          time): the slope bound ``count(window) <= ramp x count(previous) + floor`` for
          every window of whole ticks containing the current one (``rate_math.slope_allowance``).

A permit is granted per queued caller, in queue order, while its request *and* its tokens
conform and the slope allows; the first that does not stops the loop (FIFO: nobody behind
it is served first). Unused permits and settled tokens come back as refunds (``tat -= n *
T``). The reply adds: permits granted, their tokens, and ms until the first caller left
waiting conforms (``-1``: none is budget-bound).
"""

from __future__ import annotations

__all__ = ["RATE"]

# ARGV: 14 requests/minute ("" none), 15 tokens/minute ("" none), 16 burst ms, 17 the
# caller's local in-flight count, 18 the queued callers' token costs ("3,0,120"), 19 / 20
# permits / tokens given back, 21 settled tokens (> 0 refund, < 0 charge), 22 ramp ("" no
# slope bound), 23 slope window ms, 24 slope floor.
RATE = r"""
local rpm, tpm = tonumber(ARGV[14]), tonumber(ARGV[15])
local r_granted, t_granted, r_wait = 0, 0, -1
if rpm ~= nil or tpm ~= nil or ARGV[22] ~= '' then
  local tau = tonumber(ARGV[16])
  local rT = rpm and 60000 / rpm or 0
  local tT = tpm and 60000 / tpm or 0
  local r = redis.call('HMGET', meta, 'rtat', 'ttat')
  local rtat = tonumber(r[1]) or (now + tau)
  local ttat = tonumber(r[2]) or (now + tau)
  -- Refunds: permits that were not used, and what settles gave back or charged.
  rtat = rtat - tonumber(ARGV[19]) * rT
  ttat = ttat - (tonumber(ARGV[20]) + tonumber(ARGV[21])) * tT

  local ramp = tonumber(ARGV[22])
  local allow, tick, idx = math.huge, 0, 0
  local sl = KEYS[10]
  if ramp ~= nil then
    local window = tonumber(ARGV[23])
    local floor = tonumber(ARGV[24])
    tick = window / 10
    idx = math.floor(now / tick)
    local fields = {}
    for i = idx - 19, idx do table.insert(fields, tostring(i)) end
    local c = redis.call('HMGET', sl, unpack(fields))
    local prefix = {[0] = 0}
    for i = 1, 20 do prefix[i] = prefix[i - 1] + (tonumber(c[i]) or 0) end
    local best = math.huge
    for m = 0, 9 do
      local current = prefix[20] - prefix[10 + m]
      local previous = prefix[10 + m] - prefix[m]
      best = math.min(best, ramp * previous + floor - current)
    end
    allow = math.max(0, math.floor(best + 1e-9))
  end

  local costs = {}
  for v in string.gmatch(ARGV[18], '[^,]+') do table.insert(costs, tonumber(v)) end
  local free = h
  if limit >= 0 and limit < free then free = limit end
  free = free - tonumber(ARGV[17])
  if op == 'sync' then
    for i = 1, math.min(#costs, free) do
      local cost = costs[i]
      local at = now
      if rpm then at = math.max(at, rtat - tau + math.min(rT, tau)) end
      if tpm then at = math.max(at, ttat - tau + math.min(cost * tT, tau)) end
      if at > now then r_wait = math.ceil(at - now); break end
      if allow < 1 then r_wait = math.ceil((idx + 1) * tick - now); break end
      if rpm then rtat = math.max(rtat, now) + rT end
      if tpm then ttat = math.max(ttat, now) + cost * tT end
      allow = allow - 1
      r_granted = r_granted + 1
      t_granted = t_granted + cost
    end
  end
  if rpm then rtat = math.max(rtat, now - 2 * tau) end  -- a refund never builds a burst
  if tpm then ttat = math.max(ttat, now - 2 * tau) end
  redis.call('HSET', meta, 'rtat', string.format('%.3f', rtat), 'ttat', string.format('%.3f', ttat))
  if ramp ~= nil and r_granted > 0 then
    redis.call('HINCRBY', sl, tostring(idx), r_granted)
    redis.call('HDEL', sl, tostring(idx - 20))
    redis.call('PEXPIRE', sl, math.ceil(tick * 21))
  end
end
"""
