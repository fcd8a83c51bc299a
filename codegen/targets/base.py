"""What a target is and what it makes: the interface every folder of codegen/targets implements.

A ``Target`` says what it is (name, device, OCI platform, the host features its code needs, the
precisions it builds, whether a build makes it by default) and names the function that turns an
optimized IR graph plus a precision into ``Code``: the code layers of one artifact, its
weights, and the config fields only it knows (a cpu plan, CPU features). The packager wraps
``Code`` into an artifact (config, test vectors, accuracy) the same way for every target.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

# a target's place in a build: made without --target, made only when named, or not made yet
DEFAULT, OPT_IN, PLANNED = "default", "opt-in", "planned"


@dataclass
class Code:
    """One artifact's code, as a target compiled it."""

    layers: list[tuple[str, bytes]]           # (media type, bytes): an ELF, a portable program
    weights: dict[str, Any] = field(default_factory=dict)   # name -> array
    config: dict = field(default_factory=dict)     # config fields of the target: plan, cpu_features
    timings: dict[str, float] = field(default_factory=dict)  # seconds per compile step
    # graph passes of the target whose rounding differs from the direct computation (Winograd):
    # a build whose artifact misses its tolerance compiles it again without them
    inexact_passes: tuple[str, ...] = ()
    # the weights archive is the graph's constants, in its order, then ``weights`` (new names
    # only): every artifact of a precision stores the same one, which the packager writes once
    # (packager/weights.py). False: the archive is ``weights`` alone
    raw_weights: bool = False

    @classmethod
    def beside_graph(cls, layers, weights: dict, extra, graph, config: dict, timings: dict,
                     inexact=()) -> "Code":
        """A target's Code whose archive is the weights as ``graph`` has them, shared with every
        artifact of its precision, and the ``extra`` ones the target made beside them; a
        constant it changed in place (a sub-byte dtype it packs) makes the whole archive its
        own (``weights``)."""
        if any(name in graph.constants for name in extra):
            return cls(layers, weights, config, timings, inexact)
        return cls(layers, {n: weights[n] for n in extra}, config, timings, inexact,
                   raw_weights=True)

    def tensors(self, graph) -> dict[str, Any]:
        """What the artifact's weights archive holds, for the graph it was compiled from."""
        if not self.raw_weights:
            return self.weights
        return {**{c.name: c.data for c in graph.constants.values()}, **self.weights}


@dataclass(frozen=True)
class Target:
    """One compilation target."""

    name: str                       # what --target takes and the config's artifact.target says
    device: str                     # the config's artifact.device: cpu, cuda, portable
    platform: dict | None           # the OCI platform of its manifest (None: runs anywhere)
    summary: str                    # one line for `mlpack build --help`
    status: str = DEFAULT           # DEFAULT, OPT_IN or PLANNED
    precisions: tuple[str, ...] = ("fp32",)
    features: tuple[str, ...] = ()  # host features its code needs (the config's cpu_features)
    compiler: str | None = None     # "module:function" (graph, target name, precision, disabled
                                    # passes) -> Code; imported only when compiling
    parallel: bool = False          # slow enough (LLVM) to compile in a worker process

    @property
    def implemented(self) -> bool:
        return self.status != PLANNED and self.compiler is not None

    def compile(self, graph, precision: str, disabled: frozenset[str] = frozenset()) -> Code:
        module, function = self.compiler.split(":")
        return getattr(importlib.import_module(module), function)(graph, self.name, precision, disabled)
