"""packager/testvectors.py: integer inputs that index a table are drawn inside it, so a model
whose tables are smaller than the default range builds; when ONNX Runtime still refuses the
inputs, the build says so in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlpack.codegen.compile import compile_onnx
from mlpack.packager import testvectors as tv
from mlpack.packager.build import build
from mlpack.runtime import load

pytest.importorskip("onnxruntime")


def _model(rows: int, offset: int = 0) -> onnx.ModelProto:
    """Token ids (plus ``offset``) looked up in a table of ``rows`` rows; ``n`` is an integer
    input that indexes nothing."""
    table = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((rows, 4)).astype(np.float32), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"], name="emb"),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["y", "nf"], ["z"])]
    inits = [table]
    if offset:
        inits.append(numpy_helper.from_array(np.array(offset, np.int64), "off"))
        nodes.insert(0, helper.make_node("Add", ["ids0", "off"], ["ids"]))
    ids = "ids0" if offset else "ids"
    graph = helper.make_graph(
        nodes, "emb",
        [helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", 3]),
         helper.make_tensor_value_info("n", TensorProto.INT64, ["batch", 3, 1])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 3, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_index_limits_are_the_sizes_indexed():
    assert tv.index_limits(compile_onnx(_model(5))) == {"ids": 5}
    assert tv.index_limits(compile_onnx(_model(1000))) == {"ids": 1000}


def test_ids_are_drawn_inside_a_small_table(tmp_path):
    out = tmp_path / "emb.mlpack"
    report = build(_model(5).SerializeToString(), out, cases=3)
    assert all(a.validated or "this host is" in a.reason for a in report.artifacts)
    with load(out) as m:
        cases = m.test_vectors()
    ids = np.concatenate([c[0]["ids"].ravel() for c in cases])
    n = np.concatenate([c[0]["n"].ravel() for c in cases])
    assert ids.min() >= 0 and ids.max() <= 4
    assert n.max() > 4  # an integer that indexes nothing keeps the default range [0, 10)


def test_inputs_onnx_runtime_refuses_are_one_line(tmp_path):
    """ids + 7 into 10 rows: the ids are drawn below 10, ONNX Runtime refuses ids + 7."""
    path = tmp_path / "off.onnx"
    onnx.save(_model(10, offset=7), path)
    proc = subprocess.run([sys.executable, "-c", "from mlpack.packager.cli import main; main()",
                           "build", str(path), "-o", str(tmp_path / "out.mlpack")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ONNX Runtime, the reference, cannot "
                                                   "run this model"), lines
    assert sorted(os.listdir(tmp_path)) == ["off.onnx"]
