"""The events room: what a policy reports, and the hook that turns reports into log lines.

Frozen event records and the hook dispatcher (``events``) and the default hook that writes
the policy's log lines (``logging_hook``).

May import: the foundations (``anygate._redact``, ``anygate._verdict`` and the other
top-level private modules). No gate internals, and nothing from the classification, config
or policy rooms: an event is a record of a decision, not a way to reach the objects behind
it. Importing this package runs nothing; import its modules.
"""
