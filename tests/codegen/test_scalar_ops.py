"""Every scalar op of the IR (spec/ir/expr.py's UNARY and BINARY) has a rule in every backend:
the NumPy interpreter (spec/ir/interp.py's tables, what the IR means), the C engine's portable
interpreter (runtime/c/src/portable.c's op enum, name table and switch) and the LLVM lowering
(codegen/llvm/oprules.py's tables, run through the cpu target of this host). The tables are
checked first, by name and dtype class; then each op runs elementwise on inputs inside its domain, in every
dtype class it takes (float, signed integer, bool), on all three; the engine's results must
match the interpreter's (floats rtol 1e-5, atol 1e-6, NaN where it gives NaN; integers and bools
exactly). An op added to the IR without a rule in one backend fails here, and so does a new op
that is not given a dtype class below.
"""

from __future__ import annotations

import numpy as np
import pytest

import re
from pathlib import Path

from mlpack.backend import host_target
from mlpack.codegen.llvm import oprules
from mlpack.codegen.targets import registry
from mlpack.packager.build import artifact_spec, model_signature
from mlpack.runtime import native
from mlpack.spec.container import write_container
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir import interp
from mlpack.spec.ir.interp import run_graph
from mlpack.spec.tensorfile import write_tensors
from support import parse_ir

PREDICATES = ex.UNARY_PREDICATES | ex.COMPARISONS
# the dtype classes each op is defined on (what the importer emits it for)
FLOAT_UNARY = ex.UNARY - {"not", "bitnot"}
INT_UNARY = {"neg", "abs", "sign", "bitnot"}
BOOL_UNARY = {"not"}
FLOAT_BINARY = ({"add", "sub", "mul", "div", "floordiv", "mod", "fmod", "pow", "max", "min", "atan2"}
                | ex.COMPARISONS)
INT_BINARY = ({"add", "sub", "mul", "div", "floordiv", "mod", "max", "min", "bitand", "bitor",
               "bitxor", "shl", "shr"} | ex.COMPARISONS)
BOOL_BINARY = ex.LOGICAL | {"eq", "ne"}

A_FLOAT = np.array([-0.85, -0.6, -0.35, -0.1, 0.15, 0.4, 0.65, 0.9], np.float32)
B_FLOAT = np.array([0.3, -0.7, 1.1, 0.5, -0.25, 2.0, 0.75, -1.5], np.float32)
A_INT = np.array([-7, -3, 0, 1, 5, 9, 12, 100], np.int32)
B_INT = np.array([2, 3, -4, 5, 1, 7, 3, 2], np.int32)
B_SHIFT = np.array([1, 2, 3, 0, 4, 5, 1, 2], np.int32)
A_BOOL = np.array([0, 0, 1, 1, 0, 1, 0, 1], bool)
B_BOOL = np.array([0, 1, 0, 1, 1, 1, 0, 0], bool)


def _float_input(op: str) -> np.ndarray:
    if op in ("log", "sqrt", "pow"):
        return np.abs(A_FLOAT)
    if op == "acosh":
        return 1 + np.abs(A_FLOAT)
    return A_FLOAT


def _cases():
    for op in sorted(FLOAT_UNARY):
        yield op, "f32", (_float_input(op),)
    for op in sorted(INT_UNARY):
        yield op, "i32", (A_INT,)
    for op in sorted(BOOL_UNARY):
        yield op, "bool", (A_BOOL,)
    for op in sorted(FLOAT_BINARY):
        yield op, "f32", (_float_input(op), B_FLOAT)
    for op in sorted(INT_BINARY):
        yield op, "i32", (A_INT, B_SHIFT if op in ("shl", "shr") else B_INT)
    for op in sorted(BOOL_BINARY):
        yield op, "bool", (A_BOOL, B_BOOL)


CASES = list(_cases())


def test_every_op_of_the_ir_is_covered():
    covered = {op for op, _, _ in CASES}
    assert covered == ex.UNARY | ex.BINARY, sorted((ex.UNARY | ex.BINARY) ^ covered)


PORTABLE_C = Path(__file__).parents[2] / "runtime" / "c" / "src" / "portable.c"


def test_every_op_has_a_numpy_rule():
    assert ex.UNARY <= interp._UNARY.keys()
    assert ex.BINARY <= interp._BINARY.keys() | interp._INT_BINARY.keys()
    assert INT_BINARY - interp._BINARY.keys() <= interp._INT_BINARY.keys()


def test_every_op_has_an_llvm_rule_per_dtype_class():
    for table, ops in ((oprules.FLOAT_UNARY, FLOAT_UNARY), (oprules.INT_UNARY, INT_UNARY),
                       (oprules.BOOL_UNARY, BOOL_UNARY), (oprules.FLOAT_BINARY, FLOAT_BINARY),
                       (oprules.INT_BINARY, INT_BINARY),
                       (oprules.BOOL_BINARY | oprules.INT_BINARY, BOOL_BINARY)):
        assert ops <= table.keys(), sorted(ops - table.keys())


def test_every_op_has_a_rule_in_the_c_interpreter():
    src = PORTABLE_C.read_text()
    names = re.search(r"mp_op_names\[OP_COUNT\] = \{(.*?)\};", src, re.S).group(1)
    enum = re.search(r"enum \{\s*OP_CONST(.*?)OP_COUNT", src, re.S).group(1)
    named = set(re.findall(r'"([^"]+)"', names))
    for op in sorted(ex.UNARY | ex.BINARY):
        assert op in named, f"portable.c's mp_op_names lacks {op}"
        assert re.search(rf"\bOP_{op.upper()}\b", enum), f"portable.c's op enum lacks OP_{op.upper()}"
        assert f"case OP_{op.upper()}:" in src, f"portable.c has no case for OP_{op.upper()}"


def _graph(op: str, dtype: str, arity: int):
    out = "bool" if op in PREDICATES else dtype
    names = ["a", "b"][:arity]
    ins = "\n".join(f"  in %{n}: {dtype}{{n=8}} (n)" for n in names)
    args = ", ".join(f"%{n}[n=n]" for n in names)
    return parse_ir(f'graph "{op}" {{\n{ins}\n  %y: {out}{{n=8}} = {op}({args})\n  out %y (n)\n}}')


@pytest.fixture(scope="module")
def cpu_target() -> str:
    if not native.available():
        pytest.skip("libmlpack is not built")
    return host_target()


@pytest.mark.parametrize("op, dtype, inputs", CASES, ids=[f"{op}-{dt}" for op, dt, _ in CASES])
def test_op_has_a_rule_in_every_backend(op, dtype, inputs, cpu_target, tmp_path):
    g = _graph(op, dtype, len(inputs))
    feeds = dict(zip(("a", "b"), inputs))
    want = run_graph(g, feeds)["y"]
    sig = model_signature(g)
    specs = []
    for target in (registry.ALWAYS, cpu_target):
        code = registry.get(target).compile(g, "fp32")
        specs.append(artifact_spec(op, target, "fp32", code, write_tensors(code.weights or {}), sig,
                                   "none (test)"))
    path = str(tmp_path / f"{op}.mlpack")
    write_container(path, op, specs)
    for device in ("portable", "cpu"):
        with native.open_model(path, device=device, strict=device == "cpu") as m:
            assert [a.device for a in m.artifacts if a.chosen] == [device]
            got = m.run(feeds)["y"]
        where = f"{op} on {dtype} by the {'C portable interpreter' if device == 'portable' else cpu_target}"
        assert got.dtype == want.dtype, where
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=where)
        else:
            np.testing.assert_array_equal(got, want, err_msg=where)
