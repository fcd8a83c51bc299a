"""The engine checks a built cpu artifact's plan against its kernels' bindings (kernel ABI 1.3).

A container is built from tests/models/mlp.onnx for x86-64 v2 (which any x86-64 host runs), then
rewritten with its plan edited and every digest recomputed (container_edits.py), so only the plan
check can catch it: a dispatch with one binding removed (its kernel would read a NULL binding),
and a weight or an input bound where the kernel writes (it would write into the weights every
run shares, or into the caller's array). The engine refuses each when it opens the artifact,
naming the artifact, the dispatch and the kernel: a broken container, so ``mlpack.load`` raises
that FormatError (no fallback to the portable artifact) and ``mlpack validate`` prints it as its
one error line, exit 2. The untampered container runs. (runtime/c/tests/test_run.c covers the same
with hand-written kernels, and a version-1 table, which records no bindings, still running.)
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from runtime_helpers import NATIVE, NEEDS_X86_ENGINE, with_native_plan
from support import cli

import mlpack
from mlpack.runtime import native
from mlpack.spec.errors import FormatError

pytestmark = NEEDS_X86_ENGINE


def _x():
    return np.random.default_rng(0).standard_normal((3, 784)).astype(np.float32)


def test_the_untampered_container_runs_its_native_artifact(mlp_v2, tmp_path):
    same = with_native_plan(mlp_v2, tmp_path / "same.mlpack", lambda plan: None)
    with mlpack.load(same) as m:
        assert m.artifact.index == NATIVE and m.artifact.device == "cpu"
        assert m.validate().ok
        assert m(x=_x())["y"].shape == (3, 10)


def _refused(path, pattern: str) -> str:
    """Opening the native artifact fails with a FormatError matching ``pattern``; its message."""
    with pytest.raises(FormatError) as info:
        native.open_model(path, artifact=NATIVE)
    msg = str(info.value)
    assert re.search(pattern, msg), msg
    assert f"artifact {NATIVE} (cpu amd64 v2)" in msg
    return msg


def test_a_dispatch_missing_a_binding_is_refused_naming_it(mlp_v2, tmp_path):
    bad = with_native_plan(mlp_v2, tmp_path / "missing.mlpack",
                     lambda plan: plan["dispatches"][1]["bindings"].pop())
    msg = _refused(bad, r"plan dispatch 1 binds 3 buffers, but its kernel 1 \('k1_\w+'\) takes 4 "
                        r"\('wrrr'\)")
    # a broken container: load refuses it (the portable artifact would run, but the file is bad)
    with pytest.raises(FormatError) as info:
        mlpack.load(bad)
    assert msg in str(info.value)
    result = cli("validate", bad)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    assert msg in result.stderr


def _first(plan, kind: str) -> int:
    return next(j for j, b in enumerate(plan["buffers"]) if b["kind"] == kind)


def test_a_weight_bound_where_a_kernel_writes_is_refused(mlp_v2, tmp_path):
    def edit(plan):   # binding 0 of every cpu kernel is the tensor it writes
        plan["dispatches"][0]["bindings"][0] = _first(plan, "weight")
    bad = with_native_plan(mlp_v2, tmp_path / "weight.mlpack", edit)
    _refused(bad, r"plan dispatch 0 binding 0 is buffer \d+ \(weight '[^']+'\), which its kernel 0 "
                  r"\('k0_\w+'\) writes; a kernel may write only an output or the arena")


def test_an_input_bound_where_a_kernel_writes_is_refused(mlp_v2, tmp_path):
    def edit(plan):
        plan["dispatches"][2]["bindings"][0] = _first(plan, "input")
    bad = with_native_plan(mlp_v2, tmp_path / "input.mlpack", edit)
    _refused(bad, r"plan dispatch 2 binding 0 is buffer 0 \(input 0 'x'\), which its kernel 2 "
                  r"\('k2_\w+'\) writes")
