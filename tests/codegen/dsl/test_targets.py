"""DSL graphs through the targets: the portable program and this host's baseline cpu target
(never a vendor feature such as AVX-512), against float64 NumPy; the lifted convolution
compiles to the kernels of the batched one."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from mlpack.codegen import dsl
from mlpack.codegen.targets import registry
from mlpack.spec import media
from mlpack.spec.ir.interp import run_graph
from mlpack.spec.ir.program import decode_program
from dsl_support import ROOT, assert_close, example, rand
from test_lift import batched_conv_reference, conv2d

capsules = example("capsules")
reference = example("reference")

# the baseline cpu target of this host's architecture: every machine of it runs its code
BASELINE = {"x86_64": "x86_64-v2", "amd64": "x86_64-v2", "aarch64": "aarch64",
            "arm64": "aarch64"}


def baseline_target() -> str:
    from mlpack.runtime import detect_host
    target = BASELINE.get(detect_host().arch)
    if target is None:
        pytest.skip(f"no baseline cpu target for {detect_host().arch}")
    return target


def run_cpu(graph, feeds, target):
    sys.path.insert(0, os.path.join(ROOT, "tests", "codegen", "targets"))
    from plan_runner import run_plan
    from mlpack.codegen.targets.cpu import compile_cpu
    art = compile_cpu(graph, target)
    return art, run_plan(art, graph, feeds)


CAPSULE = {"P": dsl.f32(n="batch", x=9, y=9, ci=4, i=4, k=4),
           "W": dsl.f32(kx=3, ky=3, ci=4, co=5, k=4, j=4)}


def capsule_feeds(rng):
    return {"P": rand(rng, 2, 9, 9, 4, 4, 4), "W": rand(rng, 3, 3, 4, 5, 4, 4, scale=0.1)}


def test_capsule_portable_program(rng):
    g = dsl.to_graph(capsules.capsule_conv, CAPSULE, outputs="V", optimize=True,
                     layouts={"V": "n x y co i j"})
    code = registry.get("portable").compile(g, "fp32", frozenset())
    (media_type, program), = code.layers
    assert media_type == media.PROGRAM_PORTABLE
    decoded = decode_program(program, code.weights)
    feeds = capsule_feeds(rng)
    assert_close(run_graph(decoded, feeds)["V"], reference.capsule_conv(feeds["P"], feeds["W"]))


def test_capsule_cpu_baseline(rng):
    g = dsl.to_graph(capsules.capsule_conv, CAPSULE, outputs="V", optimize=True,
                     layouts={"V": "n x y co i j"})
    feeds = capsule_feeds(rng)
    _, out = run_cpu(g, feeds, baseline_target())
    assert_close(out["V"], reference.capsule_conv(feeds["P"], feeds["W"]))


def test_lifted_conv_compiles_to_the_batched_convs_kernels(rng):
    target = baseline_target()
    B, T, H, C, CO = 2, 3, 8, 8, 8
    lifted = dsl.to_graph(lambda V, K: conv2d(image=V, kernel=K),
                          {"V": dsl.f32(b=B, t=T, x=H, y=H, ci=C),
                           "K": dsl.f32(kx=3, ky=3, ci=C, co=CO)}, optimize=True)
    batched = dsl.to_graph(lambda I, K: conv2d(image=I, kernel=K),
                           {"I": dsl.f32(n=B * T, x=H, y=H, ci=C),
                            "K": dsl.f32(kx=3, ky=3, ci=C, co=CO)}, optimize=True)
    V, K = rand(rng, B, T, H, H, C), rand(rng, 3, 3, C, CO)
    art_l, out_l = run_cpu(lifted, {"V": V, "K": K}, target)
    art_b, out_b = run_cpu(batched, {"I": V.reshape(B * T, H, H, C), "K": K}, target)
    kernels = lambda art: [(d["kernel"], d["workgroups"]) for d in art.plan["dispatches"]]  # noqa: E731
    assert kernels(art_l) == kernels(art_b)
    assert_close(out_l["out"], batched_conv_reference(V, K))
    np.testing.assert_array_equal(out_l["out"].reshape(out_b["out"].shape), out_b["out"])
