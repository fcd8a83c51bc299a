"""A PyTorch model with a ``torch.library`` custom op, exported to ONNX as a node of its own
domain (examples/capsules/model.py), built with the DSL op of examples/capsules/capsules.py:
validated on this host (portable and the baseline cpu target) and on aarch64 under qemu where
it is installed, run, and its op's source kept in every artifact's config."""

from __future__ import annotations

import hashlib
import json
import os
import warnings

import numpy as np
import pytest

import mlpack
from mlpack.spec.container import open_container
from dsl_support import CAPSULES, ROOT, assert_close, example
from test_targets import baseline_target

pytest.importorskip("torch")
model = example("model")
OPS = os.path.join(CAPSULES, "capsules.py")


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("caps") / "caps.onnx"
    path.write_bytes(model.export())
    return path


def test_build_validate_run(onnx_path, tmp_path, patient_emulation):
    from support import emulated
    from mlpack.packager.build import build

    host = baseline_target()
    targets = ["portable", host] + (["aarch64"] if host != "aarch64" else [])
    out = tmp_path / "caps.mlpack"
    report = build(onnx_path, out, targets=targets, ops=[OPS], cache=False)
    assert report.reference.startswith("mlpack interpreter fp32 (custom ops: capsules.example")
    by_target = {a.target: a for a in report.artifacts}
    for t in ("portable", host):
        assert by_target[t].validated and by_target[t].max_error < 1e-5, by_target[t]
    if host != "aarch64" and emulated("aarch64"):
        assert by_target["aarch64"].validated and by_target["aarch64"].emulator
    P = np.random.default_rng(5).standard_normal((3, 9, 9, 8, 4, 4)).astype(np.float32)
    want = model.torch_outputs(P)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # unsigned; only portable on some hosts
        for device in ("portable", "cpu"):
            with mlpack.load(out, device=device) as m:
                assert_close(m(P=P)["V"], want)
                assert m.validate().ok
    source = open(OPS).read()
    with open_container(out) as c:
        for a in c.artifacts:
            (op,) = a.config["custom_ops"]
            assert (op["domain"], op["op_type"]) == ("capsules.example", "CapsConv")
            assert op["function"] == "capsules.py:capsule_conv" and op["source"] == source
            assert op["sha256"] == hashlib.sha256(source.encode()).hexdigest()
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.load(open(os.path.join(ROOT, "spec", "schemas", "config.schema.json")))
    with open_container(out) as c:
        jsonschema.validate(c.artifacts[0].config, schema)


def test_cli_ops_option(onnx_path, tmp_path):
    from support import cli

    out = tmp_path / "caps.mlpack"
    r = cli("build", onnx_path, "-o", out, "-t", "portable", "--ops", OPS, "--no-cache")
    assert r.exit_code == 0, r.output
    assert "custom ops: capsules.example CapsConv" in r.output
    r = cli("build", onnx_path, "-o", out, "-t", "portable", "--ops", tmp_path / "none.py")
    assert r.exit_code == 2 and "none.py: no such file" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = cli("import", onnx_path, "--ops", OPS, "--print-ir")
    assert r.exit_code == 0 and "sum{kx=3, ky=3, ci=8, k=4}" in r.output, r.output


def test_builds_for_cuda(onnx_path, tmp_path):
    # the custom op compiles for the GPU like any node; here (no GPU) its kernels are validated
    # through the cuda lowering on this CPU (cuda-emulated), and the sm_90 PTX is built
    from mlpack.packager.build import build

    out = tmp_path / "caps-gpu.mlpack"
    report = build(onnx_path, out, targets=["cuda-emulated", "cuda-sm90"], ops=[OPS], cache=False)
    by_target = {a.target: a for a in report.artifacts}
    assert by_target["cuda-emulated"].validated and by_target["cuda-emulated"].max_error < 1e-5
    gpu = by_target["cuda-sm90"]
    assert gpu.validated or "needs a CUDA GPU" in gpu.reason, gpu
    with open_container(out) as c:
        cuda = next(a for a in c.artifacts if a.device == "cuda")
        assert cuda.config["custom_ops"][0]["op_type"] == "CapsConv"


def test_inspect_shows_the_ops_and_validate_names_the_interpreter(onnx_path, tmp_path):
    """``mlpack inspect`` lists each custom op with its function and source digest; a failing
    artifact's detail in ``mlpack validate`` names the fp32 interpreter as the baseline, since
    ONNX Runtime never ran this model."""
    import sys
    from support import cli

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    from container_edits import rewrite

    out = tmp_path / "caps.mlpack"
    assert cli("build", onnx_path, "-o", out, "-t", "portable", "--ops", OPS,
               "--no-cache").exit_code == 0
    digest = hashlib.sha256(open(OPS, "rb").read()).hexdigest()
    r = cli("inspect", out)
    assert f"custom op:  capsules.example CapsConv = capsules.py:capsule_conv" in r.output
    assert f"sha256 {digest}" in r.output, r.output
    r = cli("inspect", out, "--json")
    (op,) = json.loads(r.output)["custom_ops"]
    assert op["sha256"] == digest and op["source"] == open(OPS).read()
    assert "fp32 interpreter" in cli("inspect", out).output

    def strict(i, doc):   # no error allowed at all: the artifact misses
        doc["accuracy"]["tolerance"].update(multiple=0.0, floor=0.0)

    bad = tmp_path / "strict.mlpack"
    rewrite(out, bad, config=strict)
    r = cli("validate", bad)
    assert r.exit_code == 2, r.output
    assert "fp32 interpreter's own" in r.output and "ONNX Runtime" not in r.output, r.output
