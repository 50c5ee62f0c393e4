"""The policy room: the guarded call, its one attempt loop and what steers it.

:class:`anygate.Policy` (``policy``, its argument checks in ``policy_args``) and its forms
(``policy_forms``, ``decorate``, ``attempt``, ``blocks``), the attempt loop (``attempts``)
with one call's state (``run``) and the decisions after a failure (``retrying``,
``backoff``), the circuit breaker (``breaker``), the process-wide gate, breaker and adaptive
limit a policy shares (``sharing``) and the testing switch (``testing_switch``). What the
provider's limits are (the adaptive limit, header learning) is the provider model's room,
:mod:`anygate._limits`: the policy feeds it each answer.

May import: every other room and the foundations. The top of the core: no other room
imports it (import-linter checks it). Importing this package runs nothing; import its
modules.
"""
