"""The benchmark model set, written as ONNX files into a cache folder.

    path = materialize("resnet50")              # benchmarks/.models/resnet50.onnx, made once
    paths = [materialize(n, folder) for n in NAMES]

Every model has fixed shapes and seeded weights stored as initializers, so each run of the suite
times the same arithmetic:

* the nine ``light_*`` architectures shipped with onnx (bvlc_alexnet ... zfnet512), batch 1,
  224x224, rebuilt with random weights by tests/models/light.py (``random_weight_model``);
* ``mlp``: batch 64, 784-1024-1024-10 with ReLU (Gemm nodes);
* ``bert_block``: one post-LayerNorm BERT encoder layer, batch 1, seq 128, hidden 256, 4 heads,
  FFN 1024: Q/K/V projections, scaled dot-product attention with Softmax, output projection,
  residual + LayerNorm, FFN with GELU (the Erf form, opset 17), residual + LayerNorm;
* ``capsule_einsum`` and ``capsule_framework``: the convolutional capsule primitive of
  tests/models/capsule.py, as one Einsum and as the unfold + MatMul + ReduceSum a framework exports.

The tests' model builders are imported from the checkout's tests/models folder (put on
sys.path here), which stays where it is. A cached file is rebuilt when the source that makes it
(this file, or the tests module it uses) changed: a ``NAME.onnx.recipe`` next to it holds their
digest and the seed.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEST_MODELS = ROOT / "tests" / "models"
DEFAULT_FOLDER = Path(__file__).resolve().parent / ".models"
SEED = 0

LIGHT = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "vgg19", "zfnet512")
NAMES = LIGHT + ("mlp", "bert_block", "capsule_einsum", "capsule_framework")


def tests_module(name: str):
    """tests/models/NAME.py, imported with tests/models on sys.path."""
    folder = str(TEST_MODELS)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return __import__(name)


# ---------------------------------------------------------------- the builders


def _light(name: str, seed: int):
    return tests_module("light").random_weight_model(name, seed)


def _init(name: str, array: np.ndarray):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.ascontiguousarray(array, np.float32), name)


def _dense(rng, fan_in: int, fan_out: int) -> np.ndarray:
    return rng.standard_normal((fan_in, fan_out), dtype=np.float32) * np.float32(np.sqrt(2 / fan_in))


def _bias(rng, n: int) -> np.ndarray:
    return rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)


def mlp(seed: int = SEED, batch: int = 64, sizes=(784, 1024, 1024, 10)):
    """Gemm + ReLU layers, fixed batch."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i, (k, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        inits += [_init(f"w{i}", _dense(rng, k, n)), _init(f"b{i}", _bias(rng, n))]
        last = i == len(sizes) - 2
        y = "y" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y if last else f"g{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"g{i}"], [y]))
        x = y
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, sizes[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def bert_block(seed: int = SEED, batch: int = 1, seq: int = 128, hidden: int = 256,
               heads: int = 4, ffn: int = 1024):
    """One post-LayerNorm BERT encoder layer on hidden states ``x[batch, seq, hidden]``."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    head = hidden // heads
    inits, nodes = [], []

    def const(name, array):
        inits.append(_init(name, array) if np.asarray(array).dtype.kind == "f" else
                     onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def linear(x, name, k, n):
        y = node("MatMul", [x, const(f"{name}_w", _dense(rng, k, n))], f"{name}_mm")
        return node("Add", [y, const(f"{name}_b", _bias(rng, n))], name)

    def layer_norm(x, name):
        gamma = 1 + 0.1 * rng.standard_normal(hidden, dtype=np.float32)
        return node("LayerNormalization", [x, const(f"{name}_g", gamma),
                                           const(f"{name}_b", _bias(rng, hidden))],
                    name, axis=-1, epsilon=1e-12)

    split = const("split_heads", np.array([batch, seq, heads, head], np.int64))
    merge = const("merge_heads", np.array([batch, seq, hidden], np.int64))

    def heads_of(x, name, perm):
        r = node("Reshape", [x, split], f"{name}_r")
        return node("Transpose", [r], f"{name}_t", perm=perm)

    q = heads_of(linear("x", "q", hidden, hidden), "q", [0, 2, 1, 3])  # b, h, s, d
    k = heads_of(linear("x", "k", hidden, hidden), "k", [0, 2, 3, 1])  # b, h, d, s
    v = heads_of(linear("x", "v", hidden, hidden), "v", [0, 2, 1, 3])  # b, h, s, d
    scores = node("MatMul", [q, k], "scores")
    scaled = node("Mul", [scores, const("scale", np.array(1 / np.sqrt(head), np.float32))],
                  "scaled")
    probs = node("Softmax", [scaled], "probs", axis=-1)
    ctx = node("MatMul", [probs, v], "ctx")
    ctx = node("Transpose", [ctx], "ctx_t", perm=[0, 2, 1, 3])
    ctx = node("Reshape", [ctx, merge], "ctx_r")
    attn = linear(ctx, "attn_out", hidden, hidden)
    h = layer_norm(node("Add", ["x", attn], "res1"), "ln1")
    f = linear(h, "ffn_in", hidden, ffn)
    # GELU, exact: 0.5 x (1 + erf(x / sqrt 2))
    e = node("Erf", [node("Mul", [f, const("inv_sqrt2", np.array(1 / np.sqrt(2), np.float32))],
                          "gelu_s")], "gelu_e")
    e = node("Add", [e, const("one", np.array(1, np.float32))], "gelu_1")
    g = node("Mul", [node("Mul", [f, e], "gelu_m"), const("half", np.array(0.5, np.float32))],
             "gelu")
    f = linear(g, "ffn_out", ffn, hidden)
    node("LayerNormalization", [node("Add", [h, f], "res2"), const("ln2_g", 1 + 0.1 *
         rng.standard_normal(hidden, dtype=np.float32)), const("ln2_b", _bias(rng, hidden))],
         "y", axis=-1, epsilon=1e-12)
    graph = helper.make_graph(
        nodes, "bert_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _capsule(form: str, seed: int):
    module = tests_module("capsule")
    return getattr(module, f"{form}_model")()  # the module seeds its own weights


BUILDERS = {
    **{n: (lambda seed, n=n: _light(n, seed)) for n in LIGHT},
    "mlp": mlp,
    "bert_block": bert_block,
    "capsule_einsum": lambda seed: _capsule("einsum", seed),
    "capsule_framework": lambda seed: _capsule("framework", seed),
}

# the source files each model's bytes depend on (besides this one)
_SOURCES = {**{n: ("light.py",) for n in LIGHT},
            "capsule_einsum": ("capsule.py",), "capsule_framework": ("capsule.py",)}


# ---------------------------------------------------------------- the cache


def recipe(name: str, seed: int = SEED) -> str:
    """A digest of what makes the model: the seed and the sources of its builder."""
    h = hashlib.sha256(f"{name} seed={seed}\n".encode())
    for path in (Path(__file__),) + tuple(TEST_MODELS / s for s in _SOURCES.get(name, ())):
        h.update(path.read_bytes())
    return h.hexdigest()


def cached(folder: Path, name: str, want: str, write) -> Path:
    """``folder/NAME.onnx``, made by ``write(temporary path)`` unless the ``NAME.onnx.recipe``
    beside it already says ``want``; the file only ever appears whole."""
    folder.mkdir(parents=True, exist_ok=True)
    path, stamp = folder / f"{name}.onnx", folder / f"{name}.onnx.recipe"
    if path.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return path
    tmp = folder / f"{name}.onnx.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    stamp.write_text(want + "\n")
    return path


def materialize(name: str, folder=None, seed: int = SEED) -> Path:
    """The ONNX file of model ``name`` in ``folder`` (default benchmarks/.models/), written if it
    is missing or its recipe changed."""
    import onnx

    if name not in BUILDERS:
        raise KeyError(f"unknown benchmark model {name!r}; the models are: {', '.join(NAMES)}")
    folder = Path(folder) if folder is not None else DEFAULT_FOLDER
    return cached(folder, name, recipe(name, seed),
                  lambda tmp: onnx.save(BUILDERS[name](seed), os.fspath(tmp)))


if __name__ == "__main__":  # python -m benchmarks.models [NAME...]: write them, print the paths
    for n in sys.argv[1:] or NAMES:
        print(materialize(n))
