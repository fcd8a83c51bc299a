"""The portable program: IR graph -> JSON + weights archive -> equal graph, same outputs."""

import json
import os

import numpy as np
import onnx
import pytest

from mlpack.codegen.compile import compile_onnx
from mlpack.spec.errors import FormatError
from mlpack.spec.ir import parse_graph, run_graph, verify
from mlpack.spec.ir.program import decode_program, dumps_program
from mlpack.spec.tensorfile import read_tensors, write_tensors

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _roundtrip(g):
    weights = write_tensors({c.name: c.data for c in g.constants.values()})
    back = decode_program(dumps_program(g), read_tensors(weights))
    verify(back)
    return back


@pytest.mark.parametrize("name", ["light_squeezenet", "light_resnet50", "light_inception_v1"])
def test_light_model_program_roundtrips_to_an_equal_graph(name):
    g = compile_onnx(os.path.join(LIGHT, name + ".onnx"))
    assert _roundtrip(g) == g


def test_bert_block_program_runs_like_the_graph():
    g = compile_onnx(os.path.join(MODELS, "bert_block.onnx"))
    back = _roundtrip(g)
    assert back == g
    (inp,) = g.inputs
    ids = np.random.default_rng(0).integers(0, 100, size=(2, 8)).astype(np.int64)
    a, b = run_graph(g, {inp.name: ids}), run_graph(back, {inp.name: ids})
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_procedures_and_special_constants_roundtrip():
    g = parse_graph("""
graph "p" {
  in %x: f32{n=$n} (n)
  %m: f32{n=$n} = select(isnan(%x[n=n]), -inf, %x[n=n] * 0.5:f32 + cast<f32>(nan:f64))
  %v: f32{k=$k}, %i: i64{k=$k} = proc bounds{$k=$n} {
    let c: i64 = 0
    for j in $n {
      if gt(%m[n=j], 0.0) {
        %v[k=c] = %m[n=j]
        %i[k=c] = j
        let c: i64 = c + 1
      }
    }
    size $k = c
  }
  out %v (k)
  out %i (k)
}
""")
    assert _roundtrip(g) == g


def test_newer_major_and_garbage_are_refused_clearly():
    g = parse_graph('graph "g" {\n  in %x: f32{n=2} (n)\n  out %x (n)\n}\n')
    j = json.loads(dumps_program(g))
    j["version"] = [2, 0]
    with pytest.raises(FormatError, match="newer than this runtime"):
        decode_program(json.dumps(j).encode(), {})
    for bad in (b"", b"{}", b"[1,2]", b'{"program": "mlpack.portable", "version": [1, 0]}',
                b'{"program": "mlpack.portable", "version": [1, 0], "inputs": [], "constants": [],'
                b' "ops": [{"out": "y", "dtype": "f32", "dims": [], "body": ["frob", 1]}], "outputs": []}'):
        with pytest.raises(FormatError):
            decode_program(bad, {})
