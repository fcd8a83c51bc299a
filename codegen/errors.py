"""Errors raised by the compiler: bad models, unsupported ops, malformed IR."""

from mlpack.spec.errors import (Error, InterpError, IRParseError,  # noqa: F401 (raised by the IR)
                                VerifyError)


class ModelError(Error):
    """The ONNX model is malformed, truncated or inconsistent (names the file, node or value)."""


class UnsupportedOpError(Error):
    """An op, attribute value or dtype mlpack cannot import yet.

    Carries the op type, its domain and opset, the node name and what exactly is missing.
    """

    def __init__(self, op_type: str | None, domain: str = "", opset: int | None = None,
                 node: str = "", detail: str = ""):
        self.op_type, self.domain, self.opset, self.node, self.detail = op_type, domain, opset, node, detail
        if op_type is None:  # not about one op: an input's or initializer's element type
            super().__init__(f"unsupported: {detail}")
            return
        where = f"node {node!r}" if node else "an unnamed node"
        dom = domain or "ai.onnx"
        version = f" opset {opset}" if opset is not None else ""
        msg = f"unsupported op {op_type} (domain {dom},{version}) at {where}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class ShapeError(Error):
    """Shapes do not agree (names the node, input and dimension)."""



class UnsupportedTargetError(Error):
    """A target cannot compile this graph (names the target and the op or dtype at fault); the
    packager skips that target for the model and says why."""
