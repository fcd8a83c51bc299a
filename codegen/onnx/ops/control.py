"""Control flow: If, Loop, Scan, imported through their subgraphs (``b.import_subgraph``).

The IR's dataflow part has no loops over ops, only comprehensions, so control flow is resolved
at import time where it can be:

- **If** with a condition known at import imports only the taken branch; otherwise both
  branches are imported and each output is one elementwise ``select(cond, then, else)``
  (so the branches' outputs must have the same shape).
- **Scan** and **Loop** with a static trip count are *unrolled*: the body is imported once per
  iteration with the loop-carried Values of the previous one (and, for Scan, views of the scan
  inputs at step t). Per-step scan outputs are materialized and stacked by one comprehension
  whose body picks the step by index (a balanced select tree). Unrolled loops are plain
  dataflow, so every target compiles them and the passes fuse across iterations.
- A data-dependent trip count or loop condition cannot be unrolled; it needs a procedure with
  a While (the IR has one; lowering Loop bodies into procedures is future work), so such nodes
  fail with an UnsupportedOpError saying so. Trip counts and conditions that depend on graph
  inputs the backend can specialize on (integers, scalars) raise ``NeedsValue`` first.

Sequences and optionals (in branches or loop state) are not supported and fail clearly.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.builder import NeedsValue
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.ops.shape import norm_axis, view

MAX_UNROLL = 256   # at most this many unrolled iterations (Loop trip count, Scan length)


# ---------------------------------------------------------------- helpers


def _check_tensors(n, graph: onnx.GraphProto, what: str) -> None:
    """Fail clearly when a subgraph declares a sequence, map or optional input or output."""
    for vi in list(graph.input) + list(graph.output):
        if vi.type.WhichOneof("value") not in (None, "tensor_type"):
            kind = vi.type.WhichOneof("value").replace("_type", "")
            raise n.fail(f"{what} {vi.name!r} is of {kind} type; only tensors are supported")


def _known_scalar(v):
    """The Python value of a one-element Value known at import time, else None."""
    if v.data is not None and np.size(v.data) == 1:
        return np.asarray(v.data).reshape(-1)[0].item()
    if v.known is not None and len(v.known) == 1:
        k = _fold_size(v.known[0])   # e.g. a comparison of two constants: lt(0, 2)
        return k.value if k.is_const else None
    return None


def _need_scalar(b, n, v, what: str):
    """A scalar input's value at import. While the graph has inputs the backend can specialize
    on (integer or bool tensors, scalars), NeedsValue asks it to; once none are left, the value
    depends on tensor data and the node fails clearly."""
    value = _known_scalar(v)
    if value is not None:
        return value
    if _specializable_inputs(b):
        raise NeedsValue(n.name, what)
    raise n.fail(f"{what} is computed from tensor data at run time; data-dependent loops need "
                 "a procedural While, which mlpack does not lower yet")


def _specializable_inputs(b) -> bool:
    """Whether any graph input is one the backend specializes on (see mlpack/backend.py)."""
    for p in b.graph.inputs:
        ty = b.graph.types[p.name]
        if dt.is_int(ty.dtype) or ty.dtype == "bool" or not ty.dims:
            return True
    return False


def _settle(b, v):
    """A loop-carried Value that is a plain tensor or a known constant, so views do not
    nest across unrolled iterations; constant size expressions are folded so that shapes
    do not grow from one iteration to the next."""
    if v.tensor is None and v.known is None and v.data is None:
        v = b.materialize(v)
    return _folded(v)


def _fold_size(s: ex.Expr) -> ex.Expr:
    """A size or known integer with no symbols as a constant (max(div(32, 4), 8) -> 8)."""
    if s.is_const or any(e.op in ("sym", "var", "read") for e in ex.walk(s)):
        return s
    try:
        value = ex.index_value(s, {})
        return ex.const(bool(value) if s.dtype == "bool" else int(value))
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return s


def _folded(v):
    shape = tuple(_fold_size(s) for s in v.shape)
    return v if shape == v.shape else dataclasses.replace(v, shape=shape)


def _same_shape(a, c) -> bool:
    return a.rank == c.rank and all(ex.same_size(_fold_size(x), _fold_size(y))
                                    for x, y in zip(a.shape, c.shape))


def _step_view(b, v, axis: int, t: int):
    """``v`` at index ``t`` of ``axis`` (that axis dropped)."""
    shape = v.shape[:axis] + v.shape[axis + 1:]
    names = v.names[:axis] + v.names[axis + 1:]

    def at(idx):
        idx = list(idx)
        return v.at(idx[:axis] + [ex.const(t)] + idx[axis:])

    return view(b, v, shape, at, names)


def _stack(b, n, steps: list, axis: int, what: str):
    """The per-step Values stacked along a new ``axis``: out[..t..] = steps[t][...]."""
    first = steps[0]
    for s in steps[1:]:
        if s.dtype != first.dtype or not _same_shape(s, first):
            raise n.fail(f"{what} changes shape or type across iterations "
                         f"({list(first.shape)} {first.dtype} vs {list(s.shape)} {s.dtype})")
    parts = [b.materialize(s) for s in steps]
    shape = list(_folded(first).shape)
    shape.insert(axis, ex.const(len(steps)))
    names = list(first.names)
    names.insert(axis, "t")

    def at(idx):
        t, sub = idx[axis], list(idx[:axis]) + list(idx[axis + 1:])

        def pick(lo, hi):
            if hi - lo == 1:
                return parts[lo].at(sub)
            mid = (lo + hi) // 2
            return ex.select(ex.binary("lt", t, ex.const(mid)), pick(lo, mid), pick(mid, hi))

        return pick(0, len(parts))

    return b.map(first.dtype, shape, at, names)


def _empty_stack(b, n, vi: onnx.ValueInfoProto, what: str):
    """A scan output of zero iterations: its shape must be declared by the body."""
    from mlpack.codegen.onnx.importer import onnx_dtype
    tt = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape") or None in dims:
        raise n.fail(f"{what} {vi.name!r} has zero iterations and no static declared shape")
    dtype = onnx_dtype(tt.elem_type, f"{what} {vi.name!r}", n)
    return b.constant(np.zeros([0] + dims, dtype=dt.to_numpy(dtype)))


# ---------------------------------------------------------------- If


@op("If")
def if_(b, n):
    then_g, else_g = n.attr("then_branch"), n.attr("else_branch")
    _check_tensors(n, then_g, "then_branch output")
    _check_tensors(n, else_g, "else_branch output")
    cond = n.inputs[0]
    known = _known_scalar(cond)
    if known is not None:
        return list(b.import_subgraph(then_g if known else else_g, []))
    if not (cond.numel().is_const and cond.numel().value == 1):
        raise n.fail(f"the condition must have one element, it has shape {list(cond.shape)}")
    then_v = b.import_subgraph(then_g, [])
    else_v = b.import_subgraph(else_g, [])
    c = ex.cast(cond.at([ex.const(0)] * cond.rank), "bool")
    return [_select(b, n, c, t, e, i) for i, (t, e) in enumerate(zip(then_v, else_v))]


def _select(b, n, c, t, e, i: int):
    if t.dtype != e.dtype or not _same_shape(t, e):
        raise n.fail(f"output {i}: the branches give {list(t.shape)} {t.dtype} and "
                     f"{list(e.shape)} {e.dtype}; a condition computed at run time needs "
                     "branches of one shape and type (they are merged by an elementwise select)")
    shape = _folded(t).shape
    return b.map(t.dtype, shape, lambda idx: ex.select(c, t.at(idx), e.at(idx)), t.names)


# ---------------------------------------------------------------- Scan


@op("Scan")
def scan(b, n):
    body = n.attr("body")
    _check_tensors(n, body, "body input/output")
    m = n.attr("num_scan_inputs")
    if n.opset < 9:
        return _scan8(b, n, body, m)
    ins = list(n.inputs)
    k = len(ins) - m
    states, xs = ins[:k], ins[k:]
    if any(v is None for v in ins):
        raise n.fail("an input is missing")
    in_axes = [norm_axis(n, a, x.rank) for a, x in zip(_attr_list(n, "scan_input_axes", m), xs)]
    in_dirs = _attr_list(n, "scan_input_directions", m)
    n_out = len(body.output) - k
    out_axes = _attr_list(n, "scan_output_axes", n_out)
    out_dirs = _attr_list(n, "scan_output_directions", n_out)
    finals, steps = _scan_run(b, n, body, states, xs, in_axes, in_dirs)
    outs = []
    for j in range(n_out):
        seq = [s[j] for s in steps]
        if out_dirs[j]:
            seq.reverse()
        rank = (seq[0].rank if seq else len(body.output[k + j].type.tensor_type.shape.dim)) + 1
        outs.append(_scan_output(b, n, body.output[k + j], seq, norm_axis(n, out_axes[j], rank)))
    return finals + outs


def _attr_list(n, name: str, count: int) -> list[int]:
    vals = n.attr(name, None)
    vals = [0] * count if vals is None else list(vals)
    if len(vals) != count:
        raise n.fail(f"attribute {name!r} has {len(vals)} entries, expected {count}")
    return vals


def _scan_run(b, n, body, states, xs, axes, dirs):
    """Unroll the body over the scan inputs; (final states, per-step scan outputs)."""
    if not xs:
        raise n.fail("Scan without scan inputs has no sequence length")
    length = xs[0].shape[axes[0]]
    for x, a in zip(xs, axes):
        if not ex.same_size(x.shape[a], length):
            raise n.fail(f"scan inputs disagree on the sequence length ({length} vs {x.shape[a]})")
    if not length.is_const:
        raise n.fail(f"the sequence length {length} is symbolic; Scan is unrolled, so its length "
                     "must be static (a symbolic length needs a procedural While: future work)")
    if length.value > MAX_UNROLL:
        raise n.fail(f"the sequence length {length.value} is over the unroll limit {MAX_UNROLL}")
    states, steps = list(states), []
    for t in range(length.value):
        views = [_step_view(b, x, a, length.value - 1 - t if d else t)
                 for x, a, d in zip(xs, axes, dirs)]
        outs = b.import_subgraph(body, states + views)
        states = [_settle(b, v) for v in outs[:len(states)]]
        steps.append(outs[len(states):])
    return states, steps


def _scan_output(b, n, vi, seq, axis: int):
    if not seq:
        return _empty_stack(b, n, vi, "scan output")
    return _stack(b, n, seq, axis, f"scan output {vi.name!r}")


def _scan8(b, n, body, m: int):
    """Scan-8: a leading batch axis on every state and scan input, scan axis 1, an optional
    sequence_lens first. Unrolled per batch element, then stacked over the batch."""
    seq_lens, rest = n.input(0), list(n.inputs[1:])
    k = len(rest) - m
    states, xs = rest[:k], rest[k:]
    if any(v is None for v in rest) or not xs:
        raise n.fail("an input is missing")
    batch = xs[0].shape[0]
    if not batch.is_const:
        raise n.fail(f"the batch size {batch} is symbolic; Scan-8 is unrolled per batch element")
    dirs = _attr_list(n, "directions", m)
    if seq_lens is not None:
        _check_full_lengths(b, n, seq_lens, xs[0].shape[1])
    per_batch = []
    for i in range(batch.value):
        st = [_step_view(b, s, 0, i) for s in states]
        xi = [_step_view(b, x, 0, i) for x in xs]
        finals, steps = _scan_run(b, n, body, st, xi, [0] * m, dirs)
        scans = [_scan_output(b, n, body.output[k + j], [s[j] for s in steps], 0)
                 for j in range(len(body.output) - k)]
        per_batch.append(finals + scans)
    return [_stack(b, n, [r[j] for r in per_batch], 0, f"output {j}")
            for j in range(len(per_batch[0]))]


def _check_full_lengths(b, n, seq_lens, length) -> None:
    lens = seq_lens.known_ints()
    if lens is None and seq_lens.data is not None:
        lens = [int(x) for x in np.asarray(seq_lens.data).reshape(-1)]
    if lens is None:
        if _specializable_inputs(b):
            raise NeedsValue(n.name, "sequence_lens")
        raise n.fail("sequence_lens computed from tensor data at run time is not supported")
    if not length.is_const or any(x != length.value for x in lens):
        raise n.fail(f"sequence_lens {lens} shorter than the scan length {length} are "
                     "not supported")


# ---------------------------------------------------------------- Loop


@op("Loop")
def loop(b, n):
    body = n.attr("body")
    _check_tensors(n, body, "body input/output")
    trip, cond = n.input(0), n.input(1)
    states = list(n.inputs[2:])
    if trip is None and cond is None:
        raise n.fail("a Loop with neither trip count nor condition never ends")
    max_trip = None if trip is None else int(_need_scalar(b, n, trip, "the trip count M"))
    go = True if cond is None else bool(_need_scalar(b, n, cond, "the loop condition"))
    k = len(states)
    steps, t = [], 0
    while go and (max_trip is None or t < max_trip):
        if t >= MAX_UNROLL:
            raise n.fail(f"the loop runs over {MAX_UNROLL} iterations, the unroll limit "
                         "(longer loops need a procedural While: future work)")
        it = b.constant(np.array(t, dtype=np.int64))
        outs = b.import_subgraph(body, [it, b.constant(np.array(go))] + states)
        go = _known_scalar(outs[0])
        if go is None:
            raise n.fail(f"the body's condition output {body.output[0].name!r} is computed "
                         "from data at run time; data-dependent loops need a procedural While, "
                         "which mlpack does not lower yet")
        go = bool(go)
        states = [_settle(b, v) for v in outs[1:1 + k]]
        steps.append(outs[1 + k:])
        t += 1
    scans = []
    for j, vi in enumerate(body.output[1 + k:]):
        seq = [s[j] for s in steps]
        scans.append(_scan_output(b, n, vi, seq, 0))
    return states + scans
