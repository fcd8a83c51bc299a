"""mlpack's cuda artifacts beside PyTorch on the same GPU, in one process (issue 19's bar).

    python -m benchmarks.cuda --json cuda.json        # on a machine with an NVIDIA GPU

Each entry builds its model with the cuda level this GPU runs (``cuda-sm90`` on compute
capability 9.0 and newer, else ``cuda-sm80``), times mlpack on GPU tensors (``torch`` tensors in,
``DeviceArray`` out: no host copies) and PyTorch's own implementation on the same inputs and
weights, alternating the two in rounds (the median of each), and checks that the outputs agree:

* ``resnet50``: torchvision's ResNet-50 with random weights, exported to ONNX here, at batch 1
  and 32, in fp16 (PyTorch: cuDNN, channels_last, fp16, ``cudnn.benchmark``) and fp32;
* ``bert_block``: benchmarks/models.py's BERT layer (batch 1, sequence 128, hidden 256), PyTorch
  running the same layer from the same weights;
* ``capsule``: the capsule primitive of tests/models/capsule.py (batch 8, 16x16, 32 capsule
  types), against PyTorch's framework formulation (patches, transposes, a batched matmul, a
  reduction) and against ``torch.einsum`` on the same shapes.

It also reports how long building every cuda artifact of resnet50 (both levels, fp32 and fp16)
takes, the bar's "under 30 s on the 2-core development machine" measured here for reference.
Needs torch with CUDA (and torchvision for resnet50); nothing here runs without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "models"))


def _level() -> str:
    from mlpack.runtime.host import probe_cuda

    sm, why = probe_cuda()
    if sm is None:
        raise SystemExit(f"benchmarks.cuda needs a CUDA GPU: {why}")
    return "cuda-sm90" if sm >= 90 else "cuda-sm80"


def _build(onnx_path: str, out: str, level: str, precision: str) -> float:
    from mlpack.packager.build import build

    t0 = time.perf_counter()
    report = build(onnx_path, out, targets=[level], precisions=[precision])
    cuda = [a for a in report.artifacts if a.device == "cuda"]
    if not cuda or not all(a.validated for a in cuda):
        raise RuntimeError(f"{onnx_path}: the {level} {precision} artifact did not validate: {cuda}")
    return time.perf_counter() - t0


def _time(fns: dict, rounds: int, runs: int) -> dict:
    """Median seconds per call of each function, alternating them round by round."""
    import torch

    out = {name: [] for name in fns}
    for fn in fns.values():   # warm-up (cudnn.benchmark's search, the driver's JIT)
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(runs):
                fn()
            end.record()
            end.synchronize()
            out[name].append(start.elapsed_time(end) / 1e3 / runs)
    return {name: statistics.median(v) for name, v in out.items()}


def _mlpack_fn(path: str, precision: str, feeds: dict):
    import mlpack

    m = mlpack.load(path, device="cuda", precision=precision)
    return m, (lambda: m(**feeds))


def _close(a, b, rtol: float, atol: float, what: str) -> float:
    import torch

    a = torch.as_tensor(a).float().cpu().numpy() if not isinstance(a, np.ndarray) else a
    b = b.float().cpu().numpy() if hasattr(b, "float") else np.asarray(b, np.float32)
    err = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    if err > max(rtol, atol):
        print(f"  warning: {what}: outputs differ by {err:.3g} of the output's scale")
    return err


def resnet50(folder: Path, level: str, rounds: int, runs: int) -> list[dict]:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval().cuda()
    onnx_path = folder / "resnet50.onnx"
    torch.onnx.export(model, torch.randn(1, 3, 224, 224, device="cuda"), str(onnx_path),
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}},
                      opset_version=17, dynamo=False)
    torch.backends.cudnn.benchmark = True
    rows = []
    for precision in ("fp16", "fp32"):
        path = str(folder / f"resnet50-{precision}.mlpack")
        seconds = _build(str(onnx_path), path, level, precision)
        dtype = torch.float16 if precision == "fp16" else torch.float32
        ref = model.to(dtype).to(memory_format=torch.channels_last)
        for batch in (1, 32):
            x = torch.randn(batch, 3, 224, 224, device="cuda")
            m, run = _mlpack_fn(path, precision, {"x": x})
            xt = x.to(dtype).to(memory_format=torch.channels_last)
            with torch.no_grad():
                t = _time({"mlpack": run, "pytorch": lambda: ref(xt)}, rounds, runs)
                err = _close(torch.from_dlpack(run()["y"]), ref(xt), 5e-2, 5e-2, "resnet50")
            m.close()
            rows.append({"model": "resnet50", "precision": precision, "batch": batch,
                         "mlpack_ms": t["mlpack"] * 1e3, "pytorch_ms": t["pytorch"] * 1e3,
                         "pytorch_over_mlpack": t["pytorch"] / t["mlpack"], "rel_err": err,
                         "build_s": seconds})
        model = model.float().to(memory_format=torch.contiguous_format)
    return rows


def bert_block(folder: Path, level: str, rounds: int, runs: int) -> list[dict]:
    import onnx
    import torch
    import torch.nn.functional as F
    from onnx import numpy_helper

    from benchmarks import models

    m_onnx = models.bert_block()
    onnx_path = folder / "bert_block.onnx"
    onnx.save(m_onnx, str(onnx_path))
    w = {t.name: torch.tensor(numpy_helper.to_array(t)).cuda() for t in m_onnx.graph.initializer}
    hidden, heads = w["q_w"].shape[0], 4

    def block(x):
        def lin(t, n):
            return t @ w[f"{n}_w"] + w[f"{n}_b"]
        b, s, _ = x.shape
        q, k, v = (lin(x, n).view(b, s, heads, -1).transpose(1, 2) for n in "qkv")
        ctx = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, hidden)
        h = F.layer_norm(x + lin(ctx, "attn_out"), (hidden,), w["ln1_g"], w["ln1_b"], 1e-12)
        f = lin(F.gelu(lin(h, "ffn_in")), "ffn_out")
        return F.layer_norm(h + f, (hidden,), w["ln2_g"], w["ln2_b"], 1e-12)

    rows = []
    for precision in ("fp32", "fp16"):
        path = str(folder / f"bert-{precision}.mlpack")
        seconds = _build(str(onnx_path), path, level, precision)
        x = torch.randn(1, 128, hidden, device="cuda")
        m, run = _mlpack_fn(path, precision, {"x": x})
        with torch.no_grad(), torch.autocast("cuda", torch.float16, enabled=precision == "fp16"):
            t = _time({"mlpack": run, "pytorch": lambda: block(x)}, rounds, runs)
            err = _close(torch.from_dlpack(run()["y"]), block(x), 1e-2, 1e-2, "bert_block")
        m.close()
        rows.append({"model": "bert_block", "precision": precision, "batch": 1,
                     "mlpack_ms": t["mlpack"] * 1e3, "pytorch_ms": t["pytorch"] * 1e3,
                     "pytorch_over_mlpack": t["pytorch"] / t["mlpack"], "rel_err": err,
                     "build_s": seconds})
    return rows


def capsule(folder: Path, level: str, rounds: int, runs: int) -> list[dict]:
    import onnx
    import torch

    import capsule as caps

    onnx_path = folder / "capsule.onnx"
    onnx.save(caps.einsum_model(), str(onnx_path))
    path = str(folder / "capsule.mlpack")
    seconds = _build(str(onnx_path), path, level, "fp32")
    p = torch.tensor(caps.poses()).cuda()          # [n, 16, 16, ci, 4, 4]
    w = torch.tensor(caps.weights()).cuda()        # [kx, ky, ci, co, 4, 4]
    idx = torch.tensor(caps.patch_index(p.shape[1])).cuda()   # [X, 3]: 2x + kx

    def patches():   # [n, x, kx, y, ky, ci, i, k], as capsule.patches cuts them
        return p[:, idx][:, :, :, idx]

    def framework():
        pt = patches().permute(0, 1, 3, 2, 4, 5, 6, 7)   # [n, x, y, kx, ky, ci, i, k]
        n, X = pt.shape[0], pt.shape[1]
        rows = pt.reshape(n * X * X, -1, 1, 4, 4)                   # [B, 9*ci, 1, 4, 4]
        votes = torch.matmul(rows, w.reshape(-1, w.shape[3], 4, 4))  # [B, 9*ci, co, 4, 4]
        return votes.sum(1).reshape(n, X, X, w.shape[3], 4, 4)

    def einsum():
        return torch.einsum("nxaybcik,abcdkj->nxydij", patches(), w)

    m, run = _mlpack_fn(path, "fp32", {"P": p})
    with torch.no_grad():
        t = _time({"mlpack": run, "framework": framework, "einsum": einsum}, rounds, runs)
        err = _close(torch.from_dlpack(run()["V"]), einsum(), 1e-4, 1e-4, "capsule")
    m.close()
    return [{"model": "capsule", "precision": "fp32", "batch": int(p.shape[0]),
             "mlpack_ms": t["mlpack"] * 1e3, "framework_ms": t["framework"] * 1e3,
             "einsum_ms": t["einsum"] * 1e3, "framework_over_mlpack": t["framework"] / t["mlpack"],
             "einsum_over_mlpack": t["einsum"] / t["mlpack"], "rel_err": err, "build_s": seconds}]


def build_time(folder: Path) -> dict:
    """Every cuda artifact of resnet50 (both levels, fp32 and fp16), cold kernel cache."""
    from mlpack.packager.build import build

    from benchmarks import models

    src = models.materialize("resnet50")
    os.environ["MLPACK_CACHE_DIR"] = str(folder / "cold-cache")
    t0 = time.perf_counter()
    build(str(src), str(folder / "r50-all.mlpack"), targets=["cuda"], precisions=["fp32", "fp16"])
    return {"resnet50_cuda_build_s": time.perf_counter() - t0, "cpus": os.cpu_count()}


ENTRIES = {"resnet50": resnet50, "bert_block": bert_block, "capsule": capsule}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cuda", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ENTRIES), help="comma-separated: " + ", ".join(ENTRIES))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=20, help="calls per timed round")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-build-time", action="store_true")
    args = ap.parse_args(argv)
    import torch

    level = _level()
    print(f"device: {torch.cuda.get_device_name()}, level {level}, torch {torch.__version__}")
    rows, extra = [], {}
    with tempfile.TemporaryDirectory(prefix="mlpack-cuda-bench-") as tmp:
        for name in args.models.split(","):
            for row in ENTRIES[name](Path(tmp), level, args.rounds, args.runs):
                print(json.dumps(row))
                rows.append(row)
        if not args.no_build_time:
            extra = build_time(Path(tmp))
            print(json.dumps(extra))
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "level": level,
                                         "rows": rows, **extra}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
