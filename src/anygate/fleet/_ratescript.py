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
``meta``  fields ``itat`` / ``otat``: the split input- and output-token budgets (a
          :class:`anygate.Rate` with ``input_tokens_per_minute`` /
          ``output_tokens_per_minute``), the same GCRA holding ``max(burst_s, 60)`` s of
          refill (``rate.SPLIT_BURST_S``), charged each permit's input part (``tokens -
          out``) and output part (``out``). Written only by a gate that has them: a fleet
          without split budgets leaves ``meta`` exactly as before (older agents share it).
``sl``    hash tick index -> admissions granted in that tick (``window / 10`` ms on Redis
          time): the slope bound ``count(window) <= ramp x count(previous) + floor`` for
          every window of whole ticks containing the current one (``rate_math.slope_allowance``).

``meta``  fields ``lrate`` / ``rv``: the live fleet rate (:meth:`FleetGate.set_rate`, in
          :func:`rate_wire`'s layout) and its version, counted up at each set. While it
          is there it replaces the rate each caller passes (ARGV 14-16, 22-24, and the
          split budgets' 26-28 for a caller that has them), so every permit is charged at
          it from the moment it was set (each budget keeps its level in units then, as a
          local gate's ``Budgets`` do); the reply carries it to each process whose
          version is another, which adopts it for its own pool and estimates. Redis losing
          its data forgets it: processes keep the rate they adopted, and one that starts
          afterwards uses its own ``rate=`` until the rate is set again.

A permit is granted per queued caller, in queue order, while its request *and* its tokens
conform and the slope allows; the first that does not stops the loop (FIFO: nobody behind
it is served first). Unused permits and settled tokens come back as refunds (``tat -= n *
T``). A settle that charges a split budget more is paid at ``now``, as the local gate's
``split.Bucket.settle`` pays it (a ``tat`` in the past only means "full": adding to it
would lose the charge in the burst cap); the agent sends each part's net settle since its
last call. The reply adds: permits granted, their tokens, ms until the first caller left
waiting conforms (``-1``: none is budget-bound), and the permits' input and output parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._gate.budgets import SPLIT_BURST_S
from .._gate.rate import Rate

if TYPE_CHECKING:
    from ._permits import Returned

__all__ = ["RATE", "SPLITLESS", "parse_rate_wire", "rate_argv", "rate_wire"]

#: The script's split-budget arguments (ARGV 26-33) when the rate has none.
SPLITLESS: tuple[object, ...] = ("", "", 0, "", 0, 0, 0, 0)


def rate_argv(
    rate: Rate,
    in_flight: int,
    costs: list[int],
    outs: list[int],
    returned: Returned,
    *,
    split: bool,
) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """The script's rate arguments (ARGV 14-24) and split-budget arguments (26-33).

    ``costs`` / ``outs``: the queued callers' tokens and their output parts, in the order
    they will be admitted; ``returned``: the permit pool given back and the settles since
    the last call. Without split budgets (``split=False``) ARGV 26-33 say so and the
    script never reads or writes the split fields.
    """
    rpm, tpm, ramp = rate.requests_per_minute, rate.tokens_per_minute, rate.ramp
    args = (
        "" if rpm is None else repr(float(rpm)),
        "" if tpm is None else repr(float(tpm)),
        repr(rate.burst_s * 1000.0),
        in_flight,
        ",".join(map(str, costs)),
        returned.permits,
        returned.tokens,
        returned.adjust,
        "" if not ramp else repr(float(ramp)),
        repr(rate.window_s * 1000.0),
        rate.floor,
    )
    if not split:
        return args, SPLITLESS
    itpm, otpm = rate.input_tokens_per_minute, rate.output_tokens_per_minute
    return args, (
        "" if itpm is None else repr(float(itpm)),
        "" if otpm is None else repr(float(otpm)),
        repr(max(rate.burst_s, SPLIT_BURST_S) * 1000.0),  # the local Budgets' split tau
        ",".join(map(str, outs)),
        returned.inputs,
        returned.outputs,
        returned.input_adjust,
        returned.output_adjust,
    )


def rate_wire(rate: Rate) -> str:
    """``rate`` as the script keeps a live fleet rate (``meta`` field ``lrate``): ``rpm,
    tpm,itpm,otpm,burst_s,ramp,window_s,ramp_floor,floor``, ``""`` for an absent value,
    floats by ``repr`` (exact), and the slope's effective floor last (the script reads it;
    :func:`parse_rate_wire` reads the others back into an equal :class:`Rate`)."""

    def num(value: float | None) -> str:
        return "" if value is None else repr(float(value))

    floor = rate.ramp_floor
    return ",".join(
        (
            num(rate.requests_per_minute),
            num(rate.tokens_per_minute),
            num(rate.input_tokens_per_minute),
            num(rate.output_tokens_per_minute),
            num(rate.burst_s),
            num(rate.ramp),
            num(rate.window_s),
            "" if floor is None else str(floor),
            str(rate.floor),
        )
    )


def parse_rate_wire(wire: str) -> Rate:
    """The :class:`Rate` that :func:`rate_wire` wrote.

    Raises:
        ValueError, TypeError: ``wire`` is not what :func:`rate_wire` writes (another
            writer, or a version of anygate that wrote another layout).
    """
    fields = wire.split(",")
    if len(fields) != 9:
        msg = f"a live fleet rate has 9 comma-separated fields (got {len(fields)}: {wire!r})"
        raise ValueError(msg)

    def num(value: str) -> float | None:
        return None if value == "" else float(value)

    floor = fields[7]
    return Rate(
        requests_per_minute=num(fields[0]),
        tokens_per_minute=num(fields[1]),
        input_tokens_per_minute=num(fields[2]),
        output_tokens_per_minute=num(fields[3]),
        burst_s=float(fields[4]),
        ramp=num(fields[5]),
        window_s=float(fields[6]),
        ramp_floor=None if floor == "" else int(floor),
    )


# ARGV: 14 requests/minute ("" none), 15 tokens/minute ("" none), 16 burst ms, 17 the
# caller's local in-flight count, 18 the queued callers' token costs ("3,0,120"), 19 / 20
# permits / tokens given back, 21 settled tokens (> 0 refund, < 0 charge), 22 ramp ("" no
# slope bound), 23 slope window ms, 24 slope floor.
# 26 input tokens/minute ("" none), 27 output tokens/minute ("" none), 28 the split
# budgets' burst ms, 29 the queued callers' output parts ("0,0,100", as 18), 30 / 31 input
# / output tokens of the permits given back, 32 / 33 settled input / output tokens (> 0
# refund, < 0 charge). A script called with 25 arguments (no split) reads them as absent.
RATE = r"""
local rpm, tpm = tonumber(ARGV[14]), tonumber(ARGV[15])
local ipm, opm = tonumber(ARGV[26] or ''), tonumber(ARGV[27] or '')
local tau, ramp = tonumber(ARGV[16]), tonumber(ARGV[22])
local window, floor = tonumber(ARGV[23]), tonumber(ARGV[24])
local stau = tonumber(ARGV[28] or '') or 0
local r_granted, t_granted, r_wait, i_granted, o_granted = 0, 0, -1, 0, 0
if rpm ~= nil or tpm ~= nil or ipm ~= nil or opm ~= nil or ramp ~= nil then
  -- A live fleet rate (op 'rate') replaces the one the caller passed, in every process
  -- from the moment it was set; the split budgets only for a caller that has them (their
  -- costs' output parts come from it).
  local split = ipm ~= nil or opm ~= nil
  local function adopt(wire)
    local f = {}
    for v in string.gmatch(wire .. ',', '([^,]*),') do table.insert(f, v) end
    rpm, tpm = tonumber(f[1]), tonumber(f[2])
    if split then ipm, opm = tonumber(f[3]), tonumber(f[4]) end
    tau = tonumber(f[5]) * 1000
    if split then stau = math.max(tau, SPLIT_MS) end
    ramp, window, floor = tonumber(f[6]), tonumber(f[7]) * 1000, tonumber(f[9])
  end
  local live = redis.call('HGET', meta, 'lrate')
  if live then adopt(live) end
  if op == 'rate' then
    -- FleetGate.set_rate: each budget keeps its level in units (left, or owed), as a
    -- local gate's budgets do over a rate change (rate_math.level_tat); one that appears
    -- starts empty. Then every process adopts the rate from its next reply ('rv').
    local before = {rpm, tpm, ipm, opm, tau, stau}
    adopt(ARGV[34])
    local function keep(field, pm0, tau0, pm1, tau1)
      if not pm1 then return end
      local T1 = 60000 / pm1
      local units = 0
      if pm0 then
        local tat = tonumber(redis.call('HGET', meta, field)) or (now + tau0)
        units = math.min((tau0 - math.max(0, tat - now)) / (60000 / pm0), tau1 / T1)
      end
      redis.call('HSET', meta, field, string.format('%.3f', now + tau1 - units * T1))
    end
    keep('rtat', before[1], before[5], rpm, tau)
    keep('ttat', before[2], before[5], tpm, tau)
    if split then
      keep('itat', before[3], before[6], ipm, stau)
      keep('otat', before[4], before[6], opm, stau)
    end
    redis.call('HSET', meta, 'lrate', ARGV[34])
    redis.call('HINCRBY', meta, 'rv', 1)
  end
  local rT = rpm and 60000 / rpm or 0
  local tT = tpm and 60000 / tpm or 0
  local r = redis.call('HMGET', meta, 'rtat', 'ttat')
  local rtat = tonumber(r[1]) or (now + tau)
  local ttat = tonumber(r[2]) or (now + tau)
  -- Refunds: permits that were not used, and what settles gave back or charged.
  rtat = rtat - tonumber(ARGV[19]) * rT
  ttat = ttat - (tonumber(ARGV[20]) + tonumber(ARGV[21])) * tT
  -- The split budgets (absent unless configured: their fields stay unwritten).
  local iT = ipm and 60000 / ipm or 0
  local oT = opm and 60000 / opm or 0
  local itat, otat = 0, 0
  if ipm or opm then
    local sp = redis.call('HMGET', meta, 'itat', 'otat')
    itat = tonumber(sp[1]) or (now + stau)
    otat = tonumber(sp[2]) or (now + stau)
    local function settled(tat, n, T)
      if n < 0 and tat < now then tat = now end  -- a charge is paid now (split.Bucket)
      return tat - n * T
    end
    itat = settled(itat - tonumber(ARGV[30]) * iT, tonumber(ARGV[32]), iT)
    otat = settled(otat - tonumber(ARGV[31]) * oT, tonumber(ARGV[33]), oT)
  end
  if op == 'hold' then
    -- A provider said its bucket is drained for ARGV 34 ms (header learning, in any
    -- process): every budget is spent until then, as a local gate's hold spends them
    -- (BudgetSync.hold_until); one already owing past it keeps its debt.
    local at = now + tonumber(ARGV[34])
    if rpm then rtat = math.max(rtat, at + tau - math.min(rT, tau)) end
    if tpm then ttat = math.max(ttat, at + tau) end
    if ipm then itat = math.max(itat, at + stau) end
    if opm then otat = math.max(otat, at + stau) end
  end

  local allow, tick, idx = math.huge, 0, 0
  local sl = KEYS[10]
  if ramp ~= nil then
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
  local outs = {}
  for v in string.gmatch(ARGV[29] or '', '[^,]+') do table.insert(outs, tonumber(v)) end
  local free = h
  if limit >= 0 and limit < free then free = limit end
  free = free - tonumber(ARGV[17])
  if op == 'sync' then
    for i = 1, math.min(#costs, free) do
      local cost = costs[i]
      local at = now
      if rpm then at = math.max(at, rtat - tau + math.min(rT, tau)) end
      if tpm then at = math.max(at, ttat - tau + math.min(cost * tT, tau)) end
      local out = outs[i] or 0
      if ipm then at = math.max(at, itat - stau + math.min((cost - out) * iT, stau)) end
      if opm then at = math.max(at, otat - stau + math.min(out * oT, stau)) end
      if at > now then r_wait = math.ceil(at - now); break end
      if allow < 1 then r_wait = math.ceil((idx + 1) * tick - now); break end
      if rpm then rtat = math.max(rtat, now) + rT end
      if tpm then ttat = math.max(ttat, now) + cost * tT end
      if ipm then itat = math.max(itat, now) + (cost - out) * iT end
      if opm then otat = math.max(otat, now) + out * oT end
      i_granted = i_granted + cost - out
      o_granted = o_granted + out
      allow = allow - 1
      r_granted = r_granted + 1
      t_granted = t_granted + cost
    end
  end
  if rpm then rtat = math.max(rtat, now - 2 * tau) end  -- a refund never builds a burst
  if tpm then ttat = math.max(ttat, now - 2 * tau) end
  redis.call('HSET', meta, 'rtat', string.format('%.3f', rtat), 'ttat', string.format('%.3f', ttat))
  if ipm then
    itat = math.max(itat, now - 2 * stau)  -- as above: a past tat only means "full"
    redis.call('HSET', meta, 'itat', string.format('%.3f', itat))
  end
  if opm then
    otat = math.max(otat, now - 2 * stau)
    redis.call('HSET', meta, 'otat', string.format('%.3f', otat))
  end
  if ramp ~= nil and r_granted > 0 then
    redis.call('HINCRBY', sl, tostring(idx), r_granted)
    redis.call('HDEL', sl, tostring(idx - 20))
    redis.call('PEXPIRE', sl, math.ceil(tick * 21))
  end
end
""".replace("SPLIT_MS", repr(SPLIT_BURST_S * 1000.0))
