"""Reference test vectors: seeded inputs, the outputs ONNX Runtime computes for them, and the
archive that carries them with the float64 reference.

A container carries its vectors as a tensor archive (``spec/tensorfile.py``) with tensors
``case{i}/input/{name}``, ``case{i}/reference64/{name}`` (the float64 reference,
``reference.float64_outputs``) and ``case{i}/output/{name}`` (ONNX Runtime's fp32 outputs, the
baseline whose own error sets the tolerance: ``spec/accuracy.py``) and metadata ``{"cases": N,
"reference": "float64 ...", "baseline": "onnxruntime <version>"}``. ONNX Runtime is the baseline
because it is what users compare against; the packager is the only part of mlpack that imports
it.

Inputs are drawn so that every model runs on them: floats N(0, 1), integers in [0, 10) (token ids
and indices must stay inside an embedding table; 10 is below most vocabularies), and below the
size of every dim an integer input indexes when that is smaller (``index_limits``: a Gather from
a table of 5 rows draws ids in [0, 5)), booleans fair coins.
Case 0 binds every size symbol to its default (1, or ``--dim NAME=SIZE``); later cases move the
symbols the user did not bind to other sizes, so a container proves it runs at more than one
shape. Symbols the user bound stay fixed: a model may only work at that size.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from mlpack.spec.errors import Error, InputError
from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.expr import free_syms, index_value
from mlpack.spec.tensorfile import write_tensors

INT_HIGH = 10  # integer inputs are drawn from [0, INT_HIGH)
DEFAULT_SIZE = 1  # a size symbol's default in case 0


@dataclass(frozen=True)
class InputSpec:
    """A model input as the vectors need it: name, IR dtype, dims (name, size expr) in order."""

    name: str
    dtype: str
    dims: tuple  # ((dim name, Expr), ...) in the input's layout


def input_specs(graph) -> list[InputSpec]:
    """The graph's inputs, in order, with their dims in layout order."""
    out = []
    for port in graph.inputs:
        ty = graph.types[port.name]
        out.append(InputSpec(port.name, ty.dtype, tuple((d, ty.dims[d]) for d in port.layout)))
    return out


def input_symbols(specs: list[InputSpec]) -> list[str]:
    """The size symbols the inputs' dims use, in order of first appearance."""
    seen: dict[str, None] = {}
    for spec in specs:
        for _, size in spec.dims:
            for s in sorted(free_syms(size)):
                seen.setdefault(s)
    return list(seen)


def case_sizes(symbols: list[str], bound: dict[str, int], cases: int) -> list[dict[str, int]]:
    """Symbol sizes per case: case 0 at the defaults, case i with the free symbols at 1 + i."""
    unknown = sorted(set(bound) - set(symbols))
    if unknown:
        have = ", ".join(symbols) if symbols else "none"
        raise InputError(f"--dim {unknown[0]}: the model has no size symbol {unknown[0]!r} "
                         f"(its symbols: {have})")
    out = []
    for i in range(cases):
        out.append({s: bound[s] if s in bound else DEFAULT_SIZE + i for s in symbols})
    return out


def _random_array(rng: np.random.Generator, dtype: str, shape: tuple[int, ...],
                  high: int = INT_HIGH) -> np.ndarray:
    np_dtype = dt.to_numpy(dtype)
    if dt.is_float(dtype):
        return rng.standard_normal(shape).astype(np_dtype)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    return rng.integers(0, high, size=shape).astype(np_dtype)


def _stmt_exprs(stmts):
    for s in stmts:
        for name in ("value", "cond", "extent"):
            if getattr(s, name, None) is not None:
                yield getattr(s, name)
        yield from getattr(s, "index", {}).values()
        for name in ("body", "then", "orelse"):
            yield from _stmt_exprs(getattr(s, name, ()))


def index_limits(graph) -> dict[str, int]:
    """{integer input: the smallest constant size of a dim it indexes}, for the inputs that
    index something (token ids, Gather and Scatter indices): ids drawn below it are valid."""
    from mlpack.spec.ir.expr import walk
    from mlpack.spec.ir.graph import Comprehension

    inputs = {p.name for p in graph.inputs if dt.is_int(graph.types[p.name].dtype)}
    limits: dict[str, int] = {}
    for op in graph.ops:
        exprs = [op.body] if isinstance(op, Comprehension) else list(_stmt_exprs(op.body))
        for e in exprs:
            for node in walk(e):
                if node.op != "read" or node.arg[0] not in graph.types:
                    continue
                ty = graph.types[node.arg[0]]
                for dim, index in zip(node.arg[1], node.args):
                    size = ty.dims.get(dim)
                    if size is None or not size.is_const or size.value < 1:
                        continue
                    for x in walk(index):
                        if x.op == "read" and x.arg[0] in inputs:
                            limits[x.arg[0]] = min(limits.get(x.arg[0], size.value), size.value)
    return limits


def random_case(specs: list[InputSpec], sizes: dict[str, int],
                rng: np.random.Generator, limits: dict[str, int] | None = None
                ) -> dict[str, np.ndarray]:
    """Seeded inputs for one case, with the size symbols bound to ``sizes``; integer inputs
    below ``limits`` where it names them (``index_limits``)."""
    feeds = {}
    for spec in specs:
        shape = tuple(index_value(size, sizes) for _, size in spec.dims)
        high = min(INT_HIGH, (limits or {}).get(spec.name, INT_HIGH))
        feeds[spec.name] = _random_array(rng, spec.dtype, shape, high)
    return feeds


def random_cases(graph, *, dims: dict[str, int] | None, cases: int, seed: int) -> list[dict]:
    """``cases`` seeded input sets for ``graph`` (one when the inputs have no size symbol and
    fewer were asked for)."""
    if cases < 1:
        raise InputError(f"--cases {cases}: at least one test case is needed")
    specs = input_specs(graph)
    sizes = case_sizes(input_symbols(specs), dict(dims or {}), cases)
    for s in sizes:
        _check_size(specs, s, dims or {})
    rng = np.random.default_rng(seed)
    limits = index_limits(graph)
    return [random_case(specs, s, rng, limits) for s in sizes]


def _check_size(specs: list[InputSpec], sizes: dict[str, int], bound: dict[str, int]) -> None:
    """Refuse inputs too large to draw (the importer's per-tensor limit), before drawing."""
    from mlpack.codegen.onnx.checks import MAX_TENSOR_BYTES, size_text

    for spec in specs:
        shape = [index_value(size, sizes) for _, size in spec.dims]
        nbytes = math.prod(shape) * np.dtype(dt.to_numpy(spec.dtype)).itemsize
        if nbytes > MAX_TENSOR_BYTES:
            dims = " ".join(f"--dim {k}={v}" for k, v in bound.items()) or "its sizes"
            raise InputError(f"{dims}: input {spec.name!r} would have shape {shape} "
                             f"({size_text(nbytes)}), over the {size_text(MAX_TENSOR_BYTES)} "
                             "mlpack allows for one tensor")


def load_npz(path, graph) -> list[dict]:
    """The one case a user's ``--inputs FILE.npz`` gives (an array per input, by name)."""
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            feeds = {k: np.asarray(z[k]) for k in z.files}
    except FileNotFoundError:
        raise InputError(f"{path}: no such file (--inputs)") from None
    except Exception as e:  # np.load raises many kinds for a bad file
        raise InputError(f"{path}: not a readable .npz file ({e})") from None
    return user_case(feeds, graph, path)


def user_case(feeds: dict, graph, where: str) -> list[dict]:
    """A user's inputs as the one test case, checked against the graph's inputs (names, ranks,
    dtypes); arrays it has beyond the inputs are ignored."""
    specs = input_specs(graph)
    feeds = {k: np.asarray(v) for k, v in feeds.items()}
    _check_case(feeds, specs, where)
    return [{s.name: feeds[s.name] for s in specs}]


def _check_case(feeds: dict, specs: list[InputSpec], where: str) -> None:
    names = [s.name for s in specs]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InputError(f"{where}: has no array for input {missing[0]!r}; the model's inputs "
                         f"are {names} (found {sorted(feeds)})")
    for s in specs:
        a = feeds[s.name]
        if a.ndim != len(s.dims):
            raise InputError(f"{where}: input {s.name!r} has rank {a.ndim} (shape "
                             f"{list(a.shape)}), the model wants rank {len(s.dims)}")
        try:
            got = dt.from_numpy(a.dtype)
        except KeyError:
            got = str(a.dtype)
        if got != s.dtype:
            raise InputError(f"{where}: input {s.name!r} has dtype {got}, the model wants {s.dtype}")


# ---------------------------------------------------------------- the oracle


class OracleError(Error):
    """ONNX Runtime (the oracle for test vectors) refuses the model or its inputs."""


def reference_name() -> str:
    import onnxruntime

    return f"onnxruntime {onnxruntime.__version__}"


def _ort_feeds(model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds for every graph input ONNX Runtime wants: ONNX lists inputs the IR may have dropped
    (unused ones), and ORT refuses a run without them, so those get zeros of their type."""
    from onnx import helper

    inits = {t.name for t in model.graph.initializer}
    out = dict(feeds)
    for vi in model.graph.input:
        if vi.name in inits or vi.name in out:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else DEFAULT_SIZE for d in tt.shape.dim]
        out[vi.name] = np.zeros(shape, helper.tensor_dtype_to_np_dtype(tt.elem_type))
    return out


EXACT_INT8 = "session.x64quantprecision"   # ONNX Runtime's session option (since 1.13)


def reference_outputs(model, cases: list[dict], output_names: list[str],
                      path=None, threads: int = 0) -> list[dict]:
    """The outputs ONNX Runtime computes for each case, by output name: of ``model``, or of
    the file ``path`` when the model is one (``model`` may then lack its weights' data), on
    ``threads`` intra-op threads (0: ONNX Runtime's default, one per core)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    # its warnings about unused initializers are not the user's problem, and its errors come
    # back as the exception below: printed as well, they would make the CLI's error two lines
    opts.log_severity_level = 4
    # its u8 x s8 kernels (QLinearConv, MatMulInteger, a QDQ model's fused contractions) add
    # pairs of products in saturating i16 on x86 CPUs without VNNI (vpmaddubsw), so a quantized
    # model's reference would depend on the build host's CPU; this option makes them exact
    opts.add_session_config_entry(EXACT_INT8, "1")
    try:
        session = ort.InferenceSession(path if path is not None else model.SerializeToString(),
                                       opts, providers=["CPUExecutionProvider"])
        return [dict(zip(output_names, session.run(output_names, _ort_feeds(model, c))))
                for c in cases]
    except Exception as e:  # ORT raises its own exception types for a model it refuses
        raise OracleError(f"ONNX Runtime, the reference, cannot run this model: "
                          f"{type(e).__name__}: {e}") from None


# ---------------------------------------------------------------- the archive


def pack(inputs: list[dict], outputs: list[dict], baseline: str,
         references: list[dict] | None = None) -> bytes:
    """The test-vector tensor archive (deterministic for the same arrays): the inputs, the
    baseline's ``outputs`` and, when given, the float64 ``references``."""
    from mlpack.spec.accuracy import REFERENCE

    tensors = {}
    for i, (feeds, outs) in enumerate(zip(inputs, outputs)):
        tensors.update({f"case{i}/input/{n}": np.ascontiguousarray(a) for n, a in feeds.items()})
        tensors.update({f"case{i}/output/{n}": np.ascontiguousarray(a) for n, a in outs.items()})
        if references is not None:
            tensors.update({f"case{i}/reference64/{n}": np.ascontiguousarray(a)
                            for n, a in references[i].items()})
    meta = {"cases": len(inputs), "reference": baseline}
    if references is not None:
        meta.update(reference=REFERENCE, baseline=baseline)
    return write_tensors(tensors, meta)


def unpack(blob: bytes) -> tuple[list[dict], list[dict], list[dict] | None]:
    """``pack``'s archive read back: (inputs, the baseline's outputs, the float64 references or
    None) per case."""
    from mlpack.spec.tensorfile import read_header, read_tensors

    cases = int(read_header(blob)["metadata"]["cases"])
    parts = {kind: [{} for _ in range(cases)] for kind in ("input", "output", "reference64")}
    for name, a in read_tensors(blob).items():
        case, kind, tensor = name.split("/", 2)
        parts[kind][int(case.removeprefix("case"))][tensor] = np.array(a)
    refs = parts["reference64"] if any(parts["reference64"]) else None
    return parts["input"], parts["output"], refs
