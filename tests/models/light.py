"""The nine ``light_*`` models that ship with the onnx wheel, and random-weight rebuilds of them.

The shipped models make every weight with a ConstantOfShape node filling one value, so their
outputs are uniform softmaxes that say little about numerics. ``random_weight_model`` rebuilds
a model with those tensors replaced by seeded random initializers of sane scale (He-normal conv
and gemm weights, BatchNorm statistics near identity), so activations stay O(1) and the output
is a real distribution. A benchmark reuses it; nothing here depends on mlpack.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

NAMES = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "vgg19", "zfnet512")

# ops a weight may pass through on its way to the op that gives it its role
_PASS_THROUGH = ("Unsqueeze", "Reshape")


def light_dir() -> str:
    """The folder of the light models inside the installed onnx package."""
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def model_path(name: str) -> str:
    return os.path.join(light_dir(), f"light_{name}.onnx")


def load_model(name: str) -> onnx.ModelProto:
    """The shipped model ``light_{name}.onnx``."""
    return onnx.load(model_path(name))


def expected_output(name: str) -> np.ndarray:
    """The shipped expected output ``light_{name}_output_0.pb``."""
    t = onnx.TensorProto()
    with open(os.path.join(light_dir(), f"light_{name}_output_0.pb"), "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are not initializers (each light model has one: the image)."""
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def reference_inputs(name: str, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The inputs ONNX's own backend runner feeds a light model (its dummy data, seed 0)."""
    from onnx.backend.test.runner import Runner
    return {vi.name: Runner.generate_dummy_data(vi, seed=0, name=name, random=False)
            for vi in real_inputs(model)}


def tolerances(name: str) -> tuple[float, float]:
    """(rtol, atol) ONNX's backend test suite uses for ``test_{name}``."""
    from onnx.backend.test.case.model import collect_testcases
    for case in collect_testcases():
        if case.name == f"test_{name}":
            return case.rtol, case.atol
    raise KeyError(f"onnx has no model test case test_{name}")


def random_inputs(model: onnx.ModelProto, seed: int, batch: int = 1) -> dict[str, np.ndarray]:
    """Seeded standard-normal inputs for the real inputs (a symbolic dim gets ``batch``)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in real_inputs(model):
        shape = [d.dim_value if d.HasField("dim_value") else batch
                 for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


# ---------------------------------------------------------------- random weights


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for i, x in enumerate(node.input):
            uses.setdefault(x, []).append((node, i))
    return uses


def _role(name: str, uses) -> tuple[onnx.NodeProto, int]:
    """The (node, input index) that decides what a weight is, looking through reshapes."""
    seen = uses.get(name, [])
    if len(seen) != 1:
        raise ValueError(f"weight {name!r} has {len(seen)} consumers; expected one")
    node, i = seen[0]
    if node.op_type in _PASS_THROUGH and i == 0:
        return _role(node.output[0], uses)
    return node, i


def _attr(node: onnx.NodeProto, key: str, default):
    for a in node.attribute:
        if a.name == key:
            return onnx.helper.get_attribute_value(a)
    return default


def _he_normal(rng, shape, fan_in: int) -> np.ndarray:
    return rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)


def _random_weight(rng, shape: tuple[int, ...], node: onnx.NodeProto, i: int) -> np.ndarray:
    """A tensor with the scale its role calls for."""
    role = (node.op_type, i)
    if role == ("Conv", 1):
        return _he_normal(rng, shape, int(np.prod(shape[1:])))
    if role == ("Gemm", 1):
        fan_in = int(np.prod(shape[1:])) if _attr(node, "transB", 0) else shape[0]
        return _he_normal(rng, shape, fan_in)
    if role in (("BatchNormalization", 1), ("BatchNormalization", 4)) or node.op_type == "Mul":
        return rng.uniform(0.5, 1.5, shape)   # scale, variance, or an explicit scale layer
    if role in (("Conv", 2), ("Gemm", 2), ("BatchNormalization", 2), ("BatchNormalization", 3)):
        return rng.normal(0.0, 0.1, shape)    # bias, or mean
    if node.op_type == "Add":
        return rng.normal(0.0, 0.1, shape)    # an explicit bias layer
    raise ValueError(f"no rule for a weight feeding input {i} of {node.op_type} {node.name!r}")


def random_weight_model(name: str, seed: int) -> onnx.ModelProto:
    """``light_{name}`` with each ConstantOfShape-made weight a seeded random initializer."""
    model = load_model(name)
    graph = model.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in graph.initializer}
    uses = _consumers(graph)
    keep, new_inits, dropped = [], [], set()
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            keep.append(node)
            continue
        shape = tuple(int(s) for s in numpy_helper.to_array(inits[node.input[0]]))
        data = _random_weight(rng, shape, *_role(node.output[0], uses)).astype(np.float32)
        new_inits.append(numpy_helper.from_array(data, node.output[0]))
        dropped.add(node.input[0])
    del graph.node[:]
    graph.node.extend(keep)
    _replace_initializers(graph, dropped, new_inits)
    onnx.checker.check_model(model)
    return model


def _replace_initializers(graph: onnx.GraphProto, dropped: set[str], new_inits) -> None:
    """Drop the shape initializers; add the weights (also as graph inputs, as IR 3 wants)."""
    kept_inits = [t for t in graph.initializer if t.name not in dropped]
    kept_inputs = [vi for vi in graph.input if vi.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits + new_inits)
    del graph.input[:]
    graph.input.extend(kept_inputs)
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in new_inits)
