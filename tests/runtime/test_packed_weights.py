"""Weights stored once, packed when the engine opens the artifact (kernel ABI 1.4).

tests/models/mlp.onnx built for x86-64 v2 (which any x86-64 host runs): its GEMMs read their
weights as packed panels, which the plan's "prepare" dispatches write into the packed region
when the engine opens the artifact, so the container stores the weights as the model has them,
one archive for every artifact. The engine refuses a plan that lets a prepare dispatch touch
anything but weights and packed buffers, a run's dispatch write a packed buffer, or a packed
buffer lie outside its region (each rewritten with its digests recomputed, container_edits.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from runtime_helpers import NATIVE, NEEDS_X86_ENGINE, with_native_plan

import mlpack
from mlpack.runtime import native
from mlpack.spec import media
from mlpack.spec.container import open_container
from mlpack.spec.errors import FormatError

pytestmark = NEEDS_X86_ENGINE


def _plan(path):
    with open_container(path) as c:
        return c.artifacts[NATIVE].config["plan"]


def test_one_weights_archive_and_the_panels_prepared_at_open(mlp_v2):
    with open_container(mlp_v2) as c:
        weights = {[layer.digest for layer in a.layers if layer.media_type == media.WEIGHTS][0]
                   for a in c.artifacts}
    assert len(weights) == 1   # the portable and the native artifact store the same bytes
    plan = _plan(mlp_v2)
    assert plan["abi_minor"] >= 4 and plan["prepare"]
    packed = [b for b in plan["buffers"] if b["kind"] == "packed"]
    assert packed and sum(b["size"] for b in packed) <= plan["packed_size"]
    x = np.random.default_rng(0).standard_normal((3, 784)).astype(np.float32)
    with mlpack.load(mlp_v2, precision="fp32", device="cpu") as m:
        assert m.artifact.index == NATIVE and m.validate().ok
        got = m(x=x)["y"]
    with mlpack.load(mlp_v2, device="portable") as p:
        np.testing.assert_allclose(got, p(x=x)["y"], rtol=1e-4, atol=1e-5)


def _refused(path, pattern: str) -> None:
    with pytest.raises(FormatError) as info:
        native.open_model(path, artifact=NATIVE)
    assert re.search(pattern, str(info.value)), str(info.value)


def _first(plan, kind: str) -> int:
    return next(j for j, b in enumerate(plan["buffers"]) if b["kind"] == kind)


def test_a_prepare_dispatch_binding_the_arena_is_refused(mlp_v2, tmp_path):
    def edit(plan):
        plan["prepare"][0]["bindings"][-1] = _first(plan, "arena")
    _refused(with_native_plan(mlp_v2, tmp_path / "arena.mlpack", edit),
             r"plan prepare dispatch 0 binding \d+ is buffer \d+ \(arena\); a prepare dispatch "
             r"binds only weights and packed buffers")


def test_a_prepare_dispatch_writing_a_weight_is_refused(mlp_v2, tmp_path):
    def edit(plan):   # binding 0 of a kernel is the tensor it writes
        plan["prepare"][0]["bindings"][0] = _first(plan, "weight")
    _refused(with_native_plan(mlp_v2, tmp_path / "weight.mlpack", edit),
             r"plan prepare dispatch 0 binding 0 is buffer \d+ \(weight '[^']+'\), which its "
             r"kernel \d+ \('\w+'\) writes; a kernel may write only a packed buffer when it prepares")


def test_a_run_writing_a_packed_buffer_is_refused(mlp_v2, tmp_path):
    def edit(plan):
        plan["dispatches"][0]["bindings"][0] = _first(plan, "packed")
    _refused(with_native_plan(mlp_v2, tmp_path / "written.mlpack", edit),
             r"plan dispatch 0 binding 0 is buffer \d+ \(packed\), which its kernel 0 "
             r"\('k0_\w+'\) writes; a kernel may write only an output or the arena")


@pytest.mark.parametrize("change", ["past_the_end", "misaligned", "no_region"])
def test_a_packed_buffer_outside_its_region_is_refused(mlp_v2, tmp_path, change):
    def edit(plan):
        b = plan["buffers"][_first(plan, "packed")]
        if change == "past_the_end":
            b["offset"] = plan["packed_size"] - b["size"] + 64
        elif change == "misaligned":
            b["offset"] += 4
        else:
            del plan["packed_size"]
    _refused(with_native_plan(mlp_v2, tmp_path / f"{change}.mlpack", edit),
             r"plan buffer \d+ \(packed\) needs a 64-byte aligned offset and a size within the "
             r"\d+-byte packed region")
