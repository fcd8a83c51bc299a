"""The engine's CUDA executor (runtime/c/src/cuda.c) without a GPU, through a stand-in driver.

runtime/c/tests/fake_cuda/fake_cuda.c answers the driver API with host memory and runs each
launched kernel by calling the kernel of the same name in a ``cuda-emulated`` kernel library:
the same kernel bodies as the artifact's PTX, compiled for this CPU. So a cuda artifact built
by ``mlpack build`` is selected, loaded (its cubin refused as an older driver would, then its
PTX), given its weights, launched dispatch by dispatch with its parameters, and judged by the
container's own test vectors against the float64 reference, all on a machine without a GPU.
The driver is probed once per process, so each check runs in a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack.packager.build import build
from mlpack.runtime import native
from mlpack.spec import media
from mlpack.spec.container import open_container

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "runtime" / "c" / "tests" / "fake_cuda" / "fake_cuda.c"
MLP = ROOT / "tests" / "models" / "mlp.onnx"

pytestmark = pytest.mark.skipif(not native.available(), reason="libmlpack is not built")


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fake_cuda") / "libfakecuda.so"
    cmd = [sys.executable, "-m", "ziglang", "cc", "-shared", "-fPIC", "-O1",
           f"-I{ROOT / 'runtime' / 'c' / 'include'}", str(FAKE), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def emulated_kernels(path: Path, precision: str, folder: Path) -> Path:
    """The cuda-emulated artifact's kernel library of ``precision``, written to a file."""
    with open_container(str(path)) as c:
        art = next(a for a in c.artifacts if a.config["artifact"]["target"] == "cuda-emulated"
                   and a.precision == precision)
        out = folder / f"emulated-{precision}.so"
        out.write_bytes(bytes(c.blob(art.layer(media.CODE_ELF).digest)))
    return out


def in_child(code: str, env: dict) -> dict:
    """Run ``code`` (which prints one JSON line last) in a child with ``env`` added."""
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


VALIDATE = """
    import json, mlpack
    with mlpack.load(PATH, device="cuda", precision=PRECISION) as m:
        r = m.validate()
        out = {"device": m.artifact.device, "ok": r.ok, "cases": r.cases,
               "reason": m.artifact.reason, "text": str(r)}
    print(json.dumps(out))
"""


def validate_on_cuda(path: Path, kernels: Path, driver: Path, precision: str = "fp32", **env) -> dict:
    code = VALIDATE.replace("PATH", repr(str(path))).replace("PRECISION", repr(precision))
    return in_child(code, {"MLPACK_LIBCUDA": str(driver), "FAKE_CUDA_KERNELS": str(kernels), **env})


@pytest.fixture(scope="module")
def mlp_cuda(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlp_cuda")
    path = folder / "mlp.mlpack"
    report = build(str(MLP), str(path), targets=["cuda-sm80", "cuda-emulated"],
                   precisions=["fp32", "fp16"])
    assert all(a.validated for a in report.artifacts if a.device != "cuda")
    return path, folder


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_cuda_artifact_runs_its_test_vectors(mlp_cuda, fake_driver, precision):
    path, folder = mlp_cuda
    got = validate_on_cuda(path, emulated_kernels(path, precision, folder), fake_driver, precision)
    assert got["device"] == "cuda" and got["ok"] and got["cases"] >= 1, got
    assert "cuda sm_80" in got["reason"]


def test_without_a_driver_cuda_is_passed_over_saying_why(mlp_cuda):
    path, _ = mlp_cuda
    code = f"""
        import json, mlpack
        from mlpack.runtime import native
        with mlpack.load({str(path)!r}) as m:
            py = [v.reason for v in m.verdicts if v.artifact.device == "cuda"]
        with native.open_model({str(path)!r}) as e:
            c = [v.reason for v in e.artifacts if v.device == "cuda"]
        print(json.dumps({{"py": py, "c": c}}))
    """
    got = in_child(code, {"MLPACK_LIBCUDA": "/nonexistent/libcuda.so.1"})
    want = ("passed over: needs a CUDA GPU: no CUDA driver (/nonexistent/libcuda.so.1: cannot open "
            "shared object file: No such file or directory)")
    assert got["c"] == [want, want] and got["py"] == got["c"]


@pytest.mark.parametrize("env, why", [
    ({"FAKE_CUDA_SM": "75"}, "passed over: needs sm_80, this host's GPU is sm_75"),
    ({"FAKE_CUDA_INIT": "100"},
     "passed over: needs a CUDA GPU: the CUDA driver did not start (cuInit: CUDA_ERROR_NO_DEVICE)"),
    ({"FAKE_CUDA_COUNT": "0"}, "passed over: needs a CUDA GPU: the CUDA driver sees no GPU"),
])
def test_a_gpu_the_artifact_cannot_use_is_passed_over(mlp_cuda, fake_driver, env, why):
    path, _ = mlp_cuda
    code = f"""
        import json
        from mlpack.runtime import native
        with native.open_model({str(path)!r}) as e:
            print(json.dumps({{"reasons": [v.reason for v in e.artifacts if v.device == "cuda"],
                               "chosen": [v.device for v in e.artifacts if v.chosen]}}))
    """
    got = in_child(code, {"MLPACK_LIBCUDA": str(fake_driver), **env})
    assert got["reasons"] == [why, why] and got["chosen"] == ["cpu"]


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "cuda_ops", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _build_pair(model, folder: Path, name: str) -> Path:
    src, path = folder / f"{name}.onnx", folder / f"{name}.mlpack"
    onnx.save(model, str(src))
    build(str(src), str(path), targets=["cuda-sm80", "cuda-emulated"])
    return path


def test_procedures_computed_sizes_and_index_errors(tmp_path, fake_driver):
    # NonZero's count is a computed symbol (read back after its one-thread dispatch) that sizes
    # a run-time output; TopK is a procedure; a Gather of a token id checks its index
    nonzero = _model([helper.make_node("NonZero", ["x"], ["nz"]),
                      helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)],
                     [("x", TP.FLOAT, ["batch", 6])], [("nz", TP.INT64), ("v", TP.FLOAT), ("i", TP.INT64)],
                     [helper.make_tensor("k", TP.INT64, [1], [2])])
    path = _build_pair(nonzero, tmp_path, "nonzero")
    got = validate_on_cuda(path, emulated_kernels(path, "fp32", tmp_path), fake_driver)
    assert got["device"] == "cuda" and got["ok"], got

    table = helper.make_tensor("table", TP.FLOAT, [5, 3], np.arange(15, dtype=np.float32).tolist())
    gather = _model([helper.make_node("Gather", ["table", "ids"], ["y"], name="emb")],
                    [("ids", TP.INT64, ["batch"])], [("y", TP.FLOAT)], [table])
    path = _build_pair(gather, tmp_path, "gather")
    kernels = emulated_kernels(path, "fp32", tmp_path)
    code = f"""
        import json, numpy as np, mlpack
        with mlpack.load({str(path)!r}, device="cuda") as m:
            y = m(ids=np.array([4, -1, 0], np.int64))["y"]
            try:
                m(ids=np.array([1, 7], np.int64))
                err = None
            except mlpack.Error as e:
                err = str(e)
        print(json.dumps({{"y": y.tolist(), "err": err}}))
    """
    got = in_child(code, {"MLPACK_LIBCUDA": str(fake_driver), "FAKE_CUDA_KERNELS": str(kernels)})
    assert got["y"] == np.arange(15, dtype=np.float32).reshape(5, 3)[[4, -1, 0]].tolist()
    assert "Gather node 'emb': index 7 out of range for dim of size 5" in got["err"]


def test_runs_from_many_threads_at_once(mlp_cuda, fake_driver):
    path, folder = mlp_cuda
    kernels = emulated_kernels(path, "fp32", folder)
    code = f"""
        import json, numpy as np, mlpack
        from concurrent.futures import ThreadPoolExecutor
        xs = [np.random.default_rng(i).standard_normal((i + 1, 784), dtype=np.float32) for i in range(8)]
        with mlpack.load({str(path)!r}, device="portable") as p:
            want = [p(x=x)["y"] for x in xs]
        with mlpack.load({str(path)!r}, device="cuda", precision="fp32") as m:
            with ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda x: m(x=x)["y"], xs * 4))
        worst = max(float(np.abs(g - want[i % 8]).max()) for i, g in enumerate(got))
        print(json.dumps({{"worst": worst}}))
    """
    got = in_child(code, {"MLPACK_LIBCUDA": str(fake_driver), "FAKE_CUDA_KERNELS": str(kernels)})
    assert got["worst"] < 1e-5


def test_gpu_tensors_in_and_out_without_copies(mlp_cuda, fake_driver):
    # DeviceArray (device.py) is GPU memory from the engine; an input may come through the CUDA
    # array interface or through DLPack alone (as a JAX array would), and outputs leave as
    # DeviceArrays whose DLPack capsules free nothing until their consumer is done
    path, folder = mlp_cuda
    kernels = emulated_kernels(path, "fp32", folder)
    code = f"""
        import ctypes, gc, json, numpy as np, mlpack
        from mlpack.runtime import device, native
        lib = native.library()
        x = np.random.default_rng(0).standard_normal((3, 784), dtype=np.float32)
        with mlpack.load({str(path)!r}, device="portable") as p:
            want = p(x=x)["y"]
        dx = device.DeviceArray.empty(lib, x.shape, "f32")
        assert lib.mlpack_device_copy(dx.ptr, x.ctypes.data, x.nbytes, 1, None) == 0

        class OnlyDLPack:
            def __init__(self, a): self.a = a
            def __dlpack__(self, stream=None): return self.a.__dlpack__(stream=stream)
            def __dlpack_device__(self): return self.a.__dlpack_device__()

        with mlpack.load({str(path)!r}, device="cuda", precision="fp32") as m:
            outs = [m(x=dx)["y"], m(x=OnlyDLPack(dx))["y"], m.run(None, {{"x": dx}})[0]]
        errs = [float(np.abs(y.numpy() - want).max()) for y in outs]
        kinds = sorted({{type(y).__name__ for y in outs}})
        cap = outs[0].__dlpack__()
        held = len(device._exported)
        del cap
        gc.collect()
        with mlpack.load({str(path)!r}, device="cpu") as c:
            try:
                c(x=dx)
                refused = None
            except mlpack.Error as e:
                refused = str(e)
        print(json.dumps({{"errs": errs, "kinds": kinds, "held": held,
                           "left": len(device._exported), "refused": refused}}))
    """
    got = in_child(code, {"MLPACK_LIBCUDA": str(fake_driver), "FAKE_CUDA_KERNELS": str(kernels)})
    assert max(got["errs"]) < 1e-5 and got["kinds"] == ["DeviceArray"], got
    assert got["held"] == 1 and got["left"] == 0
    assert "GPU tensors need a model running on CUDA" in got["refused"]


@pytest.mark.parametrize("graphs", ["1", "0"])
def test_repeated_runs_replay_a_cuda_graph(mlp_cuda, fake_driver, graphs):
    # the second run of the same shapes captures the dispatches into a graph, later ones replay
    # it; a new shape runs plainly once, then is captured in its turn
    path, folder = mlp_cuda
    kernels = emulated_kernels(path, "fp32", folder)
    code = f"""
        import ctypes, json, numpy as np, mlpack
        fake = ctypes.CDLL({str(fake_driver)!r})
        rng = np.random.default_rng(0)
        with mlpack.load({str(path)!r}, device="portable") as p, \\
                mlpack.load({str(path)!r}, device="cuda", precision="fp32") as m:
            worst, seen = 0.0, []
            for batch in (3, 3, 3, 3, 5, 5, 5, 3):
                x = rng.standard_normal((batch, 784), dtype=np.float32)
                worst = max(worst, float(np.abs(m(x=x)["y"] - p(x=x)["y"]).max()))
                seen.append(fake.fake_cuda_graph_launches())
        print(json.dumps({{"worst": worst, "graph_launches": seen}}))
    """
    got = in_child(code, {"MLPACK_LIBCUDA": str(fake_driver), "FAKE_CUDA_KERNELS": str(kernels),
                          "MLPACK_CUDA_GRAPHS": graphs})
    assert got["worst"] < 1e-5
    # batch 3: plain, captured+replayed, replayed, replayed; batch 5: plain, captured, replayed;
    # back to 3: plain (the graph is batch 5's)
    want = [0, 1, 2, 3, 3, 4, 5, 5] if graphs == "1" else [0] * 8
    assert got["graph_launches"] == want
