"""Every debugging flag mlpack reads, in one registry.

MLPACK_DEBUG=N: 1 prints each pass's name and time; 2 also the IR after each pass that
changed it; 3 also each cpu target's LLVM IR before optimization and its assembly after.
"""

from __future__ import annotations

import os
import sys

FLAGS = {
    "MLPACK_DEBUG": "0 quiet; 1 pass names and timings; 2 and the IR after each pass that "
                    "changed it; 3 and each cpu target's LLVM IR and optimized assembly",
    "MLPACK_WINOGRAD": "0 builds every convolution direct (codegen/targets/cpu/winograd.py)",
    "MLPACK_CHANNELS_LAST": "0 keeps every tensor in its type's dim order "
                            "(codegen/targets/cpu/layout.py)",
}


def level() -> int:
    try:
        return int(os.environ.get("MLPACK_DEBUG", "0") or 0)
    except ValueError:
        return 0


def log(msg: str, at: int = 1) -> None:
    if level() >= at:
        print(f"[mlpack] {msg}", file=sys.stderr)
