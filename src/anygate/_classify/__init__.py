"""The classification room: what a provider's errors and responses say.

A provider exception -> :class:`anygate.Verdict` (``classify``, which reads the exception by
duck typing through ``facts`` and looks for the words in ``patterns``), the wait a server
asks for (``retry_after``), what kind of "slow down" a verdict is (``throttle``), rate-limit
response headers -> :class:`anygate.LimitReport` (``headers``) and a request's token cost,
estimated and read back (``usage``). Pure reading: nothing here sleeps, holds state or acts
on what it finds.

May import: the foundations (``anygate._errors``, ``anygate._redact``,
``anygate._validation``, ``anygate._verdict``). Nothing from the gate, events, config or
policy rooms. Importing this package runs nothing; import its modules.
"""
