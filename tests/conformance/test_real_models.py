"""Real architectures (benchmarks/real_models.py: transformers and torchvision models exported
offline with random weights) built with the default targets, loaded, and judged on fresh seeded
inputs at two sizes of their dynamic dims as the build judges its vectors: against the float64
reference, within the fp32 multiple of ONNX Runtime's own error (spec/accuracy.py), with ONNX
Runtime and the reference agreeing.

The default run builds the small set (a BERT-style encoder with dynamic batch and sequence, a
GPT-2-style decoder, a ViT with dynamic batch, a ResNet, a ConvNeXt); ``-m slow`` builds every
model, DistilBERT-size and torchvision's ViT-B/16 included. A model skips when torch or its
library is not installed (the ``models`` and ``models-torchvision`` extras). The ONNX files are
cached in benchmarks/.models/real/ (``MLPACK_REAL_MODELS`` names another folder) and exported
again only when their recipe changes.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from benchmarks import real_models as rm
from mlpack.spec import accuracy, environment

ort = pytest.importorskip("onnxruntime")

SIZES = ({"batch": 1, "sequence": 7}, {"batch": 3, "sequence": 16})
FP32 = accuracy.TOLERANCES["fp32"]


def _folder():
    return environment.get("MLPACK_REAL_MODELS") or rm.DEFAULT_FOLDER


def _inputs(spec: rm.RealModel, sizes: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in spec.inputs:
        shape = spec.example_shape(inp, sizes)
        if inp.dtype == "int64":  # token ids: anywhere in the small vocabulary
            feeds[inp.name] = rng.integers(0, rm.VOCAB, shape, dtype=np.int64)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(inp.dtype)
    return feeds


def _check(name: str, tmp_path) -> None:
    if not rm.available(name):  # not importorskip: a bare torchvision import may fail (see rm)
        pytest.skip(f"{name} needs torch and {rm.MODELS[name].library}")
    import onnx

    import mlpack
    from mlpack.codegen.compile import compile_onnx
    from mlpack.packager.build import build
    from mlpack.packager.reference import float64_outputs

    path = rm.materialize(name, _folder())
    out = tmp_path / f"{name}.mlpack"
    build(path, out)
    model = mlpack.load(out)
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    graph = compile_onnx(onnx.load(path))
    spec = rm.MODELS[name]
    for i, sizes in enumerate(SIZES):
        feeds = _inputs(spec, sizes, seed=100 + i)
        names = [o.name for o in session.get_outputs()]
        got = model.run(feeds)
        [ref] = float64_outputs(graph, [feeds])
        for out_name, w in zip(names, session.run(names, feeds)):
            # an output near zero whatever the input (a zero-initialized head, activations
            # that vanished) would pass any comparison; real_models.py must prevent it
            assert np.abs(w).max() > 1e-2, f"{name}: the reference output is ~0"
            base = accuracy.measure(w, ref[out_name])
            assert accuracy.disagreement({out_name: base}) == "", (name, sizes)
            verdict = accuracy.judge(out_name, accuracy.measure(got[out_name], ref[out_name], w),
                                     base, FP32)
            assert verdict.ok, f"{name} at {sizes}: {verdict.detail()}"


@pytest.mark.parametrize("name", rm.SMALL)
def test_small_real_model_builds_and_matches_onnxruntime(name, tmp_path):
    _check(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in rm.FULL if n not in rm.SMALL])
def test_real_model_builds_and_matches_onnxruntime(name, tmp_path):
    _check(name, tmp_path)


def test_small_set_has_the_required_dynamic_models():
    """The default run includes a BERT-style encoder with dynamic batch and sequence, and a ViT
    with a dynamic batch; the full set has ten architectures at least."""
    dims = {n: {d for i in rm.MODELS[n].inputs for d in i.dims if isinstance(d, str)}
            for n in rm.SMALL}
    assert dims["bert_tiny"] == {"batch", "sequence"} and dims["vit_tiny"] == {"batch"}
    assert len(rm.FULL) >= 10 and "tv_vit_b_16" in rm.FULL
