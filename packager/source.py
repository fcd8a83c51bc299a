"""The ONNX model a build reads: a file's bytes read and hashed once, the ModelProto parsed only
when something needs it.

A rebuild of an unchanged model file finds its compiled graph and test vectors in the kernel
cache (packager/cache.py) under the file's digest, and then never parses it: for GPT-2's 474 MB
that was 0.6 s of parsing and 0.55 s of hashing the parsed message again, most of a warm
rebuild's 3 s. The digest covers the file's bytes only, so a model whose tensors live in
external data files is keyed by its parsed message instead (``model_key``: the data
included), and so is one given as bytes or as a ModelProto.
"""

from __future__ import annotations

import hashlib
import os

from mlpack.packager.cache import graph_key_head, model_key


def file_key(data: bytes, budget: int | None) -> str:
    """The key of a model file's compiled graph: its bytes whole, the memory budget the
    ``recompute`` pass had, the code and the passes left out (as ``model_key``'s)."""
    h = hashlib.sha256(f"file {graph_key_head(budget)}".encode())
    h.update(data)
    return h.hexdigest()


class ModelSource:
    """``model`` (a path, bytes or a ModelProto) as a build reads it. ``keyed``: whether the
    kernel cache is in use (a file is then read and hashed at once); ``proto()`` parses it on
    first use, as ``load_model`` does (its external data loaded from the file's folder)."""

    def __init__(self, model, budget: int | None, keyed: bool):
        self.model, self.budget = model, budget
        self.path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
        self._proto = None   # (a ModelProto given is checked by load_model too)
        self._data = None
        self._light = False    # whether the parsed message's weights were dropped
        self.file_key = None   # the file's digest (``file_key``), where one keys it
        self.external = False  # whether some tensor's data is in another file
        if keyed and self.path is not None and os.path.isfile(self.path):
            with open(self.path, "rb") as f:
                self._data = f.read()
            self.file_key = file_key(self._data, budget)

    def proto(self):
        """The ModelProto (a clear ModelError if the model is malformed: load_model)."""
        from mlpack.codegen.onnx.importer import load_file_bytes, load_model

        if self._proto is None:
            if self._data is not None:
                self._proto, self.external = load_file_bytes(self.path, self._data)
                self._data = None
            else:
                self._proto = load_model(self.model)
        return self._proto

    def drop_weights(self):
        """The parsed model without its initializers' data, from here on, where it is a file's
        (ONNX Runtime reads the file; the graph has the weights): each initializer keeps its
        name, type and shape (its names are what ONNX Runtime's feeds leave out). The message is parsed anew from what is left, since the protobuf
        runtime (upb) frees a message's memory only with the whole message: clearing fields
        freed nothing, and GPT-2's 500 MB stayed held to the end of its build."""
        proto = self._proto   # (None: not parsed, nothing to drop)
        if proto is None or self.path is None or self._light:
            return proto
        for t in proto.graph.initializer:
            for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                      "uint64_data", "string_data"):
                t.ClearField(f)
        self._proto = type(proto).FromString(proto.SerializeToString())
        self._light = True
        return self._proto

    def release(self) -> None:
        """Drop the file's bytes (its graph was found: a later ``proto()`` reads the file)."""
        self._data = None

    def parsed(self) -> bool:
        return self._proto is not None

    def key(self) -> str:
        """The key of the model's compiled graph (and its vectors): the file's digest, or the
        parsed message's where it has external data or is no file."""
        proto = self.proto()
        if self.file_key is not None and not self.external:
            return self.file_key
        return model_key(proto, self.budget)
