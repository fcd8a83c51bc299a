"""Bad declared shapes and names through the CLI: exit 2, one line on stderr naming the input or
initializer, no traceback, and nothing written (no container, no scratch file)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import support

F = TensorProto.FLOAT


def _save(folder, inputs, inits=(), op="Relu"):
    ins = ["x", "b"] if op == "Add" else ["x"]
    graph = helper.make_graph([helper.make_node(op, ins, ["y"])], "bad",
                              [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info("y", F, None)], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = folder / "bad.onnx"
    onnx.save(model, str(path))
    return path


def _neg_init():
    t = TensorProto(name="w", data_type=F)
    t.dims.extend([-2, 2])
    t.raw_data = bytes(16)
    return t


def _b(value):
    return numpy_helper.from_array(np.full(4, value, np.float32), "b")


BAD = {
    "negative dim": (dict(inputs=[("x", F, [1, -5])]), "input 'x' dim 1 is -5"),
    "dim too large": (dict(inputs=[("x", F, [1, 2 ** 40])]), "input 'x' dim 1 is 1099511627776"),
    "negative initializer dim": (dict(inputs=[("x", F, [1, 4])], inits=[_neg_init()]),
                                 "initializer 'w' dim 0 is -2"),
    "duplicate initializer": (dict(inputs=[("x", F, [1, 4])], inits=[_b(1), _b(2)], op="Add"),
                              "initializer 'b' is defined twice"),
    "duplicate input": (dict(inputs=[("x", F, [1, 4]), ("x", F, [1, 4])]),
                        "input 'x' is listed twice"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_build_refuses_bad_model_and_writes_nothing(tmp_path, case):
    kwargs, fragment = BAD[case]
    path = _save(tmp_path, **kwargs)
    result = support.cli("build", path, "-o", tmp_path / "out.mlpack")
    support.assert_user_error(result, "bad.onnx", fragment)
    assert os.listdir(tmp_path) == ["bad.onnx"]


@pytest.mark.parametrize("command", ["import", "run-reference"])
def test_other_commands_refuse_bad_model(tmp_path, command):
    path = _save(tmp_path, inputs=[("x", F, [1, -5])])
    args = ["--output", tmp_path / "out"] if command == "run-reference" else []
    support.assert_user_error(support.cli(command, path, *args), "input 'x' dim 1 is -5")


def test_build_process_prints_one_line(tmp_path):
    """The installed command, as a user runs it: only the error line on stderr."""
    path = _save(tmp_path, inputs=[("x", F, [1, 2 ** 40])])
    proc = subprocess.run([sys.executable, "-c", "from mlpack.packager.cli import main; main()",
                           "build", str(path), "-o", str(tmp_path / "out.mlpack")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "bad.onnx" in lines[0], lines
    assert "input 'x' dim 1 is 1099511627776" in lines[0] and "4 GiB" in lines[0]
    assert sorted(os.listdir(tmp_path)) == ["bad.onnx"]


def test_build_refuses_a_dim_binding_too_large_to_draw(tmp_path):
    """A symbolic dim is fine in the model; ``--dim`` binding it past the per-tensor limit is
    refused before any input is drawn (it was a MemoryError traceback)."""
    path = _save(tmp_path, inputs=[("x", F, ["batch", 16])])
    result = support.cli("build", path, "-o", tmp_path / "out.mlpack", "--dim",
                         f"batch={2 ** 40}")
    support.assert_user_error(result, f"--dim batch={2 ** 40}", "input 'x'", "64 TiB", "4 GiB")
    assert os.listdir(tmp_path) == ["bad.onnx"]
