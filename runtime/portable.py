"""The portable executor: runs an artifact's portable program on the NumPy reference interpreter.

The program (spec/ir/program.py) and its weights layer are read into memory once, each checked
against its digest as it is read (``Container.read_verified``): the bytes that run are the bytes
that were hashed, even if the file is rewritten while it is open. The graph is verified before it
is accepted, so a malformed program fails at ``load``, not in the middle of ``run``.

The executor speaks the program's own layouts; model.py maps the signature's ONNX axis order to
them (``input_perm``/``output_perm`` here say how).
"""

from __future__ import annotations

import numpy as np

from mlpack.spec import media
from mlpack.spec.container import Artifact, Container
from mlpack.spec.errors import FormatError
from mlpack.spec.ir import run_graph, verify
from mlpack.spec.ir.program import decode_program
from mlpack.spec.tensorfile import read_tensors


def _perm(sig_dims: list[str], layout: tuple[str, ...]) -> tuple[int, ...] | None:
    """Axis permutation from the signature's order to ``layout``; None when it is the identity.

    The two name dims alike when the packager kept the ONNX names; when they do not (older
    containers), the order is positional.
    """
    if sorted(sig_dims) != sorted(layout) or list(sig_dims) == list(layout):
        return None
    return tuple(sig_dims.index(d) for d in layout)


def _inverse(perm: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return None if perm is None else tuple(int(i) for i in np.argsort(perm))


class PortableExecutor:
    """One artifact's portable program, decoded, verified and ready to ``run``."""

    def __init__(self, container: Container, artifact: Artifact):
        where = f"{container.path}: artifact {artifact.index}"
        code = artifact.layer(media.PROGRAM_PORTABLE)
        if code is None:
            raise FormatError(f"{where} has no portable program layer ({media.PROGRAM_PORTABLE})")
        # the program and its constants are this executor's own copies, hashed as read: what
        # runs is what was verified, whatever happens to the file meanwhile
        weights = artifact.layer(media.WEIGHTS)
        tensors = read_tensors(container.read_verified(weights.digest, f"{where} weights")) \
            if weights else {}
        try:
            self.graph = decode_program(container.read_verified(code.digest, f"{where} code"),
                                        tensors)
        except FormatError as e:
            raise FormatError(f"{where}: {e}") from None
        verify(self.graph)
        self._in_perm, self._out_perm = self._perms(artifact.config["model"])

    def _perms(self, model: dict) -> tuple[dict, dict]:
        """Per input and output: the permutation between signature order and program layout."""
        ports_in = {p.name: p.layout for p in self.graph.inputs}
        ports_out = {p.name: p.layout for p in self.graph.outputs}
        where = "portable program and config disagree"
        for key, ports in (("inputs", ports_in), ("outputs", ports_out)):
            names = [s["name"] for s in model[key]]
            if sorted(names) != sorted(ports):
                raise FormatError(f"{where}: config {key} {names}, program {key} {sorted(ports)}")
        in_perm = {s["name"]: _perm([d["name"] for d in s["dims"]], ports_in[s["name"]])
                   for s in model["inputs"]}
        out_perm = {s["name"]: _inverse(_perm([d["name"] for d in s["dims"]], ports_out[s["name"]]))
                    for s in model["outputs"]}
        return in_perm, out_perm

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs by name, in signature (ONNX) axis order; ``feeds`` are already checked."""
        inputs = {name: a if self._in_perm.get(name) is None else np.transpose(a, self._in_perm[name])
                  for name, a in feeds.items()}
        outputs = run_graph(self.graph, inputs)
        return {name: a if self._out_perm.get(name) is None else
                np.ascontiguousarray(np.transpose(a, self._out_perm[name]))
                for name, a in outputs.items()}

    def close(self) -> None:
        self.graph = None  # drops the constants' views of the map


__all__ = ["PortableExecutor"]
