"""The compiler's debug log: MLPACK_DEBUG=N (spec/environment.py, the registry of every
environment variable, says what each level prints).
"""

from __future__ import annotations

import sys

from mlpack.spec import environment


def level() -> int:
    try:
        return int(environment.get("MLPACK_DEBUG", "0") or 0)
    except ValueError:
        return 0


def log(msg: str, at: int = 1) -> None:
    if level() >= at:
        print(f"[mlpack] {msg}", file=sys.stderr)
