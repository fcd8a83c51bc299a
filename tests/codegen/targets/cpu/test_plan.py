"""plan.py's arena: tensors live at the same time never share bytes, and constant sizes are
packed by what is live (greedy by size), never into a larger arena than the slots give."""

from __future__ import annotations

import os
import sys

import pytest

from mlpack.codegen.targets.cpu import plan
from mlpack.codegen.targets.cpu.compile import schedule_kernels
from mlpack.codegen.targets.cpu.target import get_target
from mlpack.spec.ir import parse_graph

HERE = os.path.dirname(os.path.abspath(__file__))


def capsule_routing():
    """examples/capsules' EM routing (3 iterations), small: its logits and assignments are its
    big tensors, two of them live at a time, with small ones (means, variances) between."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "dsl"))
    from dsl_support import em_routing_graph
    return em_routing_graph(16)


# a softmax-like chain: big rows with small statistics between them
CHAIN = '''graph "chain" {
  in %x: f32{r=64, c=512} (r, c)
  %m: f32{r=64} = max{k=512} %x[r=r, c=k]
  %e: f32{r=64, c=512} = exp(%x[r=r, c=c] - %m[r=r])
  %s: f32{r=64} = sum{k=512} %e[r=r, c=k]
  %t: f32{r=64} = max{k=512} %e[r=r, c=k]
  %p: f32{r=64, c=512} = div(%e[r=r, c=c], %s[r=r]) + %t[r=r]
  %u: f32{r=64} = sum{k=512} %p[r=r, c=k] * %x[r=r, c=k]
  %q: f32{r=64, c=512} = exp(%p[r=r, c=c] * %u[r=r] - %m[r=r])
  out %q (r, c)
}'''


def _arena(g, monkeypatch=None, slots_only=False):
    graph, kernels, bufs, aliases, _ = schedule_kernels(g, get_target("x86_64-v2"))
    if slots_only:
        monkeypatch.setattr(plan, "_pack_by_size", lambda *a: ({}, 1 << 62))
    p, _, _ = plan.make_plan(graph, kernels, bufs, [o.name for o in graph.outputs], aliases)
    return p, kernels


def _spans(p, kernels):
    """(offset, end, first dispatch, last dispatch) of every arena buffer."""
    out = {}
    for i, d in enumerate(p["dispatches"]):
        for b in d["bindings"]:
            e = p["buffers"][b]
            if e["kind"] == "arena":
                lo, hi = out.get(b, (None, None, i, i))[2:]
                out[b] = (e["offset"], e["offset"] + e["size"], min(lo, i), max(hi, i))
    return list(out.values())


@pytest.mark.parametrize("source", ["capsule", "chain"])
def test_live_tensors_never_share_bytes_and_the_arena_shrinks(source, monkeypatch):
    g = capsule_routing() if source == "capsule" else parse_graph(CHAIN)
    p, kernels = _arena(g)
    spans = _spans(p, kernels)
    for a in spans:
        for b in spans:
            if a is not b and a[2] <= b[3] and b[2] <= a[3]:   # live at one dispatch
                assert a[1] <= b[0] or b[1] <= a[0], (a, b)
    assert p["arena_size"] >= max((s[1] for s in spans), default=0)
    with monkeypatch.context() as m:
        old, _ = _arena(g, m, slots_only=True)
    assert p["arena_size"] <= old["arena_size"]
    if source == "capsule":   # the slots kept a third big slot: 460,800 bytes, packed 313,344
        assert p["arena_size"] < 0.75 * old["arena_size"]
