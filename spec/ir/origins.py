"""Where a data-indexed read comes from, and the one message an index out of range gives.

A gather's or scatter's index is data. ONNX Runtime refuses an index outside ``-n..n-1``, and so
does every executor here: the NumPy and C interpreters and the native kernels. For each
(tensor, dim) that a Gather-family node indexes with data, the importer records the node
(``Gather node 'emb'``) and whether the index wraps negative values as ONNX does
(``select(i < 0, i + n, i)``). An executor sees only the wrapped index ``v``; with the record it
names the node and gives back the index the caller passed (``v - n`` when ``v < 0``). A read
with no record (a data-dependent index no importer annotated) names the tensor and dim instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Origin:
    node: str            # the ONNX node, as messages name it: "Gather node 'emb'"
    wraps: bool = True   # the index is ONNX's, wrapped: -n..n-1 are valid


def message(tensor: str, dim: str, v: int, n: int, origin: Origin | None = None,
            what: str = "read of") -> str:
    """The message for wrapped index ``v`` out of range for ``tensor``'s dim ``dim`` of size
    ``n`` (the C engine's mp_index_message says the same)."""
    if origin is None:
        return (f"{what} %{tensor} dim {dim}: index {v} out of range for dim of size {n} "
                f"(valid 0..{n - 1})")
    if not origin.wraps:
        return f"{origin.node}: index {v} out of range for dim of size {n} (valid 0..{n - 1})"
    raw = v - n if v < 0 else v
    return f"{origin.node}: index {raw} out of range for dim of size {n} (valid {-n}..{n - 1})"


def is_wrapped(ix) -> bool:
    """Whether index expression ``ix`` is ONNX's wrap ``select(lt(i, 0), i + n, i)``."""
    if ix.op != "select":
        return False
    cond, neg, pos = ix.args
    return (cond.op == "lt" and cond.args[0] == pos and cond.args[1].is_const
            and cond.args[1].value == 0 and neg.op == "add" and pos in neg.args)


def encode(origins: dict) -> list:
    """The portable program's "origins": ``[[tensor, dim, node, wraps], ...]``."""
    return [[t, d, o.node, o.wraps] for (t, d), o in origins.items()]


def decode(j) -> dict:
    """``encode``'s inverse; entries it cannot read are skipped (they only improve messages)."""
    out = {}
    for e in j if isinstance(j, list) else []:
        if isinstance(e, list) and len(e) == 4 and all(isinstance(x, str) for x in e[:3]):
            out[(e[0], e[1])] = Origin(e[2], bool(e[3]))
    return out
