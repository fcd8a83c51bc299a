"""Synthetic containers for the runtime tests (fixtures in conftest.py): a tiny valid portable
program plus fake native artifacts (their code is never executed: selection reads only
descriptors and configs); and the plan-check tests' container (test_plan_bindings.py,
test_packed_weights.py): tests/models/mlp.onnx built for x86-64 v2 alone (conftest's
``mlp_v2``), which any x86-64 host runs, its native artifact's plan edited by
``with_native_plan``.

``tiny``: y = relu(x + b), x f32[batch, 4]. ``two``: three inputs sharing symbolic dims, an
output whose program layout differs from the signature's order (the runtime must transpose).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from container_edits import with_plan

from mlpack.runtime import Host, detect_host, engine
from mlpack.spec import container as c
from mlpack.spec import media
from mlpack.spec.ir import run_graph
from mlpack.spec.ir.program import dumps_program
from mlpack.spec.tensorfile import write_tensors

MLP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "mlp.onnx")
NATIVE = 1   # mlp_v2's x86-64 v2 artifact (0 is the portable one)
NEEDS_X86_ENGINE = pytest.mark.skipif(not (engine.available() and detect_host().arch == "amd64"),
                                      reason="needs libmlpack on an x86-64 host")


def with_native_plan(src, dst, edit):
    """``src`` with artifact NATIVE's plan changed by ``edit(plan)``, digests recomputed."""
    return with_plan(src, dst, NATIVE, edit)

TINY = """graph "tiny" {
  in %x: f32{batch=$batch, c=4} (batch, c)
  const %b: f32{c=4} (c) = [0.0, 1.0, 2.0, 3.0]
  %y: f32{batch=$batch, c=4} = max(%x[batch=batch, c=c] + %b[c=c], 0.0)
  out %y (batch, c)
}"""

TWO = """graph "two" {
  in %ids: i64{batch=$batch, seq=$seq} (batch, seq)
  in %mask: f32{batch=$batch, seq=$seq} (batch, seq)
  in %scale: f32{c=3} (c)
  %y: f32{batch=$batch, seq=$seq, c=3} =
      cast<f32>(%ids[batch=batch, seq=seq]) * %mask[batch=batch, seq=seq] * %scale[c=c]
  out %y (c, batch, seq)
}"""

# a typical host of each kind
AVX512 = Host("linux", "amd64", frozenset({"sse4_2", "avx2", "fma", "avx512f", "avx512bw"}), 4)
AVX2 = Host("linux", "amd64", frozenset({"sse4_2", "avx2", "fma"}), 3)
OLD_X86 = Host("linux", "amd64", frozenset({"sse2"}), 1)
ARM = Host("linux", "arm64", frozenset({"neon", "fp16", "dotprod"}), None)
GPU = Host("linux", "amd64", frozenset({"sse4_2", "avx2", "fma"}), 3, cuda_sm=86)


def _sig(g, name: str, order=None) -> dict:
    ty = g.types[name]
    port = next(p for p in g.inputs + g.outputs if p.name == name)
    dims = order or port.layout
    return c.signature(name, ty.dtype, [(d, _size(ty.dims[d])) for d in dims])


def _size(e):
    return "$" + e.arg if e.op == "sym" else e.arg


def vector_layer(g, cases, out_order) -> bytes:
    """The test-vector archive: case{i}/input/{name}, case{i}/output/{name}; {"cases": N}."""
    tensors = {}
    for i, feeds in enumerate(cases):
        outs = run_graph(g, feeds)
        for name, a in feeds.items():
            tensors[f"case{i}/input/{name}"] = a
        for name, a in outs.items():
            layout = next(p.layout for p in g.outputs if p.name == name)
            perm = [layout.index(d) for d in out_order.get(name, layout)]
            tensors[f"case{i}/output/{name}"] = np.ascontiguousarray(np.transpose(a, perm))
    return write_tensors(tensors, {"cases": len(cases)})


def artifact(g, device="portable", precision="fp32", target="portable", features=(), cuda_sm=None,
             err=0.0, out_order=None, cases=None, code=None, platform=None, latency=None,
             **acc) -> c.ArtifactSpec:
    out_order = out_order or {}
    inputs = [_sig(g, p.name) for p in g.inputs]
    outputs = [_sig(g, p.name, out_order.get(p.name)) for p in g.outputs]
    accuracy = {"reference": "test", "max_error": err, "max_abs_error": err, "max_rel_error": err,
                "rtol": acc.get("rtol", 1e-5), "atol": acc.get("atol", 1e-6)}
    config = c.make_config(g.name, inputs, outputs, device=device, precision=precision,
                           target=target, accuracy=accuracy, cpu_features=features, cuda_sm=cuda_sm,
                           min_runtime=acc.get("min_runtime", media.MIN_RUNTIME))
    if latency is not None:   # seconds per run, as a build that timed it records
        config["latency"] = {"seconds": latency, "threads": 1}
    if code is None:
        code = (c.Layer(media.PROGRAM_PORTABLE, dumps_program(g)) if device == "portable"
                else c.Layer(media.CODE_PTX if device == "cuda" else media.CODE_ELF,
                             f"fake {target} code".encode()))
    layers = [code, c.Layer(media.WEIGHTS, write_tensors({k.name: k.data for k in g.constants.values()}))]
    if cases:
        layers.append(c.Layer(media.TESTVECTORS, vector_layer(g, cases, out_order)))
    if platform is None:
        platform = (media.platform_for(target) if device == "cpu" else
                    {"os": "linux", "architecture": "amd64"} if device == "cuda" else None)
    return c.ArtifactSpec(config, layers, platform)


def every_target(g) -> list[c.ArtifactSpec]:
    """Portable, x86-64 v2/v3/v4, aarch64 (fp32, fp16 with dotprod), cuda sm_80 (fp32, fp16)."""
    return [
        artifact(g),
        artifact(g, "cpu", target="x86_64-v2", features=("sse4_2",)),
        artifact(g, "cpu", target="x86_64-v3", features=("avx2", "fma")),
        artifact(g, "cpu", target="x86_64-v4", features=("avx512f", "avx512bw")),
        artifact(g, "cpu", target="aarch64", features=("neon",)),
        artifact(g, "cpu", "fp16", target="aarch64", features=("neon", "fp16", "dotprod"), err=2e-3),
        artifact(g, "cuda", target="cuda", cuda_sm=80),
        artifact(g, "cuda", "fp16", target="cuda", cuda_sm=80, err=1e-3),
    ]


def write(path, g, specs) -> str:
    c.write_container(str(path), g.name, specs)
    return str(path)
