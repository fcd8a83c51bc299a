"""The nine ``light_*`` models that ship with the onnx wheel, and random-weight rebuilds of them.

The shipped models make every weight with a ConstantOfShape node filling one value, so their
outputs are uniform softmaxes that say little about numerics. ``random_weight_model`` rebuilds
a model with those tensors replaced by seeded random initializers of sane scale: conv and gemm
weights N(0, sqrt(2/fan_in)), biases N(0, 0.1), BatchNorm scale U(0.5, 1.5) and bias N(0, 0.1).

BatchNorm running statistics drawn independently of the activations (mean N(0, 0.1), variance
U(0.5, 1.5)) let activations grow geometrically with depth wherever residual sums meet
(resnet50 logits reach 5e4, shufflenet 8e5), so they are calibrated instead, as training would
leave them: each BatchNorm's mean is its input's per-channel mean plus N(0, 0.1) standard
deviations, its variance the input's variance times U(0.5, 1.5), measured with ONNX Runtime on
a seeded input, layer by layer (rounded to 4 digits, so the result does not hang on the last
bits of a run). Activations stay O(1) and the output is a real distribution.
A benchmark reuses this module; nothing here depends on mlpack.
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


def without_final_softmax(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model with its output's Softmax taken off (its output the Softmax's input), or None
    when the output is not a Softmax's."""
    last = model.graph.node[-1]
    if last.op_type != "Softmax" or last.output[0] != model.graph.output[0].name:
        return None
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    del cut.graph.node[-1]
    del cut.graph.output[:]
    cut.graph.output.add(name=last.input[0])  # no type: the importer and ONNX Runtime infer it
    return cut


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


def _normal(rng, shape, std: float) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _uniform(rng, shape, low: float, high: float) -> np.ndarray:
    return rng.random(shape, dtype=np.float32) * np.float32(high - low) + np.float32(low)


def _he_normal(rng, shape, fan_in: int) -> np.ndarray:
    return _normal(rng, shape, np.sqrt(2.0 / fan_in))


def _random_weight(rng, shape: tuple[int, ...], node: onnx.NodeProto, i: int) -> np.ndarray:
    """A tensor with the scale its role calls for."""
    role = (node.op_type, i)
    if role == ("Conv", 1):
        return _he_normal(rng, shape, int(np.prod(shape[1:])))
    if role == ("Gemm", 1):
        # B is (N, K) with transB, else (K, N); a weight reshaped on the way may have more dims
        fan_in = shape[-1] if _attr(node, "transB", 0) else int(np.prod(shape)) // shape[-1]
        return _he_normal(rng, shape, fan_in)
    if role in (("BatchNormalization", 1), ("BatchNormalization", 4)) or node.op_type == "Mul":
        return _uniform(rng, shape, 0.5, 1.5)  # scale, variance, or an explicit scale layer
    if role in (("Conv", 2), ("Gemm", 2), ("BatchNormalization", 2), ("BatchNormalization", 3)):
        return _normal(rng, shape, 0.1)        # bias, or mean
    if node.op_type == "Add":
        return _normal(rng, shape, 0.1)        # an explicit bias layer
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
    calibrate_batchnorm(model, seed)
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


# ---------------------------------------------------------------- BatchNorm calibration


def _round_sig(x: np.ndarray, digits: int) -> np.ndarray:
    mag = np.floor(np.log10(np.maximum(np.abs(x), 1e-30)))
    step = 10.0 ** (mag - digits + 1)
    return (np.round(x / step) * step).astype(np.float32)


class _NodeRunner:
    """Runs one node at a time through ONNX Runtime (sessions cached by node and input types)."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.sessions: dict[bytes, object] = {}

    def run(self, node: onnx.NodeProto, args: dict[str, np.ndarray]) -> list[np.ndarray]:
        names = [f"in{i}" if x else "" for i, x in enumerate(node.input)]
        feeds = {n: args[x] for n, x in zip(names, node.input) if x}
        key = node.op_type.encode() + b"".join(a.SerializeToString() for a in node.attribute)
        key += repr([(n, a.dtype.str, a.shape) for n, a in feeds.items()]).encode()
        if key not in self.sessions:
            self.sessions[key] = self._session(node, names, feeds)
        return self.sessions[key].run(None, feeds)

    def _session(self, node, names, feeds):
        import onnxruntime as ort
        one = onnx.helper.make_node(node.op_type, names, [f"out{i}" for i in range(len(node.output))])
        one.attribute.extend(node.attribute)
        graph = onnx.helper.make_graph(
            [one], "node",
            [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in feeds.items()],
            [onnx.helper.make_empty_tensor_value_info(o) for o in one.output])
        m = onnx.helper.make_model(graph, opset_imports=self.model.opset_import,
                                   ir_version=self.model.ir_version)
        options = ort.SessionOptions()  # one thread: hundreds of sessions, no thread pools
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        return ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])


def calibrate_batchnorm(model: onnx.ModelProto, seed: int) -> None:
    """Set every BatchNorm's running mean and variance from the activations it sees.

    The model runs node by node on a seeded input; each BatchNorm's statistics are set from
    its input before it runs, so every layer sees calibrated layers upstream (one pass).
    """
    graph = model.graph
    bns = [n for n in graph.node if n.op_type == "BatchNormalization"]
    if not bns:
        return
    rng = np.random.default_rng([seed, 1])
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    values.update(random_inputs(model, seed + 1))
    last_use = {x: i for i, node in enumerate(graph.node) for x in node.input}
    runner, stats = _NodeRunner(model), {}
    for i, node in enumerate(graph.node):
        if node.op_type == "BatchNormalization":
            stats.update(_bn_stats(node, values[node.input[0]], rng))
            values.update(stats)
        outs = runner.run(node, values)
        values.update(zip(node.output, outs))
        for x in node.input:
            if last_use.get(x) == i and x not in stats:
                values.pop(x, None)
    for t in graph.initializer:
        if t.name in stats:
            t.CopyFrom(numpy_helper.from_array(stats[t.name], t.name))


def _bn_stats(node: onnx.NodeProto, x: np.ndarray, rng) -> dict[str, np.ndarray]:
    """Running mean and variance for a BatchNorm that sees ``x``: its statistics, perturbed."""
    per_channel = np.moveaxis(x, 1, 0).reshape(x.shape[1], -1).astype(np.float64)
    mean, var = per_channel.mean(axis=1), per_channel.var(axis=1)
    mean = mean + rng.normal(0.0, 0.1, mean.shape) * np.sqrt(var)
    var = var * rng.uniform(0.5, 1.5, var.shape)
    return {node.input[3]: _round_sig(mean, 4), node.input[4]: _round_sig(var, 4)}
