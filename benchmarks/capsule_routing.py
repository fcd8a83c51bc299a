"""The capsule layer plus three EM routing iterations: mlpack's DSL build against ONNX Runtime.

    python -m benchmarks.capsule_routing [--threads 1,2] [--repeat 10] [--memory-budget B]

The problem of issue 23's bar: batch 8, 16x16 input, 32 capsule types in and out, 4x4 poses,
3x3 kernel, stride 2. Three models of the same computation (examples/capsules/reference.py's
float64 maths, inverse temperature 0.01):

* mlpack: one ``EMRouting`` node of the domain ``capsules.example``, built from the DSL
  function examples/capsules/capsules.py registers (``mlpack build --ops capsules.py``), for
  this host's cpu target, the passes deciding what to materialize;
* ``best``: the best ONNX formulation written here for ONNX Runtime: the patches as two
  Gathers, the votes as one Einsum, every routing step a broadcasting elementwise op or a
  ReduceSum, each squared deviation computed once per iteration and shared by the variance and
  the E-step, the normalization over outputs one Softmax;
* ``framework``: what a framework exports: patches transposed into rows, the votes a batched
  MatMul, and each formula of the paper its own ops (the deviation squared again for the
  E-step, the normalization written out as exp and sums).

mlpack and ONNX Runtime (``best``) alternate in this process (packager/bench.py's
``time_alternating``) at each thread count; each model's peak memory is that of a child process
that loads and runs only it (``peak_rss``); each output's error is against the float64
reference. Prints one line per thread count (the medians and their ratios, and the fastest
runs', the steadier measure on a shared machine) and the peaks.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))
CAPS = os.path.join(os.path.dirname(HERE), "examples", "capsules")
BATCH, SIZE, C, K, STRIDE, ITERS, INV_T = 8, 16, 32, 3, 2, 3, 0.01
OUT = (SIZE - K) // STRIDE + 1
DOMAIN = "capsules.example"


def inputs(seed: int = 0) -> dict:
    """Seeded inputs, W in the layout the node takes (kx, ky, ci, k, j, co)."""
    rng = np.random.default_rng(seed)
    P = rng.standard_normal((BATCH, SIZE, SIZE, C, 4, 4)).astype(np.float32)
    A = rng.uniform(0.2, 1.0, (BATCH, SIZE, SIZE, C)).astype(np.float32)
    W = (rng.standard_normal((K, K, C, C, 4, 4)) / np.sqrt(K * K * C * 4)).astype(np.float32)
    return {"P": P, "A": A, "W": np.ascontiguousarray(W.transpose(0, 1, 2, 4, 5, 3)),
            "beta_v": (0.1 * rng.standard_normal(C)).astype(np.float32),
            "beta_a": np.zeros(C, np.float32)}


def reference(feeds: dict) -> dict:
    """float64 mu [n, x, y, i, j, co] and a [n, x, y, co] (the ports' layouts)."""
    sys.path.insert(0, CAPS)
    import reference as ref
    W = feeds["W"].transpose(0, 1, 2, 5, 3, 4)           # back to (kx, ky, ci, co, k, j)
    mu, a = ref.em_routing(feeds["P"], feeds["A"], W, feeds["beta_v"], feeds["beta_a"],
                           stride=STRIDE, iterations=ITERS, inverse_temperature=INV_T)
    return {"mu": mu.transpose(0, 1, 2, 4, 5, 3), "a": a}


def _value(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _ports():
    ins = [_value("P", [BATCH, SIZE, SIZE, C, 4, 4]), _value("A", [BATCH, SIZE, SIZE, C]),
           _value("W", [K, K, C, 4, 4, C]), _value("beta_v", [C]), _value("beta_a", [C])]
    outs = [_value("mu", [BATCH, OUT, OUT, 4, 4, C]), _value("a", [BATCH, OUT, OUT, C])]
    return ins, outs


def _model(nodes, inits, name, domain=None) -> onnx.ModelProto:
    ins, outs = _ports()
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(helper.make_graph(nodes, name, ins, outs, inits), opset_imports=opsets)
    m.ir_version = 8
    return m


def custom_model() -> onnx.ModelProto:
    node = helper.make_node("EMRouting", ["P", "A", "W", "beta_v", "beta_a"], ["mu", "a"],
                            domain=DOMAIN, stride=STRIDE, iterations=ITERS,
                            inverse_temperature=INV_T)
    return _model([node], [], "em_routing", DOMAIN)


class _G:
    """A tiny ONNX graph writer: ``g.op("Mul", a, b)`` returns the new value's name."""

    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def op(self, op_type, *ins, out=None, **attrs) -> str:
        self.n += 1
        out = out or f"{op_type.lower()}{self.n}"
        self.nodes.append(helper.make_node(op_type, list(ins), [out], **attrs))
        return out

    def const(self, value, dtype=np.float32) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(value, dtype), name))
        return name


def _patch(g: _G, t: str) -> str:
    """t[n, h, w, ...] -> [n, x, kx, y, ky, ...] by two Gathers of the index 2x + kx."""
    idx = g.const(STRIDE * np.arange(OUT)[:, None] + np.arange(K)[None, :], np.int64)
    return g.op("Gather", g.op("Gather", t, idx, axis=1), idx, axis=3)


def best_model() -> onnx.ModelProto:
    """Votes V[n, x, y, b=(kx,ky,ci), i, j, co] by one Einsum; the routing over b (axis 3)."""
    g = _G()
    pp = _patch(g, "P")                                        # n x kx y ky ci i k
    V = g.op("Einsum", pp, "W", equation="nxaybcik,abckjo->nxyabcijo")
    V = g.op("Reshape", V, g.const([BATCH, OUT, OUT, K * K * C, 4, 4, C], np.int64))
    ap = g.op("Transpose", _patch(g, "A"), perm=[0, 1, 3, 2, 4, 5])   # n x y kx ky ci
    a_in = g.op("Reshape", ap, g.const([BATCH, OUT, OUT, K * K * C, 1, 1, 1], np.int64))
    axis_b, axes_ij = g.const([3], np.int64), g.const([4, 5], np.int64)
    Ra = g.op("Mul", a_in, g.const(1.0 / C))
    for it in range(ITERS):
        mass = g.op("ReduceSum", Ra, axis_b)                   # n x y 1 1 1 co|1
        mu = g.op("Div", g.op("ReduceSum", g.op("Mul", V, Ra), axis_b), mass)
        d2 = g.op("Mul", *(2 * [g.op("Sub", V, mu)]))
        var = g.op("Add", g.op("Div", g.op("ReduceSum", g.op("Mul", d2, Ra), axis_b), mass),
                   g.const(1e-6))
        cost = g.op("ReduceSum", g.op("Mul", g.op("Add", g.op("Mul", g.const(0.5), g.op("Log", var)),
                                                  "beta_v"), mass), axes_ij)
        a = g.op("Sigmoid", g.op("Mul", g.op("Sub", "beta_a", cost), g.const(INV_T)),
                 out="a_last" if it == ITERS - 1 else None)
        if it == ITERS - 1:
            g.op("Reshape", mu, g.const([BATCH, OUT, OUT, 4, 4, C], np.int64), out="mu")
            g.op("Reshape", a, g.const([BATCH, OUT, OUT, C], np.int64), out="a")
            break
        norm = g.op("ReduceSum", g.op("Mul", g.const(0.5),
                                      g.op("Log", g.op("Mul", var, g.const(2 * math.pi)))), axes_ij)
        prec = g.op("Div", g.const(0.5), var)
        log_p = g.op("Neg", g.op("Add", g.op("ReduceSum", g.op("Mul", d2, prec), axes_ij), norm))
        R = g.op("Softmax", g.op("Add", log_p, g.op("Log", a)), axis=-1)
        Ra = g.op("Mul", R, a_in)
    return _model(g.nodes, g.inits, "em_routing_best")


def framework_model() -> onnx.ModelProto:
    """Patches as rows, votes by batched MatMul [b, rows=(n x y i), k] @ [b, k, (j co)]; each
    formula its own ops, the routing tensors [b, n x y, i, j, co]."""
    g = _G()
    B, NXY = K * K * C, BATCH * OUT * OUT
    pp = g.op("Transpose", _patch(g, "P"), perm=[2, 4, 5, 0, 1, 3, 6, 7])  # kx ky ci n x y i k
    rows = g.op("Reshape", pp, g.const([B, NXY * 4, 4], np.int64))
    w = g.op("Reshape", "W", g.const([B, 4, 4 * C], np.int64))
    V = g.op("Reshape", g.op("MatMul", rows, w), g.const([B, NXY, 4, 4, C], np.int64))
    ap = g.op("Transpose", _patch(g, "A"), perm=[2, 4, 5, 0, 1, 3])        # kx ky ci n x y
    a_in = g.op("Reshape", ap, g.const([B, NXY, 1, 1, 1], np.int64))
    axis_b, axes_ij = g.const([0], np.int64), g.const([2, 3], np.int64)
    R = g.op("Expand", g.const(1.0 / C), g.const([B, NXY, 1, 1, C], np.int64))
    for it in range(ITERS):
        Ra = g.op("Mul", R, a_in)
        mass = g.op("ReduceSum", Ra, axis_b)
        mu = g.op("Div", g.op("ReduceSum", g.op("Mul", Ra, V), axis_b), mass)
        dev = g.op("Sub", V, mu)
        var = g.op("Add", g.op("Div", g.op("ReduceSum", g.op("Mul", Ra, g.op("Mul", dev, dev)),
                                           axis_b), mass), g.const(1e-6))
        cost = g.op("ReduceSum", g.op("Mul", g.op("Add", "beta_v", g.op("Mul", g.const(0.5),
                                                                         g.op("Log", var))), mass), axes_ij)
        a = g.op("Sigmoid", g.op("Mul", g.const(INV_T), g.op("Sub", "beta_a", cost)))
        if it == ITERS - 1:
            g.op("Reshape", mu, g.const([BATCH, OUT, OUT, 4, 4, C], np.int64), out="mu")
            g.op("Reshape", a, g.const([BATCH, OUT, OUT, C], np.int64), out="a")
            break
        dev2 = g.op("Sub", V, mu)
        sq = g.op("Mul", dev2, dev2)
        lp = g.op("Sub", g.op("Neg", g.op("Div", sq, g.op("Mul", g.const(2.0), var))),
                  g.op("Mul", g.const(0.5), g.op("Log", g.op("Mul", g.const(2 * math.pi), var))))
        logit = g.op("Add", g.op("Log", a), g.op("ReduceSum", lp, axes_ij, keepdims=1))
        e = g.op("Exp", g.op("Sub", logit, g.op("ReduceMax", logit, axes=[4])))
        R = g.op("Div", e, g.op("ReduceSum", e, g.const([4], np.int64)))
    return _model(g.nodes, g.inits, "em_routing_framework")


def build_mlpack(out_dir: str, feeds: dict, budget=None, targets=None):
    """The custom-op model built (this host's best cpu target unless ``targets``), its test
    vector ``feeds`` (random ones would make the activations negative and the outputs NaN):
    (container, the build report)."""
    from mlpack.packager.build import build
    from mlpack.runtime import detect_host

    path = os.path.join(out_dir, "em_routing.onnx")
    onnx.save(custom_model(), path)
    out = os.path.join(out_dir, "em_routing.mlpack")
    host = detect_host()
    target = f"x86_64-v{host.x86_level}" if host.x86_level and host.x86_level >= 2 else "aarch64"
    report = build(path, out, targets=targets or [target], inputs=feeds,
                   ops=[os.path.join(CAPS, "capsules.py")], cache=False, memory_budget=budget)
    return out, report


def rel_error(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def main(argv=None) -> int:
    from mlpack.packager.bench import load_mlpack, ort_session, peak_rss, time_alternating

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--memory-budget", default=None)
    args = ap.parse_args(argv)
    feeds = inputs()
    want = reference(feeds)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}")
    with tempfile.TemporaryDirectory(prefix="caps-routing-") as tmp:
        path, report = build_mlpack(tmp, feeds, args.memory_budget)
        print(f"mlpack build (this host's cpu target, no cache): "
              + ", ".join(f"{k} {v:.1f} s" for k, v in report.timings.items()))
        models = {"best": best_model(), "framework": framework_model()}
        files = {}
        for name, m in models.items():
            files[name] = os.path.join(tmp, f"{name}.onnx")
            onnx.save(m, files[name])
        for threads in [int(t) for t in args.threads.split(",")]:
            mod = load_mlpack(path, threads)
            best = ort_session(files["best"], threads)
            fw = ort_session(files["framework"], threads)
            fns = {"mlpack": lambda: mod.run(feeds),
                   "ort_best": lambda: best.run(None, feeds),
                   "ort_framework": lambda: fw.run(None, feeds)}
            t, res = time_alternating(fns, repeat=args.repeat, min_seconds=2.0, max_seconds=60.0)
            errs = {}
            for name, r in res.items():
                got = r if isinstance(r, dict) else dict(zip(("mu", "a"), r))
                errs[name] = max(rel_error(got["mu"], want["mu"]), rel_error(got["a"], want["a"]))
            ms = {n: 1e3 * v.median_s for n, v in t.items()}
            fast = {n: 1e3 * v.min_s for n, v in t.items()}
            print(f"{threads} thread(s): mlpack {ms['mlpack']:.1f} ms ({mod.artifact.target}), "
                  f"ORT best {ms['ort_best']:.1f} ms ({ms['ort_best'] / ms['mlpack']:.1f}x), "
                  f"ORT framework {ms['ort_framework']:.1f} ms "
                  f"({ms['ort_framework'] / ms['mlpack']:.1f}x); fastest runs: mlpack "
                  f"{fast['mlpack']:.1f} ms, ORT best {fast['ort_best'] / fast['mlpack']:.1f}x, "
                  f"framework {fast['ort_framework'] / fast['mlpack']:.1f}x; max rel. error vs "
                  "float64: " + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))
            del mod, best, fw
        peaks = {"mlpack": peak_rss("mlpack", path, feeds, 1),
                 "ort_best": peak_rss("ort", files["best"], feeds, 1),
                 "ort_framework": peak_rss("ort", files["framework"], feeds, 1)}
        print("peak RSS at 1 thread (MiB, of which Python, NumPy and the inputs): " + ", ".join(
            f"{n} {p['peak_mib']:.0f} ({p['base_mib']:.0f})" for n, p in peaks.items() if p))
        if all(peaks.values()):
            m, f = peaks["mlpack"], peaks["ort_framework"]
            print(f"ORT framework / mlpack peak: {f['peak_mib'] / m['peak_mib']:.1f}x; above the "
                  f"base: {(f['peak_mib'] - f['base_mib']) / (m['peak_mib'] - m['base_mib']):.1f}x")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
