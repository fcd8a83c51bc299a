"""The table of ONNX op importers, filled by ``@op`` in the modules of ops/."""

from __future__ import annotations

from typing import Callable

IMPORTERS: dict[tuple[str, str], Callable] = {}


def op(*op_types: str, domain: str = ""):
    """Register the decorated function as the importer of ``op_types`` in ``domain``."""

    def register(fn):
        for t in op_types:
            IMPORTERS[(domain, t)] = fn
        return fn

    return register


def lookup(domain: str, op_type: str):
    if domain == "ai.onnx":
        domain = ""
    return IMPORTERS.get((domain, op_type))
