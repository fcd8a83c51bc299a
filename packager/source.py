"""The ONNX model a build reads: a file hashed once, parsed only when something needs it, and
then without its weights, which are views of the mapped file (codegen/onnx/mapped.py).

A rebuild of an unchanged model file finds its compiled graph and test vectors in the kernel
cache (packager/cache.py) under the file's digest, and then never parses it: for GPT-2's 474 MB
that was 0.6 s of parsing and 0.55 s of hashing the parsed message again, most of a warm
rebuild's 3 s. The digest covers the file's bytes only, so a model whose tensors live in
external data files is keyed by its parsed message instead (``model_key``: the data
included), and so is one given as bytes or as a ModelProto. The file is hashed as it is read
in chunks, and parsed from its mapping less the weights' bytes: a build holds no copy of a
file's weights of its own until it writes the weights archive (GPT-2's build held three).
"""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import os

from mlpack.packager.cache import graph_key_head, model_key

CHUNK = 1 << 20   # bytes read at a time to hash a model file


def file_key(data, budget: int | None) -> str:
    """The key of a model file's compiled graph: its bytes whole (``data``: the bytes, or the
    file open for reading, read to its end), the memory budget the ``recompute`` pass had, the
    code and the passes left out (as ``model_key``'s)."""
    h = hashlib.sha256(f"file {graph_key_head(budget)}".encode())
    if hasattr(data, "readinto"):
        buf = bytearray(CHUNK)
        while n := data.readinto(buf):
            h.update(memoryview(buf)[:n])
    else:
        h.update(data)
    return h.hexdigest()


def _mapped(path: str):
    """The file's bytes, mapped read-only (an empty file: no bytes; mmap refuses it)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class ModelSource:
    """``model`` (a path, bytes or a ModelProto) as a build reads it. ``keyed``: whether the
    kernel cache is in use (a file is then hashed at once); ``importable()`` parses it on first
    use, as ``load_model`` does (its external data loaded from the file's folder), a file as a
    ``MappedModel``; ``proto()`` is its message (a file's without the weights' bytes)."""

    def __init__(self, model, budget: int | None, keyed: bool):
        self.model, self.budget = model, budget
        self.path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
        self._model = None   # (a ModelProto given is checked by load_model too)
        self._light = None   # a file's MappedModel without its weights, once let go
        self.file_key = None   # the file's digest (``file_key``), where one keys it
        self.external = False  # whether some tensor's data is in another file
        if keyed and self.path is not None and os.path.isfile(self.path):
            with open(self.path, "rb") as f:
                self.file_key = file_key(f, budget)

    def importable(self):
        """What ``import_model`` takes: a file's ``MappedModel`` (or its whole message, where it
        has external data), else the ModelProto; a clear ModelError if it is malformed."""
        from mlpack.codegen.errors import ModelError
        from mlpack.codegen.onnx.importer import load_file_bytes, load_model

        if self._model is None and self._light is not None:   # (released: mapped again)
            try:
                weights = self._light.split.views(_mapped(self.path))
            except (OSError, ValueError):
                raise ModelError(f"{self.path}: the file changed while mlpack was building "
                                 "it") from None
            self._model = dataclasses.replace(self._light, weights=weights)
        if self._model is None:
            if self.path is not None and os.path.isfile(self.path):
                self._model, self.external = load_file_bytes(self.path, _mapped(self.path))
            else:
                self._model = load_model(self.model)
        return self._model

    def proto(self):
        """The ModelProto (a file's without its weights' bytes, which the graph maps)."""
        from mlpack.codegen.onnx.mapped import MappedModel

        if self._model is None and self._light is not None:
            return self._light.proto
        m = self.importable()
        return m.proto if isinstance(m, MappedModel) else m

    def release(self) -> None:
        """Let go of a file's mapped weights (the pages a build read stay resident while they
        are mapped: GPT-2's 500 MB beside each validated artifact); the message stays, and a
        later ``importable()`` maps the file again."""
        from mlpack.codegen.onnx.mapped import MappedModel

        if isinstance(self._model, MappedModel):
            self._light = dataclasses.replace(self._model, weights={})
            self._model = None

    def key(self) -> str:
        """The key of the model's compiled graph (and its vectors): the file's digest, or the
        parsed message's where it has external data or is no file."""
        proto = self.proto()
        if self.file_key is not None and not self.external:
            return self.file_key
        return model_key(proto, self.budget)
