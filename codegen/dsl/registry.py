"""Custom ONNX ops written in the DSL: the table of them, and loading the modules that fill it.

    dsl.register("capsules.ai", "CapsConv", capsule_conv,
                 inputs={"P": "n x y ci i k", "W": "kx ky ci co k j"},
                 outputs={"V": "n x y co i j"})

A node of that domain and type then imports through ``capsule_conv`` (onnx_bridge.py). The
mapping between ONNX's ordered axes and the function's named dims is stated here, once:
``inputs`` lists the function's parameters in the order of the node's inputs, each with the
names of its axes in ONNX order (the one place an order is written), and ``outputs`` the same
for the node's outputs. An input with more axes than named is lifted over the leading ones
(onnx_bridge.py). Node attributes are passed to parameters of the same name.

``load_ops("my_ops.py")`` or ``load_ops("package.module")`` imports a module whose import
registers ops (``mlpack build --ops``). Each op keeps the source of the module that defines its
function and its sha256 (``provenance``), which the build writes into every artifact's config
(``custom_ops``, spec/SPEC.md) so a container says exactly what code defined its custom ops.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass

from mlpack.codegen.dsl.errors import DimError, DslError


@dataclass
class CustomOp:
    domain: str
    op_type: str
    fn: object
    inputs: dict[str, tuple[str, ...]]    # parameter -> its dims in ONNX axis order
    outputs: dict[str, tuple[str, ...]]   # output -> its dims in ONNX axis order
    module: str
    function: str
    source: str                           # the defining module's source ("" if unavailable)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    def provenance(self) -> dict:
        """What a container records of this op (spec/SPEC.md, "Custom ops")."""
        return {"domain": self.domain or "ai.onnx", "op_type": self.op_type,
                "function": f"{self.module}:{self.function}", "language": "mlpack.codegen.dsl",
                "source": self.source, "sha256": self.sha256}


_OPS: dict[tuple[str, str], CustomOp] = {}
_FILES: dict[str, str] = {}   # module name load_ops gave a file -> the file's name, for records


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _layouts(spec: dict, what: str, op_type: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(spec, dict) or not spec:
        raise DslError(f"{op_type}: give {what} as {{name: \"dims in ONNX axis order\"}}")
    out = {}
    for name, dims in spec.items():
        names = tuple(dims.split() if isinstance(dims, str) else dims)
        dup = [d for d in names if names.count(d) > 1]
        if dup:
            raise DimError(f"{op_type}: {what[:-1]} {name} names dim {dup[0]} twice")
        out[name] = names
    return out


def _source(fn) -> str:
    """The source of the module defining ``fn`` (so its helpers are kept too), else of ``fn``."""
    for obj in (inspect.getmodule(fn), fn):
        try:
            return inspect.getsource(obj) if obj is not None else ""
        except (OSError, TypeError):
            continue
    return ""


def register(domain: str, op_type: str, fn=None, *, inputs: dict, outputs: dict):
    """Make ``fn`` the importer of ONNX nodes ``op_type`` of ``domain`` (also a decorator:
    ``@dsl.register("my.domain", "Op", inputs=..., outputs=...)``). Registering the same
    (domain, op_type) again replaces it."""
    if fn is None:
        return lambda f: register(domain, op_type, f, inputs=inputs, outputs=outputs)
    if not callable(fn):
        raise DslError(f"{op_type}: the implementation must be a function")
    ins, outs = _layouts(inputs, "inputs", op_type), _layouts(outputs, "outputs", op_type)
    params = inspect.signature(fn).parameters
    for p in ins:
        if p not in params:
            raise DslError(f"{op_type}: input {p} is not a parameter of {fn.__name__}")
    _OPS[(_domain(domain), op_type)] = CustomOp(
        _domain(domain), op_type, fn, ins, outs,
        _FILES.get(getattr(fn, "__module__", ""), getattr(fn, "__module__", "?")),
        getattr(fn, "__qualname__", getattr(fn, "__name__", "?")), _source(fn))
    return fn


def registered(domain: str, op_type: str) -> CustomOp | None:
    """The custom op registered for (domain, op_type), or None."""
    return _OPS.get((_domain(domain), op_type))


def any_registered() -> bool:
    """Whether some custom op is registered (a model of a domain may then import otherwise)."""
    return bool(_OPS)


def unregister(domain: str, op_type: str) -> None:
    _OPS.pop((_domain(domain), op_type), None)


def load_ops(spec: str) -> str:
    """Import the module ``spec`` names (a ``.py`` file or a dotted module name), whose import
    registers custom ops; returns its module name. A DslError names what cannot be loaded."""
    spec = os.fspath(spec)
    if spec.endswith(".py") or os.sep in spec:
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise DslError(f"--ops {spec}: no such file")
        name = "mlpack_ops_" + hashlib.sha256(path.encode()).hexdigest()[:12]
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module   # so inspect finds the source of its functions
        _FILES[name] = os.path.basename(path)
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[name]
            raise DslError(f"--ops {spec}: importing it failed ({type(e).__name__}: {e})") from e
        return name
    try:
        importlib.import_module(spec)
    except ImportError as e:
        raise DslError(f"--ops {spec}: no module of that name ({e})") from None
    except Exception as e:
        raise DslError(f"--ops {spec}: importing it failed ({type(e).__name__}: {e})") from e
    return spec


def used_by(model) -> list[CustomOp]:
    """The registered custom ops the nodes of an ONNX ModelProto use (its local functions'
    nodes and its subgraphs' included), once each, in order of first use."""
    from mlpack.codegen.onnx.checks import subgraphs
    from mlpack.codegen.onnx.registry import lookup

    found: dict[tuple[str, str], CustomOp] = {}

    def walk(nodes):
        for n in nodes:
            c = registered(n.domain, n.op_type)
            if c is not None and lookup(n.domain, n.op_type) is None:  # a built-in importer wins
                found.setdefault((c.domain, c.op_type), c)
            for a in n.attribute:
                for g in subgraphs(a):
                    walk(g.node)

    walk(model.graph.node)
    for f in model.functions:
        walk(f.node)
    return list(found.values())
