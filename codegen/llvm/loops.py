"""Loops in LLVM IR: counted loops, their vectorizer and unroller hints, flat-index arithmetic.

A loop whose body is unrolled already gets ``llvm.loop.unroll.disable`` (a distinct,
self-referencing loop id each, ``LoopIds``); an innermost loop the vectorizer should take may
get ``llvm.loop.vectorize.enable`` (``FORCE_VECTORIZE``, off). Loop ids are written as
placeholder strings first, since llvmlite cannot make a self-referencing node, and
``LoopIds.finalize`` rewrites the module's text.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

from llvmlite import ir

I64 = ir.IntType(64)


class Loops:
    """Counted loops with optional vectorizer metadata on the latch branch."""

    def __init__(self, b: ir.IRBuilder, module: ir.Module, unroll: bool = True):
        self.b = b
        self.module = module
        self.latches: list[ir.Instruction] = []
        self.unroll = unroll   # the default of ``loop``'s ``unroll``

    @contextmanager
    def loop(self, start, end, name: str, vectorize: bool = False, unroll: bool | None = None,
             interleave: int = 0, predicate: bool = False):
        """``unroll=False`` tells LLVM not to unroll the loop (a micro-kernel's K loop, whose
        body is unrolled already: unrolling it further only costs compile time), a vectorized
        one's too; None: the default the Loops was made with. ``interleave``: the vectorized
        loop keeps that many vectors in flight (a reduction's accumulators: their chains
        overlap). ``predicate``: vectorized with its tail folded into masked loads and stores
        instead of a scalar remainder (a trip count below a vector: a depthwise tile's last
        lanes, depthwise.MASKED_LANES); LLVM keeps the remainder where it cannot mask."""
        never = unroll is False
        unroll = self.unroll if unroll is None else unroll
        latch: list = []
        with self._counted(start, end, name, [], latch) as (i, _):
            yield i
        br = latch[0]
        if vectorize and predicate:
            _hint(self.module, br, [("llvm.loop.vectorize.enable", 1),
                                    ("llvm.loop.vectorize.predicate.enable", 1)])
        elif vectorize and interleave:
            _hint(self.module, br, [("llvm.loop.interleave.count", interleave)]
                  + ([] if unroll else [("llvm.loop.unroll.disable", None)]))
        elif vectorize and not never:
            self.latches.append(br)
        elif not unroll:
            _disable_unroll(self.module, br)

    @contextmanager
    def carrying(self, start, end, name: str, carried: list[tuple]):
        """``loop(start, end, name, unroll=False)`` with values carried beside its counter:
        each of ``carried`` an (initial, step) pair of i64, a phi that starts at the initial
        value and adds the step each iteration. Yields (counter, [carried values]).

        A micro-kernel's K loop walks its A rows and B panels this way: written as offsets
        of the counter times a stride, LLVM's loop strength reduction kept the counter and
        a countdown beside the offsets, and with a tile's row and panel pointers that was
        more registers than x86-64 has (accumulators spilled)."""
        latch: list = []
        with self._counted(start, end, name, carried, latch) as got:
            yield got
        _disable_unroll(self.module, latch[0])

    @contextmanager
    def _counted(self, start, end, name: str, carried: list[tuple], latch: list):
        """for (i = start; i < end; i++) with ``carried`` phis (``carrying``); the back
        branch is appended to ``latch``, for its loop hints."""
        b = self.b
        pre = b.block
        fn = pre.function
        header = fn.append_basic_block(f"{name}.head")
        body = fn.append_basic_block(f"{name}.body")
        exit_ = fn.append_basic_block(f"{name}.exit")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64, name=name)
        i.add_incoming(start, pre)
        values = []
        for k, (initial, _) in enumerate(carried):
            v = b.phi(I64, name=f"{name}.{k}")
            v.add_incoming(initial, pre)
            values.append(v)
        b.cbranch(b.icmp_signed("<", i, end), body, exit_)
        b.position_at_end(body)
        yield i, values
        i.add_incoming(b.add(i, ir.Constant(I64, 1), flags=("nsw",)), b.block)
        for v, (_, step) in zip(values, carried):
            v.add_incoming(b.add(v, step, flags=("nsw",)), b.block)
        latch.append(b.branch(header))
        b.position_at_end(exit_)


# Whether a vectorize=True loop is marked llvm.loop.vectorize.enable (vectorized whatever the
# cost model says). Off: until issue 20 ``finalize`` missed every loop id (llvmlite prints
# "!{ !..."), so LLVM never saw a hint; made effective, this one measured 1-4% slower on
# mobilenet_v3_small (x86_64-v4), so the cost model decides, as it always did. The unroll hints
# are in effect now (a micro-kernel's K loop, every loop of a gemm kernel: lower.py).
FORCE_VECTORIZE = False
_NO_UNROLL = [0]   # numbers the no-unroll loop ids; only their uniqueness matters


def _disable_unroll(m: ir.Module, br) -> None:
    _hint(m, br, [("llvm.loop.unroll.disable", None)])


def _hint(m: ir.Module, br, hints: list[tuple[str, int | None]]) -> None:
    """A loop id of its own for the latch ``br``, with ``hints`` (name, i32 value or None)."""
    _NO_UNROLL[0] += 1
    # "LOOPSELF<n>" placeholders become self-referencing loop ids (LoopIds); these are
    # numbered far from LoopIds' own so the two never meet in one module
    md = m.add_metadata([ir.MetaDataString(m, f"LOOPSELF{10 ** 9 + _NO_UNROLL[0]}"),
                         *(m.add_metadata([ir.MetaDataString(m, h)] + (
                             [] if v is None else [ir.Constant(ir.IntType(32), v)]))
                           for h, v in hints)])
    br.set_metadata("llvm.loop", md)


class LoopIds:
    """Hands out one placeholder loop id per latch; ``finalize`` makes them self-referencing."""

    def __init__(self, module: ir.Module):
        self.module = module
        self.count = 0
        self.enable = module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.enable"),
                                           ir.Constant(ir.IntType(1), 1)])
        self.no_unroll = None   # made on first use: a module without it prints as before

    def __call__(self, latches, unroll: bool = True) -> None:
        """Vectorize the loops of ``latches``; ``unroll=False``: and never unroll them."""
        hints = [self.enable] if FORCE_VECTORIZE else []
        if not unroll:
            if self.no_unroll is None:
                self.no_unroll = self.module.add_metadata(
                    [ir.MetaDataString(self.module, "llvm.loop.unroll.disable")])
            hints.append(self.no_unroll)
        for br in latches if hints else ():
            md = self.module.add_metadata([ir.MetaDataString(self.module, f"LOOPSELF{self.count}"),
                                           *hints])
            self.count += 1
            br.set_metadata("llvm.loop", md)

    @staticmethod
    def finalize(text: str) -> str:
        # (llvmlite prints "!{ !..." with a space: without it this matched nothing, LLVM found
        # no loop id, and every hint was ignored)
        return re.sub(r'^!(\d+) = !\{ ?!"LOOPSELF\d+"', r"!\1 = distinct !{!\1", text, flags=re.M)


@contextmanager
def strided(b: ir.IRBuilder, start, end, step, name: str):
    """``for (i = start; i < end; i += step)`` (i64), yielding i: a loop whose start and step are
    values (a thread's first element and the grid's thread count, say)."""
    pre = b.block
    fn = pre.function
    head, body, exit_ = (fn.append_basic_block(f"{name}.{s}") for s in ("head", "body", "exit"))
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", i, end), body, exit_)
    b.position_at_end(body)
    yield i
    i.add_incoming(b.add(i, step), b.block)
    b.branch(head)
    b.position_at_end(exit_)


def delinearize(b: ir.IRBuilder, flat, dims: list[str], sizes: dict) -> dict:
    """The index of each of ``dims`` (the last fastest) in the flat index ``flat``."""
    out = {}
    for d in reversed(dims):
        if d == dims[0]:
            out[d] = flat
            break
        out[d] = b.urem(flat, sizes[d])
        flat = b.udiv(flat, sizes[d])
    return out
