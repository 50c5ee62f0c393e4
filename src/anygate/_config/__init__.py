"""The config room: the frozen values a policy is built from, and reading them from files.

The config objects (``config``), YAML or a mapping -> :class:`anygate.PolicyConfig`
(``loader``), ``anygate check-config``'s reading that reports every error (``checkconfig``)
and the adaptive limit's defaults, arithmetic and statistics (``limit_values``).

May import: the foundations, the classification room (a rule names a
:class:`~anygate.Reason`) and the gate room's :class:`~anygate.Rate` value. Nothing from the
events or policy rooms: config describes a policy, it does not run one. Importing this
package runs nothing; import its modules.
"""
