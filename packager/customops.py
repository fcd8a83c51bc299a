"""What ``mlpack build`` does differently for a model with custom ops written in the DSL.

A node of a user's domain imports through the DSL function registered for it
(codegen/dsl/registry.py; ``--ops`` names the modules that register them, loaded first). Three
things follow for the build:

* **the baseline**: ONNX Runtime cannot run such a node without a hand-written C++ kernel, so
  the fp32 outputs whose own error sets the tolerance (spec/accuracy.py) are the NumPy
  interpreter's on the graph as written in fp32, named ``mlpack interpreter fp32 (custom ops:
  ...)`` in the vectors and the configs. The float64 reference is what it always is; the DSL
  function is the op's one definition, so there is no second engine to compare it with;
* **provenance**: every artifact's config gets ``custom_ops``, one record per op the model
  uses: domain, op type, the function, the source of the module that defines it and its
  sha256 (spec/SPEC.md, "Custom ops"), so a container says exactly what code its ops are;
* nothing else: the ops are ordinary IR, compiled for every target and precision.
"""

from __future__ import annotations

import functools

from mlpack.packager import testvectors as tv


def load(ops) -> None:
    """Import each module ``ops`` names (a .py path or a dotted name): they register ops."""
    from mlpack.codegen.dsl.registry import load_ops

    for spec in ops or ():
        load_ops(spec)


def used(proto) -> list:
    """The registered DSL ops the model's nodes use."""
    from mlpack.codegen.dsl.registry import used_by

    return used_by(proto)


def registered() -> bool:
    """Whether any DSL op is registered (then a model's nodes may import through one, and its
    compiled graph is not looked up by its file's digest alone: packager/build.py)."""
    from mlpack.codegen.dsl.registry import any_registered

    return any_registered()


def baseline_name(custom) -> str:
    if not custom:
        return tv.reference_name()
    names = ", ".join(f"{c.domain} {c.op_type}" for c in custom)
    return f"mlpack interpreter fp32 (custom ops: {names})"


def baseline_outputs(proto, names: list[str], feeds: list[dict], custom, path=None,
                     graph=None, threads: int = 0) -> list[dict]:
    """The baseline's outputs ``names`` per case: ONNX Runtime's (on the file ``path``, when
    the model is one, on ``threads`` intra-op threads: tv.reference_outputs), or with custom
    ops the fp32 interpreter's on ``graph``, the model as imported."""
    if not custom:
        return tv.reference_outputs(proto, feeds, names, path, threads)
    from mlpack.spec.ir.interp import run_graph

    return [run_graph(graph, case) for case in feeds]


def recording(custom, lower):
    """``lower`` (a function returning ArtifactSpecs) with each config's ``custom_ops`` set."""
    if not custom:
        return lower
    records = [c.provenance() for c in custom]

    @functools.wraps(lower)
    def lowered(*args, **kwargs):
        artifacts = lower(*args, **kwargs)
        for a in artifacts:
            a.config["custom_ops"] = records
        return artifacts

    return lowered
