"""Indices out of range behave as ONNX Runtime's on every artifact (issue 15, deliverable 5).

One-node Gather, GatherElements, GatherND, ScatterND and ScatterElements models are built with
the default targets and run natively (``device="cpu"``: kernels in the C engine), on the NumPy
interpreter (``device="portable"``) and on the C engine's portable interpreter: in-range
indices, negative ones included, give ONNX Runtime's outputs; an index equal to the table's
size, or below minus it, raises ``IndexRangeError`` (an ``mlpack.Error``) naming the ONNX node
and the index the caller passed. Tables have 12 rows: the build's random integer inputs are in
[0, 10), and ONNX Runtime (the build's baseline) refuses them on smaller tables.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import mlpack
from mlpack.spec.errors import IndexRangeError

ROWS = 12


def _init(name, shape):
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return nh.from_array(data, name)


def _model(node, ids_shape, out_shape, inits):
    g = h.make_graph([node], "g", [h.make_tensor_value_info("ids", T.INT64, ids_shape)],
                     [h.make_tensor_value_info("y", T.FLOAT, out_shape)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)])


# op -> (model, good ids, ids past the end, ids below -ROWS, the bad index the message names)
CASES = {
    "Gather": (_model(h.make_node("Gather", ["table", "ids"], ["y"], name="emb"), [3], [3, 4],
                      [_init("table", [ROWS, 4])]),
               [0, -1, 11], [0, ROWS, 1], [0, -ROWS - 1, 1]),
    "GatherElements": (_model(h.make_node("GatherElements", ["data", "ids"], ["y"], axis=0,
                                          name="ge"), [2, 3], [2, 3], [_init("data", [ROWS, 3])]),
                       [[0, -1, 5], [11, -12, 2]], [[0, 1, 2], [3, ROWS, 4]],
                       [[0, 1, 2], [3, -ROWS - 1, 4]]),
    "GatherND": (_model(h.make_node("GatherND", ["data", "ids"], ["y"], name="gnd"), [3, 1],
                        [3, 5], [_init("data", [ROWS, 5])]),
                 [[0], [-1], [7]], [[0], [ROWS], [1]], [[0], [-ROWS - 1], [1]]),
    "ScatterND": (_model(h.make_node("ScatterND", ["data", "ids", "upd"], ["y"], name="snd"),
                         [1, 1], [ROWS, 4], [_init("data", [ROWS, 4]), _init("upd", [1, 4])]),
                  [[-2]], [[ROWS]], [[-ROWS - 1]]),
    "ScatterElements": (_model(h.make_node("ScatterElements", ["data", "ids", "upd"], ["y"],
                                           axis=0, name="se"), [1, 3], [ROWS, 3],
                               [_init("data", [ROWS, 3]), _init("upd", [1, 3])]),
                        [[0, -1, 11]], [[0, ROWS, 1]], [[0, -ROWS - 1, 1]]),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from mlpack.packager.build import build
    out = {}
    root = tmp_path_factory.mktemp("index_range")
    for op, (model, *_rest) in CASES.items():
        src, dst = root / f"{op}.onnx", root / f"{op}.mlpack"
        onnx.save(model, str(src))
        build(str(src), str(dst))
        out[op] = dst
    return out


def _runners(path):
    """Each artifact kind's run(feeds) for the container at ``path``."""
    from mlpack.runtime import native
    runners = {dev: mlpack.load(str(path), device=dev).run for dev in ("cpu", "portable")}
    if native.available():
        m = native.open_model(str(path), device="portable")
        runners["c-portable"] = m.run
    return runners


def _node_label(model) -> str:
    node = model.graph.node[0]
    return f"{node.op_type} node '{node.name}'"


@pytest.mark.parametrize("op", list(CASES))
def test_in_range_indices_match_onnxruntime(op, built):
    import onnxruntime as ort
    model, good, _, _ = CASES[op]
    feeds = {"ids": np.array(good, dtype=np.int64)}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    for name, run in _runners(built[op]).items():
        np.testing.assert_allclose(run(feeds)["y"], want, err_msg=f"{op} on {name}")


@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize("which", ["past_end", "below_minus_size"])
def test_out_of_range_index_names_node_and_index(op, which, built):
    model, _, past, below = CASES[op]
    ids = past if which == "past_end" else below
    bad = ROWS if which == "past_end" else -ROWS - 1
    want = (f"{_node_label(model)}: index {bad} out of range for dim of size {ROWS} "
            f"(valid {-ROWS}..{ROWS - 1})")
    for name, run in _runners(built[op]).items():
        with pytest.raises(IndexRangeError) as e:
            run({"ids": np.array(ids, dtype=np.int64)})
        assert isinstance(e.value, mlpack.Error)
        assert want in str(e.value), f"{op} on {name}: {e.value}"


def test_onnxruntime_refuses_them_too():
    import onnxruntime as ort
    model, _, past, _ = CASES["Gather"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="out of bounds|out of range|indices"):
        sess.run(None, {"ids": np.array(past, dtype=np.int64)})
