"""GridSample, RoiAlign, the preview-training optimizers and the ai.onnx.ml table ops through
mlpack, against onnxruntime (or ONNX's reference evaluator where ORT lacks the op: Adagrad,
Adam, Momentum, 3-D GridSample, TreeEnsemble and RoiAlign max mode; and cubic GridSample with
border padding, where ORT departs from the reference).

Tolerances: interpolation and optimizer arithmetic in f32, rtol=1e-4 / atol=1e-5 (the
sampling coordinates go through a few float ops whose order differs from the oracle's);
counts, labels and tree leaves are exact (atol 1e-6 on float outputs).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import support
from mlpack.codegen.errors import UnsupportedOpError
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mlpack import backend

RNG = np.random.default_rng(0)
F, D, I64 = TP.FLOAT, TP.DOUBLE, TP.INT64
TRAINING = "ai.onnx.preview.training"

check = functools.partial(support.check, rtol=1e-4, atol=1e-5)


def model(op, inputs, outputs, attrs=None, opset=20, domain="", extra=()):
    """One ``op`` node; inputs/outputs are (name, elem_type, shape) triples."""
    node = helper.make_node(op, [i[0] for i in inputs], [o[0] for o in outputs], domain=domain,
                            **(attrs or {}))
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs])
    opsets = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, v) for d, v in extra]]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def rand(*shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


# ---------------------------------------------------------------- GridSample


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(mode, padding, align):
    x = rand(2, 3, 5, 6)
    grid = rand(2, 4, 7, 2, lo=-1.6, hi=1.6)  # reaches outside the image on every side
    m = model("GridSample", [("x", F, x.shape), ("g", F, grid.shape)], [("y", F, None)],
              {"mode": mode, "padding_mode": padding, "align_corners": align})
    # cubic + border: ONNX's reference clamps the coordinate before taking the 4 taps, ORT
    # (like PyTorch) clamps only the taps; the node suite follows the reference
    oracle = "reference" if (mode, padding) == ("cubic", "border") else "ort"
    check(m, {"x": x, "g": grid}, oracle=oracle)


def test_grid_sample_opset16_names():
    x, grid = rand(1, 2, 4, 4), rand(1, 3, 3, 2, lo=-1.2, hi=1.2)
    m = model("GridSample", [("x", F, x.shape), ("g", F, grid.shape)], [("y", F, None)],
              {"mode": "bicubic", "padding_mode": "reflection"}, opset=16)
    check(m, {"x": x, "g": grid})


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "reflection"])
def test_grid_sample_3d(mode, padding):
    x = rand(1, 2, 3, 4, 5)
    grid = rand(1, 2, 3, 2, 3, lo=-1.3, hi=1.3)
    m = model("GridSample", [("x", F, x.shape), ("g", F, grid.shape)], [("y", F, None)],
              {"mode": mode, "padding_mode": padding, "align_corners": 0})
    check(m, {"x": x, "g": grid}, oracle="reference")


# ---------------------------------------------------------------- RoiAlign


def _rois(k, size):
    a = RNG.uniform(-1, size - 2, size=(k, 2))
    wh = RNG.uniform(0.5, size / 2, size=(k, 2))
    return np.concatenate([a, a + wh], axis=1)[:, [0, 1, 2, 3]].astype(np.float32)


@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio", [2, 0])
def test_roi_align_avg(ctm, ratio):
    x = rand(2, 3, 10, 12)
    rois = _rois(4, 10)
    idx = np.array([0, 1, 1, 0], np.int64)
    m = model("RoiAlign", [("x", F, x.shape), ("r", F, rois.shape), ("i", I64, idx.shape)],
              [("y", F, None)], {"output_height": 3, "output_width": 4, "sampling_ratio": ratio,
                                 "spatial_scale": 0.9, "coordinate_transformation_mode": ctm},
              opset=16)
    check(m, {"x": x, "r": rois, "i": idx})


@pytest.mark.parametrize("ratio", [2, 0])
def test_roi_align_max(ratio):
    x = rand(1, 2, 8, 8)
    rois = _rois(3, 8)
    idx = np.zeros(3, np.int64)
    m = model("RoiAlign", [("x", F, x.shape), ("r", F, rois.shape), ("i", I64, idx.shape)],
              [("y", F, None)], {"output_height": 2, "output_width": 3, "sampling_ratio": ratio,
                                 "mode": "max", "coordinate_transformation_mode": "output_half_pixel"},
              opset=16)
    check(m, {"x": x, "r": rois, "i": idx}, oracle="reference")


# ---------------------------------------------------------------- training optimizers


def _training(op, attrs, groups, per):
    """An optimizer node over ``groups`` tensors of the given sizes; returns (model, feeds)."""
    k = len(groups)
    letters = {"Adagrad": "XGH", "Adam": "XGVH", "Momentum": "XGV"}[op]
    names = [f"{c}{i}" for c in letters for i in range(k)]
    inputs = [("R", F, []), ("T", I64, [])] + [(nm, F, [groups[int(nm[1:])]]) for nm in names]
    outs = {"Adagrad": "XH", "Adam": "XVH", "Momentum": "XV"}[op]
    outputs = [(f"{c}{i}_new", F, [groups[i]]) for c in outs for i in range(k)]
    m = model(op, inputs, outputs, attrs, opset=18, domain=TRAINING, extra=[(TRAINING, 1)])
    feeds = {"R": np.array(0.1, np.float32), "T": np.array(3, np.int64)}
    for nm in names:
        feeds[nm] = rand(groups[int(nm[1:])], lo=0.0 if nm[0] == "H" else -1.0)
    assert per == len(letters)
    return m, feeds


@pytest.mark.parametrize("op,attrs,per", [
    ("Adagrad", {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.001}, 3),
    ("Adam", {"alpha": 0.9, "beta": 0.99, "epsilon": 1e-6, "norm_coefficient": 0.01,
              "norm_coefficient_post": 0.02}, 4),
    ("Momentum", {"alpha": 0.9, "beta": 0.5, "mode": "standard", "norm_coefficient": 0.01}, 3),
    ("Momentum", {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.01}, 3),
])
@pytest.mark.parametrize("t", [0, 3])
def test_optimizers(op, attrs, per, t):
    m, feeds = _training(op, attrs, [3, 5], per)
    feeds["T"] = np.array(t, np.int64)
    check(m, feeds, oracle="reference")


# ---------------------------------------------------------------- TfIdfVectorizer


@pytest.mark.parametrize("mode,weights", [("TF", None), ("IDF", None), ("IDF", True),
                                          ("TFIDF", True)])
@pytest.mark.parametrize("skip,lo", [(0, 1), (2, 1), (3, 2)])
def test_tfidf_vectorizer(mode, weights, skip, lo):
    pool = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 1, 2, 3]  # 4 unigrams, 3 bigrams, 1 trigram
    attrs = {"mode": mode, "min_gram_length": lo, "max_gram_length": 3, "max_skip_count": skip,
             "ngram_counts": [0, 4, 10], "ngram_indexes": [7, 0, 1, 2, 3, 4, 5, 6],
             "pool_int64s": pool}
    if weights:
        attrs["weights"] = [0.5, 1.5, 2.0, 1.0, 3.0, 0.25, 1.0, 2.5]
    x = RNG.integers(1, 9, size=(3, 10)).astype(np.int64)
    m = model("TfIdfVectorizer", [("x", I64, x.shape)], [("y", F, None)], attrs, opset=9)
    check(m, {"x": x}, atol=1e-6)
    m1 = model("TfIdfVectorizer", [("x", TP.INT32, [10])], [("y", F, None)], attrs, opset=9)
    check(m1, {"x": x[0].astype(np.int32)}, atol=1e-6)


def test_tfidf_string_pool_refused():
    m = model("TfIdfVectorizer", [("x", I64, [4])], [("y", F, None)],
              {"mode": "TF", "min_gram_length": 1, "max_gram_length": 1, "max_skip_count": 0,
               "ngram_counts": [0], "ngram_indexes": [0], "pool_strings": ["a"]}, opset=9)
    with pytest.raises(UnsupportedOpError, match="string"):
        backend.prepare(m)


# ---------------------------------------------------------------- LabelEncoder


def test_label_encoder_int_to_float():
    m = model("LabelEncoder", [("x", I64, [2, 5])], [("y", F, None)],
              {"keys_int64s": [1, 3, 5, 7], "values_floats": [0.5, 1.5, 2.5, 3.5],
               "default_float": -7.0}, opset=18, domain="ai.onnx.ml", extra=[("ai.onnx.ml", 2)])
    check(m, {"x": RNG.integers(0, 9, size=(2, 5)).astype(np.int64)}, atol=1e-6)


def test_label_encoder_float_to_int():
    keys = [0.5, 1.5, -2.0]
    m = model("LabelEncoder", [("x", F, [6])], [("y", I64, None)],
              {"keys_floats": keys, "values_int64s": [10, 20, 30]}, opset=18,
              domain="ai.onnx.ml", extra=[("ai.onnx.ml", 2)])
    check(m, {"x": np.array([0.5, 2.0, -2.0, 1.5, 0.0, 0.5], np.float32)})


def test_label_encoder_tensors():
    keys = numpy_helper.from_array(np.array([3, 1, 4], np.int64), "keys_tensor")
    vals = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float64), "values_tensor")
    dflt = numpy_helper.from_array(np.array([9.0], np.float64), "default_tensor")
    m = model("LabelEncoder", [("x", I64, [5])], [("y", D, None)],
              {"keys_tensor": keys, "values_tensor": vals, "default_tensor": dflt}, opset=18,
              domain="ai.onnx.ml", extra=[("ai.onnx.ml", 4)])
    check(m, {"x": np.array([1, 2, 3, 4, 1], np.int64)}, atol=1e-6)


def test_label_encoder_strings_refused():
    m = model("LabelEncoder", [("x", I64, [5])], [("y", TP.STRING, None)],
              {"keys_int64s": [1], "values_strings": ["a"]}, opset=18, domain="ai.onnx.ml",
              extra=[("ai.onnx.ml", 2)])
    with pytest.raises(UnsupportedOpError, match="string"):
        backend.prepare(m)


# ---------------------------------------------------------------- TreeEnsemble


def _tensor(name, values, dtype):
    return numpy_helper.from_array(np.asarray(values, dtype), name)


@pytest.mark.parametrize("agg", [0, 1, 2, 3])
def test_tree_ensemble(agg):
    # two trees over 3 features: tree 0 = nodes 0..2 (depth 2), tree 1 = node 3 (a stump)
    attrs = {
        "n_targets": 2, "aggregate_function": agg, "tree_roots": [0, 3],
        "nodes_featureids": [0, 1, 2, 1], "nodes_modes": _tensor("m", [0, 3, 1, 5], np.uint8),
        "nodes_splits": _tensor("s", [0.1, -0.2, 0.3, 0.0], np.float32),
        "nodes_truenodeids": [1, 0, 2, 4], "nodes_trueleafs": [0, 1, 1, 1],
        "nodes_falsenodeids": [2, 1, 3, 5], "nodes_falseleafs": [0, 1, 1, 1],
        "nodes_missing_value_tracks_true": [1, 0, 0, 1],
        "leaf_targetids": [0, 1, 0, 1, 0, 1],
        "leaf_weights": _tensor("w", [1.5, -2.0, 0.25, 4.0, 8.0, -1.0], np.float32),
    }
    m = model("TreeEnsemble", [("x", F, [8, 3])], [("y", F, None)], attrs, opset=18,
              domain="ai.onnx.ml", extra=[("ai.onnx.ml", 5)])
    x = rand(8, 3)
    x[0, 0] = x[5, 1] = np.nan
    check(m, {"x": x}, atol=1e-6, oracle="reference")
