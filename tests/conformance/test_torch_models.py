"""Torch-exported models through mlpack against ONNX Runtime, at several batch and sequence sizes.

The models are committed .onnx files (``tests/models/export_torch.py`` wrote them; CI has no
torch): an MLP 784-256-128-10 with a dynamic batch, and a BERT-style encoder block over int64
token ids with dynamic batch and sequence. One compiled graph serves every size, so its inputs
must keep symbolic sizes.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
import pytest

from mlpack import backend
from mlpack.codegen.compile import compile_onnx
from mlpack.spec.ir import expr as ex

ort = pytest.importorskip("onnxruntime")

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
MLP = os.path.join(MODELS_DIR, "mlp.onnx")
BERT = os.path.join(MODELS_DIR, "bert_block.onnx")
VOCAB = 1000  # the encoder's embedding rows
RTOL, ATOL = 1e-4, 1e-5


@functools.lru_cache(maxsize=None)
def _rep(path: str):
    return backend.prepare(onnx.load(path))


@functools.lru_cache(maxsize=None)
def _session(path: str):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def _check(path: str, feeds: dict[str, np.ndarray]) -> None:
    want = _session(path).run(None, feeds)[0]
    got = _rep(path).run(feeds)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("batch", [1, 3])
def test_mlp_matches_onnxruntime(batch):
    x = np.random.default_rng(batch).standard_normal((batch, 784)).astype(np.float32)
    _check(MLP, {"x": x})


@pytest.mark.parametrize("batch,seq", [(1, 8), (3, 8), (1, 16), (3, 16)])
def test_bert_block_matches_onnxruntime(batch, seq):
    ids = np.random.default_rng(10 * batch + seq).integers(0, VOCAB, (batch, seq), dtype=np.int64)
    _check(BERT, {"ids": ids})


def _symbolic_dims(graph, name: str) -> list[bool]:
    ty = graph.types[name]
    return [not ty.dims[d].is_const and bool(ex.free_syms(ty.dims[d])) for d in ty.dims]


@pytest.mark.parametrize("path,symbolic", [(MLP, [True, False]), (BERT, [True, True])],
                         ids=["mlp", "bert_block"])
def test_compiled_graph_keeps_symbolic_sizes(path, symbolic):
    graph = compile_onnx(path)
    (port,) = graph.inputs
    assert _symbolic_dims(graph, port.name) == symbolic
    for out in graph.outputs:
        assert any(_symbolic_dims(graph, out.name)), f"output {out.name!r} has only fixed sizes"
