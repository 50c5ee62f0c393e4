"""The gate room: admission of one call at a time, and nothing about why a call is made.

The :class:`anygate.Gate` and what it is built from: argument checks (``gate_args``), the
slot ledger under one lock (``ledger``), what a rate is (``rate``), the rate budgets the
ledger charges (``budgets``, over the pure arithmetic of ``rate_math``), how a parked caller
is woken on asyncio, trio or a thread (``waiters``, the only module that knows which runtime
runs, with ``cancel_state`` for the uncontended cancel point; the waiter's record and states
in ``waiter_state``), the token a slot is proved by (``token``, its fields in
``token_state``, ``acquisition``), the debugging view (``inspect``), the latch built on a
gate (``latch``) and the process-wide registry of named gates (``registry``).

May import: the foundations (``anygate._errors``, ``anygate._validation``). Nothing from
the classification, events, config or policy rooms: the gate knows nothing of retries
(import-linter checks it). Importing this package runs nothing; import its modules.
"""
