"""bf16 products: the bf16 artifacts of x86_64-v4-bf16 (AVX512_BF16's ``vdpbf16ps``) and
aarch64-bf16 (FEAT_BF16's ``BFDOT``).

``vdpbf16ps acc, a, b`` adds to each of 16 f32 lanes the products of two bf16 pairs (BFDOT the
same on 4 lanes), so a GEMM whose A and B are both bf16 does two K steps per instruction, half
the fp32 micro-kernel's (accumulation stays f32). The bf16 precision already stores the weights (B) in bf16
(codegen/precisions/weights16.py); this target pass, ``round_activations``, rounds the other
operand too: each contraction of an f32 tensor with bf16 weights reads a bf16 copy of the tensor
(one map kernel writes it; contractions reading the same tensor share it). The rounding of the
activations is the difference from the weights-only bf16 artifacts, so the pass is inexact: a
build whose artifact misses bf16's tolerance compiles it again without it
(packager/build.py). The micro-kernel (microkernel.py) pairs K along the dim A reads at unit
stride (contraction.py's ``_pair_dim``); B is packed with each pair of K adjacent per column
(gemm.py's ``pack_pairs``).
"""

from __future__ import annotations

from dataclasses import replace

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType
from mlpack.codegen.targets.cpu.indexing import affine
from mlpack.codegen.targets.cpu.kernels import fresh_name
from mlpack.codegen.targets.cpu.plan import tensor_buffers


def _weight(e: Expr, g: Graph) -> bool:
    """``e`` reads bf16 weights widened to f32 (weights16.py's ``cast<f32>(W[...])``)."""
    return (e.op == "cast" and e.dtype == "f32" and e.args[0].op == "read"
            and e.args[0].dtype == "bf16" and e.args[0].arg[0] in g.constants)


def _activation(e: Expr, g: Graph) -> bool:
    return e.op == "read" and e.dtype == "f32" and e.arg[0] not in g.constants \
        and e.arg[2] in (None, 0.0)


def pairable(op: Comprehension, x: Expr, layout) -> bool:
    """Whether the micro-kernel can pair ``op``'s K along a dim that ``x`` (laid out as
    ``layout``) reads at unit stride: a reduction var of even constant extent that indexes x's
    innermost dim with coefficient 1 and no other dim (contraction.py's _pair_dim decides on
    the kernel; this keeps the copy from being made where it would not be used)."""
    index = dict(zip(x.arg[1], x.args))
    loop = set(op.type.dims) | set(op.rdims)
    for r, ext in op.rdims.items():
        if not (ext.is_const and ext.value % 2 == 0):
            continue
        hit = affine(index[layout[-1]], loop)
        if hit is None or hit[0].get(r) != 1:
            continue
        if all(r not in ex.free_vars(index[d]) for d in layout[:-1]):
            return True
    return False


def round_activations(g: Graph, parents=None) -> tuple[Graph, int]:
    """``g`` with the f32 operand of every contraction with bf16 weights whose K can be paired
    (``pairable``) read from a bf16 copy, and how many contractions were changed. ``parents``:
    the concatenations' buffers (concat.py), for the layouts of tensors that alias them."""
    bufs = {**tensor_buffers(g), **(parents or {})}
    ops, types = [], dict(g.types)
    copies: dict[str, str] = {}
    count = 0
    taken = set(types) | set(g.constants)
    for op in g.ops:
        body = op.body if isinstance(op, Comprehension) else None
        if (body is None or op.reduce != "sum" or op.type.dtype != "f32" or body.op != "mul"
                or len(body.args) != 2):
            ops.append(op)
            continue
        x, w = body.args
        if _weight(x, g):
            x, w = w, x
        if not (_weight(w, g) and _activation(x, g) and pairable(op, x, bufs[x.arg[0]].layout)):
            ops.append(op)
            continue
        name = x.arg[0]
        if name not in copies:
            copy = fresh_name(f"{name}#bf16", {n: None for n in taken})
            taken.add(copy)
            layout = bufs[name].layout
            dims = {d: types[name].dims[d] for d in layout}
            ops.append(Comprehension(copy, TensorType("bf16", dims),
                                     ex.cast(ex.read(name, {d: ex.var(d) for d in layout}, "f32"),
                                             "bf16")))
            types[copy] = ops[-1].type
            copies[name] = copy
        rounded = Expr("read", x.args, (copies[name], x.arg[1], x.arg[2]), "bf16")
        ops.append(replace(op, body=ex.mul(ex.cast(rounded, "f32"), w)))
        count += 1
    if not count:
        return g, 0
    return replace(g, ops=ops, types=types), count
