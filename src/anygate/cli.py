"""The ``anygate`` command line. Placeholder until the storm simulator lands (issue 4)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anygate`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["simulate"]:
        print("anygate simulate: the storm simulator is not built yet (tracked in issue 4).")
        return 0
    print("usage: anygate simulate", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
