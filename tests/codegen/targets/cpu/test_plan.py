"""plan.py's arena: tensors live at the same time never share bytes, and constant sizes are
packed by what is live (greedy by size), never into a larger arena than the slots give; sizes
that scale with a dynamic batch are packed the same way, at every batch."""

from __future__ import annotations

import os
import sys

import pytest

from mlpack.codegen.targets.cpu import plan
from mlpack.codegen.targets.cpu.compile import schedule_kernels
from mlpack.codegen.targets.cpu.target import get_target
from mlpack.spec.ir import parse_graph

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from plan_runner import eval_expr  # noqa: E402  (tests/codegen/targets/plan_runner.py)


def capsule_routing():
    """examples/capsules' EM routing (3 iterations), small: its logits and assignments are its
    big tensors, two of them live at a time, with small ones (means, variances) between."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "dsl"))
    from dsl_support import em_routing_graph
    return em_routing_graph(16, tiles=False)


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


def _spans(p, kernels, syms=None):
    """(offset, end, first dispatch, last dispatch) of every arena buffer (at the symbols'
    values ``syms``)."""
    out = {}
    for i, d in enumerate(p["dispatches"]):
        for b in d["bindings"]:
            e = p["buffers"][b]
            if e["kind"] == "arena":
                lo, hi = out.get(b, (None, None, i, i))[2:]
                at = eval_expr(e["offset"], syms or {})
                out[b] = (at, at + eval_expr(e["size"], syms or {}), min(lo, i), max(hi, i))
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
    if source == "capsule":
        # packed, the arena is what is live at the busiest dispatch (no lower bound is lower;
        # 304,128 bytes), which the slots (314,368) miss
        busiest = max(sum(s[1] - s[0] for s in spans if s[2] <= i <= s[3])
                      for i in range(len(p["dispatches"])))
        assert p["arena_size"] == busiest < old["arena_size"]


# layers of distinct widths, as an image's channels change along a CNN, over a dynamic batch
WIDTHS = '''graph "widths" {
  in %x: f32{r=$batch, c=512} (r, c)
  %a: f32{r=$batch, c=384} = sum{k=512} %x[r=r, c=k] * %x[r=r, c=(k + c) % 512]
  %b: f32{r=$batch, c=256} = exp(%a[r=r, c=c] - %a[r=r, c=c + 128])
  %m: f32{r=$batch} = max{k=256} %b[r=r, c=k]
  %d: f32{r=$batch, c=640} = %b[r=r, c=c % 256] * %m[r=r] + %x[r=r, c=c % 512]
  %e: f32{r=$batch, c=320} = %d[r=r, c=2 * c] + %d[r=r, c=2 * c + 1]
  %f: f32{r=$batch, c=512} = exp(%e[r=r, c=c % 320])
  out %f (r, c)
}'''


def test_a_dynamic_batch_is_packed_as_a_batch_of_one_and_scales(monkeypatch):
    """Tensors that are each a multiple of $batch are packed at a batch of one and placed at
    that offset times the batch: no two live at once share bytes at any batch. Before, each
    tensor of a distinct size had a slot of its own, and the arena was the sum of them all."""
    g = parse_graph(WIDTHS)
    p, kernels = _arena(g)
    with monkeypatch.context() as m:
        m.setattr(plan, "_scaled", lambda *a: {})
        slots, _ = _arena(g)
    for batch in (1, 3, 64):
        spans = _spans(p, kernels, {"batch": batch})
        for a in spans:
            assert a[0] % plan.ARENA_ALIGN == 0
            for b in spans:
                if a is not b and a[2] <= b[3] and b[2] <= a[3]:
                    assert a[1] <= b[0] or b[1] <= a[0], (batch, a, b)
        size = eval_expr(p["arena_size"], {"batch": batch})
        assert size >= max(s[1] for s in spans)
        assert size <= 0.8 * eval_expr(slots["arena_size"], {"batch": batch})
