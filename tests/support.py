"""Helpers shared by the tests: the ONNX Runtime oracle and the light-model builders.

``check(model, feeds)`` runs a model through ``mlpack.backend`` and through an oracle (ONNX
Runtime, or ONNX's reference evaluator where ONNX Runtime departs from the spec) and compares:
same count, shapes and dtypes; integers exactly (or within ``int_slack``), floats within
rtol/atol. conftest.py puts this folder on sys.path, so tests ``from support import check``.

What the host runs: CI machines are Intel or AMD, with or without AVX-512 (x86-64 v4), VNNI,
BF16 or AMX, so a test that runs native code asks ``host_lacks(target)`` (or uses
``host_params``, ``best_host_target``, ``runs_native``) rather than assuming a level.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager

import numpy as np

import mlpack.backend as backend

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


def oracle_outputs(model, feeds, oracle: str = "ort"):
    """The oracle's outputs: ONNX Runtime ("ort"); ONNX Runtime without graph optimizations
    ("ort-unfused": QDQ nodes run as written, in float); ONNX Runtime with exact int8 kernels
    ("ort-exact": its u8 x s8 kernels add pairs of products in saturating i16 on x86 CPUs
    without VNNI, ``vpmaddubsw``, so a quantized model's outputs depend on the CPU unless its
    session option asks for exact ones, as the build's reference does); or ONNX's reference
    evaluator."""
    if oracle in ("ort", "ort-unfused", "ort-exact"):
        import onnxruntime as ort

        from mlpack.packager.testvectors import EXACT_INT8
        opts = ort.SessionOptions()
        if oracle == "ort-unfused":
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if oracle == "ort-exact":
            opts.add_session_config_entry(EXACT_INT8, "1")
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model).run(None, feeds)


def assert_outputs_match(got, want, rtol: float, atol: float, int_slack: int = 0) -> None:
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.kind in "iub":
            assert np.abs(g.astype(np.int64) - w.astype(np.int64)).max(initial=0) <= int_slack
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def check(model, feeds, rtol: float = 1e-4, atol: float = 1e-5, oracle: str = "ort",
          int_slack: int = 0, rep=None) -> None:
    """mlpack's outputs for ``feeds`` match the oracle's (fp32 default: rtol 1e-4, atol 1e-5)."""
    want = oracle_outputs(model, feeds, oracle)
    got = (rep or backend.prepare(model)).run(feeds)
    assert_outputs_match(got, want, rtol, atol, int_slack)


def load_models_module(name: str):
    """tests/models/NAME.py as a module (model builders: light, capsule)."""
    spec = importlib.util.spec_from_file_location(f"mlpack_test_{name}",
                                                  os.path.join(MODELS_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_light():
    """tests/models/light.py as a module (the light_* model builders)."""
    return load_models_module("light")


def cli(*args):
    """Run the ``mlpack`` CLI in-process; returns typer's Result (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from mlpack.packager.cli import app
    return CliRunner().invoke(app, [str(a) for a in args])


def emulated(target: str) -> str:
    """The qemu-user program ``mlpack build`` and ``validate`` run ``target``'s artifacts under
    on this host (packager/emulate.py), or "" where they run natively or not at all."""
    from mlpack.packager import emulate
    from mlpack.runtime import detect_host
    from mlpack.spec import media

    arch = (media.platform_for(target) or {}).get("architecture")
    emu = emulate.EMULATORS.get(arch)
    if emu is None or arch == detect_host().arch or emulate.missing(emu):
        return ""
    return emu.qemu


@contextmanager
def patient_emulation():
    """Builds wait for their emulated runs to the end. A build stops one after 5 s
    (MLPACK_EMULATION_SECONDS: its budget on a user's machine), which a slower or busier host
    passes (a riscv64 attention block: 4 s under qemu on a Zen 4, 7 s on a Sapphire Rapids
    guest), so a test asserting that another architecture's code ran and agreed must not depend
    on it; the limit itself is tested in tests/packager/test_emulate.py."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLPACK_EMULATION_SECONDS", "600")
        yield


def host_lacks(target: str) -> str | None:
    """Why this host cannot run ``target``'s native code, or None where it can.

    The test selection makes (runtime/select.py): the target's OCI architecture and the CPU
    features its artifacts' configs name, against ``detect_host()`` (which drops AMX where Linux
    refuses the tile state). Tests that run code themselves (plan_runner.py, ctypes) ask this
    first: an x86-64 v4 kernel on a v3 host is SIGILL, which kills the whole test process."""
    from mlpack.codegen.targets import registry
    from mlpack.runtime import detect_host
    from mlpack.spec import media

    t, host = registry.get(target), detect_host()
    arch = (t.platform or {}).get("architecture")
    if arch is None:
        return None if t.device == "portable" else f"{target} is no cpu target"
    if arch != host.arch:
        return f"{target} is {arch} code, this host is {host.arch}"
    missing = [f for f in media.config_cpu_features(t.features, arch) if f not in host.cpu_features]
    if missing:
        them = "it" if len(missing) == 1 else "them"
        return f"{target} needs {', '.join(missing)}; this host lacks {them}"
    return None


def runs_native(target: str) -> bool:
    """Whether libmlpack is built and this host runs ``target``'s native code itself (a cpu
    target's; so ``mlpack build`` validates and times its artifacts here, not under qemu)."""
    from mlpack.codegen.targets import registry
    from mlpack.runtime import engine

    return (registry.get(target).device == "cpu" and engine.available()
            and host_lacks(target) is None)


def host_params(*targets: str) -> list:
    """``targets`` as pytest parameters, each one this host cannot run skipped with the reason
    (so a v4 case runs on AVX-512 hosts and says what is missing elsewhere)."""
    import pytest

    return [pytest.param(t, marks=pytest.mark.skipif(host_lacks(t) is not None,
                                                     reason=str(host_lacks(t))))
            for t in targets]


def best_host_target(*targets: str) -> str:
    """The last of ``targets`` (listed lowest level first) that this host runs; a test of what a
    level computes runs the most specific code the host has. Fails where it runs none."""
    runs = [t for t in targets if host_lacks(t) is None]
    assert runs, f"this host runs none of {targets}: {[host_lacks(t) for t in targets]}"
    return runs[-1]


def assert_user_error(result, *parts) -> None:
    """A user mistake: exit code 2 and one paragraph ``error: ...`` naming ``parts``, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for p in parts:
        assert p in err, err


def one_output_model(nodes, inputs, inits=(), opset: int = 17):
    """An ONNX model of ``nodes`` whose one output is ``y`` (f32, shape inferred): ``inputs``
    are ``make_tensor_value_info`` argument tuples, ``inits`` (name, array) pairs."""
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def conv_pool_conv_model(rng):
    """conv 3x3 -> relu -> max pool 3x3 / 2 (padded) -> conv 1x1: a CNN's stem."""
    from onnx import TensorProto, helper

    w1 = (rng.standard_normal((32, 8, 3, 3)) / 8).astype(np.float32)
    w2 = (rng.standard_normal((16, 32, 1, 1)) / 6).astype(np.float32)
    return one_output_model(
        [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                          pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["p", "w2"], ["y"])],
        [("x", TensorProto.FLOAT, [1, 8, 12, 12])], [("w1", w1), ("w2", w2)])


def parse_ir(text: str):
    """An IR graph from its (indented) text form."""
    import textwrap

    from mlpack.spec.ir import parse_graph
    return parse_graph(textwrap.dedent(text))


def check_pass(before_text: str, fn, after_text: str, inputs, rtol: float, atol: float = 0.0):
    """A graph pass ``fn`` on ``before_text`` gives exactly ``after_text``, which verifies and
    computes what the original did (within rtol/atol) on ``inputs``."""
    import textwrap

    from mlpack.spec.ir import format_graph, run_graph, verify
    expected = run_graph(parse_ir(before_text), inputs)
    after = fn(parse_ir(before_text))
    verify(after)
    assert format_graph(after) == textwrap.dedent(after_text)
    got = run_graph(after, inputs)
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=rtol, atol=atol)


def reverse_sums(graph):
    """A copy of ``graph`` whose sums run their reduction variables backwards (``k`` becomes
    ``K - 1 - k``): the same values summed in another order, as another CPU's kernels might,
    so only the rounding changes."""
    import copy

    from mlpack.spec.ir import expr as ex
    from mlpack.spec.ir.graph import Comprehension

    out = copy.copy(graph)
    out.ops = []
    for op in graph.ops:
        if isinstance(op, Comprehension) and op.reduce == "sum" and op.rdims:
            flip = {r: ex.sub(ex.sub(n, 1), ex.var(r)) for r, n in op.rdims.items()}
            op = Comprehension(op.out, op.type, ex.substitute(op.body, flip), op.reduce,
                               dict(op.rdims))
        out.ops.append(op)
    return out
