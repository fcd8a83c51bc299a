"""The capsule layer end to end: DSL -> IR -> container -> run, checked against NumPy.

    python examples/capsules/build_and_run.py [OUT_DIR]

1. the DSL: capsules.py's ``capsule_conv`` traced into IR (printed) and evaluated on the NumPy
   interpreter, against reference.py's float64 einsum; the EM routing (three iterations, plain
   DSL ops) the same way;
2. the custom op in a model: model.py exports a PyTorch model whose ``torch.library`` op
   becomes an ONNX node of the domain ``capsules.example``; ``build`` with ``ops=[capsules.py]``
   (``mlpack build caps.onnx --ops examples/capsules/capsules.py``) compiles it for the portable
   target and this host's cpu targets, validates every artifact it can run, and keeps the
   op's source in the container;
3. the container loaded by the runtime and run, against PyTorch's own float64 output.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import capsules  # noqa: E402  (registers CapsConv)
import reference  # noqa: E402

import mlpack  # noqa: E402
from mlpack.codegen import dsl  # noqa: E402
from mlpack.spec.ir.interp import run_graph  # noqa: E402


def rel_error(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def dsl_layer(rng) -> None:
    n, size, caps = 2, 9, 8
    P = rng.standard_normal((n, size, size, caps, 4, 4)).astype(np.float32)
    W = (rng.standard_normal((3, 3, caps, caps, 4, 4)) / np.sqrt(9 * caps * 4)).astype(np.float32)
    g = dsl.to_graph(capsules.capsule_conv,
                     inputs={"P": dsl.f32(n="batch", x=size, y=size, ci=caps, i=4, k=4),
                             "W": dsl.f32(kx=3, ky=3, ci=caps, co=caps, k=4, j=4)},
                     outputs="V", layouts={"V": "n x y co i j"})
    print(g)
    err = rel_error(run_graph(g, {"P": P, "W": W})["V"], reference.capsule_conv(P, W))
    print(f"capsule conv (interpreter) vs NumPy float64: max error {err:.1e}")
    A = rng.uniform(0.2, 1.0, (n, size, size, caps)).astype(np.float32)
    bv, ba = (0.1 * rng.standard_normal(caps)).astype(np.float32), np.zeros(caps, np.float32)
    routing = dsl.to_graph(
        lambda P, A, W, beta_v, beta_a: capsules.em_routing(P, A, W, beta_v, beta_a,
                                                            inverse_temperature=0.01),
        inputs={"P": dsl.f32(n=n, x=size, y=size, ci=caps, i=4, k=4),
                "A": dsl.f32(n=n, x=size, y=size, ci=caps),
                "W": dsl.f32(kx=3, ky=3, ci=caps, co=caps, k=4, j=4),
                "beta_v": dsl.f32(co=caps), "beta_a": dsl.f32(co=caps)},
        name="em_routing", layouts={"mu": "n x y co i j", "a": "n x y co"})
    got = run_graph(routing, {"P": P, "A": A, "W": W, "beta_v": bv, "beta_a": ba})
    mu, a = reference.em_routing(P, A, W, bv, ba, inverse_temperature=0.01)
    print(f"EM routing, 3 iterations ({len(routing.ops)} ops): max error of the poses "
          f"{rel_error(got['mu'], mu):.1e}, of the activations {rel_error(got['a'], a):.1e}")


def custom_op_model(out_dir: str, rng) -> int:
    import model
    from mlpack.packager.build import build

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "caps.onnx")
    with open(path, "wb") as f:
        f.write(model.export())
    out = os.path.join(out_dir, "caps.mlpack")
    report = build(path, out, ops=[os.path.join(HERE, "capsules.py")],
                   progress=lambda line: print(f"  {line}"))
    print(f"wrote {out}: {report.size} bytes, baseline {report.reference}")
    for a in report.artifacts:
        state = f"validated, max error {a.max_error:.1e}" if a.validated else a.reason
        print(f"  {a.target} {a.precision}: {state}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # no signature, no trust policy: this is a demo
        m = mlpack.load(out)
    with m:
        P = rng.standard_normal((3, 9, 9, 8, 4, 4)).astype(np.float32)
        V = m(P=P)["V"]
        err = rel_error(V, model.torch_outputs(P))
        print(f"run on {m.artifact.device} {m.artifact.precision}: V{list(V.shape)}, max error "
              f"against PyTorch (float64) {err:.1e}")
        ok = m.validate().ok and err < 1e-4
    from mlpack.spec.container import open_container
    with open_container(out) as c:
        ops = c.artifacts[0].config["custom_ops"]
    print(f"the container keeps the op's source: {ops[0]['domain']} {ops[0]['op_type']} = "
          f"{ops[0]['function']}, sha256 {ops[0]['sha256'][:16]}...")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    rng = np.random.default_rng(0)
    dsl_layer(rng)
    try:
        if argv:
            return custom_op_model(argv[0], rng)
        with tempfile.TemporaryDirectory() as tmp:
            return custom_op_model(tmp, rng)
    except mlpack.Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
