"""cpu gemm kernels (codegen/targets/cpu/contraction.py) against ONNX Runtime.

Convolutions (padding, stride 2, groups, depthwise, 1x1, a dynamic batch), matmuls whose M, N
and K are not multiples of any tile, a batched matmul with a constant right operand, and the
capsule einsum, each compiled for x86_64-v2, v3 and v4 (each one the host runs; v4 needs
AVX-512) and run by the Python plan runner; fp32 rtol 1e-4 / atol 1e-5. Also: the contractions
do take the gemm path, and every target packs weights the same way. Then contractions whose B
is read at run time (attention with symbolic batch and sequence, two-input matmuls, the BERT
block) and the row-vectorized direct kernels of depthwise.py (depthwise, strided, shuffled and
narrow convolutions), on the same three targets.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.codegen.targets.cpu.contraction import even_rows
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from support import (MODELS_DIR, best_host_target, host_lacks, load_models_module,
                     one_output_model, oracle_outputs)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tests/codegen/targets/plan_runner.py
from plan_runner import ATOL, HOST_TARGETS, RTOL, TARGETS, assert_matches_ort, rand, run_plan

F = TP.FLOAT


model = one_output_model


def conv_case(cin, cout, size, k, stride=1, pad=None, group=1, batch=1, relu=True, dyn=False):
    pad = k // 2 if pad is None else pad
    w = rand(cout, cin // group, k, k, seed=1, scale=1 / np.sqrt(cin * k * k / group))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], pads=[pad] * 4,
                              strides=[stride] * 2, group=group)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    shape = ["N" if dyn else batch, cin, size, size]
    m = model(nodes, [("x", F, shape)], [("w", w), ("b", rand(cout, seed=2))])
    return m, {"x": rand(batch, cin, size, size)}


def matmul_case(m_, k, n, batch=None, bias=False):
    xs = (m_, k) if batch is None else (batch, m_, k)
    ws = (k, n) if batch is None else (batch, k, n)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t" if bias else "y"])]
    inits = [("w", rand(*ws, seed=1, scale=1 / np.sqrt(k)))]
    if bias:
        nodes.append(helper.make_node("Add", ["t", "b"], ["y"]))
        inits.append(("b", rand(n, seed=2)))
    return model(nodes, [("x", F, list(xs))], inits), {"x": rand(*xs)}


def gemm_trans_case():
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["t"], transB=1),
             helper.make_node("Tanh", ["t"], ["y"])]
    m = model(nodes, [("x", F, [5, 30])], [("w", rand(21, 30, seed=1, scale=0.2)),
                                           ("b", rand(21, seed=2))])
    return m, {"x": rand(5, 30)}


def conv_add_case(cin, cout, size, k, other_shape):
    """Conv + Add(another input of ``other_shape``, broadcast) + Relu: the epilogue reads a
    second tensor, at the conv's own index (a residual) or broadcast along some dims."""
    w = rand(cout, cin, k, k, seed=1, scale=1 / np.sqrt(cin * k * k))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4),
             helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    m = model(nodes, [("x", F, [1, cin, size, size]), ("r", F, list(other_shape))],
              [("w", w), ("b", rand(cout, seed=2))])
    return m, {"x": rand(1, cin, size, size), "r": rand(*other_shape, seed=3)}


def capsule_case(batch=2, size=7, caps=8):
    mod = load_models_module("capsule")
    m = mod.einsum_model(batch, size, caps)
    return m, {m.graph.input[0].name: mod.poses(batch, size, caps)}


CASES = {
    "conv3x3_pad_bias_relu": lambda: conv_case(8, 24, 9, 3, batch=2, dyn=True),
    "conv3x3_stride2": lambda: conv_case(6, 20, 11, 3, stride=2, relu=False),
    "conv5x5_pad2_wide": lambda: conv_case(3, 70, 10, 5),
    "conv1x1": lambda: conv_case(32, 40, 7, 1),   # NCHW: x read in place, masked last block
    "conv1x1_even": lambda: conv_case(24, 20, 8, 1, batch=2, dyn=True),   # 64 columns
    "conv1x1_grouped": lambda: conv_case(16, 24, 12, 1, group=2),
    "conv1x1_stride2": lambda: conv_case(16, 33, 9, 1, stride=2, relu=False),
    "conv_grouped": lambda: conv_case(8, 32, 8, 3, group=2),
    # 13x13 = 169 pixels fill too little of 64-column tiles: the weights stay B
    "conv1x1_13x13": lambda: conv_case(24, 70, 13, 1),
    # a step of K moves x by 289 floats (no whole cache line) and 130 rows repay a packed copy
    "conv1x1_packed_17x17": lambda: conv_case(24, 130, 17, 1),
    "conv1x1_aligned_16x16": lambda: conv_case(24, 130, 16, 1),   # 256 floats: in place
    # 1.2 MB of weights (A) and a 1 MB x (B): the units walk N tiles fastest
    "conv1x1_big_weights": lambda: conv_case(1000, 300, 16, 1),
    # the epilogue reads a residual at the output's own index: bound as one flat index
    "conv3x3_residual": lambda: conv_add_case(16, 16, 9, 3, (1, 16, 9, 9)),
    "conv1x1_residual": lambda: conv_add_case(16, 24, 10, 1, (1, 24, 10, 10)),
    # ... or broadcast along h only: the inner loop's dims are bound one by one
    "conv3x3_add_per_column": lambda: conv_add_case(8, 20, 7, 3, (1, 1, 1, 7)),
    "conv1x1_add_per_row": lambda: conv_add_case(8, 20, 6, 1, (1, 1, 6, 1)),
    "conv_depthwise": lambda: conv_case(8, 8, 8, 3, group=8),
    "matmul_ragged": lambda: matmul_case(13, 77, 41),
    # B past L2 (1.2 MB), K in chunks of an L2's worth of panel and a ragged last one (on
    # every level), three groups of rows: each chunk's next slice fetched ahead
    # (microkernel._next_slices); a 3x3 convolution's K in three loops the same (chunked
    # on AVX-512)
    "matmul_weights_past_l2": lambda: matmul_case(130, 4500, 64, bias=True),
    "conv3x3_weights_past_l2": lambda: conv_case(192, 192, 12, 3),
    "matmul_bias_big_n": lambda: matmul_case(7, 33, 200, bias=True),
    "matmul_batched_const": lambda: matmul_case(5, 19, 23, batch=3),
    # one K chunk: each tile's epilogue runs after its K loop, over its rows and columns or
    # the last ones (of 31 and of 150)
    "matmul_whole_and_edge_tiles": lambda: matmul_case(31, 40, 150, batch=2, bias=True),
    "gemm_transb_tanh": gemm_trans_case,
    "capsule_einsum": capsule_case,
}
NOT_GEMM = {"conv_depthwise"}   # one output channel per group: a direct kernel (depthwise.py)


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_contraction_matches_ort(case, target):
    m, feeds = CASES[case]()
    g, _ = assert_matches_ort(m, feeds, target)
    assert ("Contraction" in _strategies(g, target)) == (case not in NOT_GEMM), case


def test_read_modes_and_unit_order():
    """How B is read and which tiles are walked fastest, for the shapes that decide it."""
    prepared: set[str] = set()   # tensors of the kernels run once, when the engine opens it

    def gemm(case):
        m, _ = CASES[case]()
        return _gemms(compile_onnx(m), "x86_64-v4", prepared)[0]
    assert gemm("conv1x1_13x13").packed in prepared          # the weights packed at load
    packed = gemm("conv1x1_packed_17x17")
    assert packed.b_direct is None and packed.packed not in prepared   # at every run, aligned
    in_place = gemm("conv1x1_aligned_16x16")
    assert in_place.b_direct is not None
    assert gemm("conv1x1_big_weights").n_inner
    assert not in_place.n_inner
    # packed weights past L2 are fetched a K chunk ahead; in L2 they are not
    assert gemm("matmul_weights_past_l2").fetch_ahead
    assert gemm("conv3x3_weights_past_l2").fetch_ahead
    # K chunks hold 256 KiB of packed panels (a 64-column tile's 1024 K steps), so that a
    # transformer's K of 768 is one chunk
    deep = gemm("matmul_weights_past_l2")
    assert deep.fetch_ahead and deep.tb == 4 and deep.kc == 1024
    assert gemm("conv3x3_weights_past_l2").kc < 192
    assert not gemm("conv1x1_13x13").fetch_ahead and not gemm("matmul_bias_big_n").fetch_ahead


def test_operands_both_past_l2_walk_n_fastest_when_b_is_the_smaller():
    """Neither operand fits L2 (1 MiB): the smaller B streams in order per M group while the
    group's rows of A stay in L2 (Whisper's fully connected layers: A 1500 x 1536, B 1536 x
    384); with B the bigger, M stays fastest (ViT-B/16's: A 197 x 3072, B 3072 x 768)."""
    def gemm(m, k, n):
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
        mod = model(nodes, [("x", F, [1, m, k])], [("w", rand(k, n, seed=1))])
        return _gemms(compile_onnx(mod), "x86_64-v3")[0]
    assert gemm(1500, 1536, 384).n_inner
    assert not gemm(197, 3072, 768).n_inner
    assert not gemm(1500, 384, 1536).n_inner   # (A 2.3 MB, B 2.4 MB: B the bigger)


def test_a_dynamic_batch_is_scheduled_as_a_batch_of_one():
    """Sizes that decide the unit order and the streamed weights are read at batch 1 where the
    batch is a symbol (the leading dim of every input); a sequence length stays symbolic."""
    def gemm(shape, k, n):
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
        m = model(nodes, [("x", F, shape)], [("w", rand(k, n, seed=1))])
        return _gemms(compile_onnx(m), "x86_64-v3")[0]
    # 12544 rows of 16: 800 KiB of A at batch 1, past a small L2, so N is walked fastest
    assert gemm(["N", 12544, 16], 16, 48).n_inner
    assert not gemm([1, 2048, 16], 16, 16).n_inner
    # 7 rows: one group, each weight panel read once and fetched ahead; not so with a sequence
    assert gemm(["N", 7, 320], 320, 256).stream
    assert not gemm(["N", "S", 320], 320, 256).stream



def test_few_units_are_tiled_to_share_evenly():
    """A late 1x1 convolution at batch 1, 7x7 pixels (M = 49, one group of rows) and 160 output
    channels: on AVX-512 four PACK blocks a tile would make three units, which two threads
    share 2:1, so the tiles take three blocks (four units); a taller M keeps four. On AVX2 the
    tiles are one block wide either way."""
    def gemm(m, n, target):
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
        mm = model(nodes, [("x", F, ["N", m, 960])], [("w", rand(960, n, seed=1))])
        return _gemms(compile_onnx(mm), target)[0]
    late = gemm(49, 160, "x86_64-v4")
    assert (late.tb, -(-late.blocks.value // late.tb)) == (3, 4)
    assert gemm(784, 160, "x86_64-v4").tb == 4
    assert gemm(49, 160, "x86_64-v3").tb == gemm(784, 160, "x86_64-v3").tb == 1


def test_a_b_whose_rows_share_few_l1_sets_is_packed():
    """Attention's P.V reads a head's 64 columns of V in place, its rows 6 heads * 64 floats
    (1536 bytes) apart: a K chunk's rows start in 8 of L1's 64 sets and evict each other, so
    B is packed first; one head's rows (256 bytes apart) are read in place."""
    from mlpack.codegen.targets.cpu.contraction import _set_bound

    assert _set_bound(6 * 64 * 4) and _set_bound(12 * 64 * 4) and not _set_bound(64 * 4)
    for heads, packed in ((6, True), (1, False)):
        nodes = [helper.make_node("Transpose", ["v"], ["vt"], perm=[1, 0, 2]),
                 helper.make_node("MatMul", ["p", "vt"], ["y"])]
        m = model(nodes, [("p", F, [heads, 256, 192]), ("v", F, [192, heads, 64])], [])
        [pv] = _gemms(compile_onnx(m), "x86_64-v4")
        assert (pv.packed != "v") == packed, heads

def test_a_big_output_is_written_row_after_row():
    """Attention's scores, per head 1024 x 1024 from K = 64: A (256 KiB a head) and B fit a
    core's L2, but the output (4 MiB a head) does not, so the units walk N fastest and write
    it row after row (M fastest wrote it one column block at a time). Sizes are a head's: the
    heads are walked outermost."""
    nodes = [helper.make_node("MatMul", ["q", "k"], ["y"])]
    m = model(nodes, [("q", F, [4, 1024, 64]), ("k", F, [4, 64, 1024])], [])
    scores = _gemms(compile_onnx(m), "x86_64-v3")[0]
    assert scores.batch and scores.n_inner
    nodes = [helper.make_node("MatMul", ["q", "k"], ["y"])]
    m = model(nodes, [("q", F, [4, 128, 64]), ("k", F, [4, 64, 128])], [])
    assert not _gemms(compile_onnx(m), "x86_64-v3")[0].n_inner   # 64 KiB of output a head


def test_epilogue_flat_binding():
    """The epilogue's inner dims are bound as one flat index exactly when every address they
    reach is affine in it."""
    from mlpack.codegen.targets.cpu.tileepilogue import flat_bindable
    from mlpack.codegen.targets.cpu.kernels import build_kernels
    from mlpack.codegen.targets.cpu.plan import tensor_buffers
    for case, want in (("conv3x3_residual", True), ("conv1x1_residual", True),
                       ("conv3x3_add_per_column", False), ("conv1x1_add_per_row", False)):
        m, _ = CASES[case]()
        g = compile_onnx(m)
        bufs = tensor_buffers(g)
        k = next(k for k in build_kernels(g, bufs) if k.epilogue is not None)
        out = bufs[k.out]
        hw = [d for d in out.layout if d not in ("n", "co") and out.sizes[d].value > 1]
        assert flat_bindable(k.epilogue, out, hw, bufs) == want, case


def test_epilogue_flat_binding_refuses_a_diagonal_read():
    """A var indexing two dims of one read (a diagonal) cannot be the flat index of both."""
    from mlpack.codegen.targets.cpu.tileepilogue import flat_bindable
    from mlpack.codegen.targets.cpu.kernel import Buffer
    from mlpack.codegen.targets.cpu.kernels import ACC
    from mlpack.spec.ir import expr as ex
    size = {d: ex.const(n) for d, n in (("co", 4), ("h", 5), ("w", 5))}
    out = Buffer("y", ("co", "h", "w"), size, "f32")
    cube = Buffer("s", ("a", "b", "c"), {d: ex.const(5) for d in "abc"}, "f32")
    acc = ex.var(ACC, "f32")
    same = ex.add(acc, ex.read("s", {"a": 0, "b": ex.var("h"), "c": ex.var("w")}, "f32"))
    # b, c hold h, w adjacent as in the output, but a is indexed by w too
    diagonal = ex.add(acc, ex.read("s", {"a": ex.var("w"), "b": ex.var("h"), "c": ex.var("w")},
                                   "f32"))
    assert flat_bindable(same, out, ["h", "w"], {"s": cube})
    assert not flat_bindable(diagonal, out, ["h", "w"], {"s": cube})


def test_epilogue_flat_binding_takes_a_groups_flat_channel():
    """A grouped convolution's output [.., g, co] with a bias read at b[4 * g + co]: the flat
    index over (g, co), bound to co with g at 0, addresses the bias as the pair does (so the
    epilogue vectorizes, no division a lane); b[2 * g + co] or b[4 * g] it does not."""
    from mlpack.codegen.targets.cpu.tileepilogue import flat_bindable
    from mlpack.codegen.targets.cpu.kernel import Buffer
    from mlpack.codegen.targets.cpu.kernels import ACC
    from mlpack.spec.ir import expr as ex
    size = {d: ex.const(n) for d, n in (("w", 7), ("g", 8), ("co", 4))}
    out = Buffer("y", ("w", "g", "co"), size, "f32")
    bias = {"b": Buffer("b", ("d0",), {"d0": ex.const(32)}, "f32")}
    g, co = ex.var("g"), ex.var("co")

    def epilogue(index):
        return ex.maximum(ex.add(ex.var(ACC, "f32"), ex.read("b", {"d0": index}, "f32")), 0.0)
    assert flat_bindable(epilogue(g * 4 + co), out, ["g", "co"], bias)
    assert not flat_bindable(epilogue(g * 2 + co), out, ["g", "co"], bias)
    assert not flat_bindable(epilogue(g * 4), out, ["g", "co"], bias)
    # (only the inner dims' sizes make the strides: the outer may be a symbol)
    out = Buffer("y", ("w", "g", "co"), {**size, "g": ex.sym("G")}, "f32")
    assert flat_bindable(epilogue(g * 4 + co), out, ["g", "co"], bias)


def test_packed_weights_are_target_independent():
    """Every cpu target packs B the same way, so a container stores one weights archive."""
    m, _ = conv_case(16, 48, 8, 3)
    g = compile_onnx(m)
    arts = [compile_cpu(g, t) for t in (*TARGETS, "aarch64")]
    for a in arts[1:]:
        assert a.weights.keys() == arts[0].weights.keys()
        for name in a.weights:
            np.testing.assert_array_equal(a.weights[name], arts[0].weights[name])


def test_dynamic_batch_one_library():
    """One artifact runs several batch sizes (M depends on the batch symbol)."""
    m, _ = conv_case(4, 16, 6, 3, dyn=True)
    g = compile_onnx(m)
    art = compile_cpu(g, best_host_target(*TARGETS))
    for n in (1, 3):
        feeds = {"x": rand(n, 4, 6, 6, seed=n)}
        got = run_plan(art, g, feeds)
        np.testing.assert_allclose(got[g.outputs[0].name], oracle_outputs(m, feeds)[0],
                                   rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_a_batch_of_ones_last_row_runs_a_one_row_k_loop(target):
    """A fully connected layer at a dynamic batch is one row at a batch of one (gemm's
    tail_rows, 1): a tile with one row left runs a K loop of that row alone. Batches of 1, 2, 5
    and 13 (on AVX-512 13 rows are two 6-row tiles and one of a row, which takes the one-row
    loop; 5 rows one tile of five) against float64, with a bias and a relu after."""
    k, n = 200, 70
    w, bias = rand(k, n, seed=1, scale=1 / np.sqrt(k)), rand(n, seed=2)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["t"]),
             helper.make_node("Relu", ["t"], ["y"])]
    m = model(nodes, [("x", F, ["N", k])], [("w", w), ("b", bias)])
    g = compile_onnx(m)
    (c,) = _gemms(g, target)
    assert c.tail_rows == 1 and c.mr > 1
    art = compile_cpu(g, target)
    for rows in (1, 2, 5, 13):
        x = rand(rows, k, seed=rows)
        want = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + bias, 0)
        got = run_plan(art, g, {"x": x})[g.outputs[0].name]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_the_last_rows_of_m_run_a_k_loop_of_their_own(target):
    """128 tokens (a dynamic batch of sequences of 128) in tiles of 6 rows leave 2 (gemm's
    tail_rows): that tile runs a K loop of 2 rows. At batches 1, 2 and 3 (M = 128, 256, 384:
    the last tile 2, 4 and 6 rows) against float64."""
    k, n = 96, 40
    w = rand(k, n, seed=1, scale=1 / np.sqrt(k))
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", F, ["N", 128, k])],
              [("w", w)])
    g = compile_onnx(m)
    (c,) = _gemms(g, target)
    assert c.mr > 1 and c.tail_rows == 128 % c.mr
    art = compile_cpu(g, target)
    for batch in (1, 2, 3):
        x = rand(batch, 128, k, seed=batch)
        got = run_plan(art, g, {"x": x})[g.outputs[0].name]
        np.testing.assert_allclose(got, x.astype(np.float64) @ w.astype(np.float64),
                                   rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- B read at run time


def attention_case(seq=23, batch=2, heads=4, dh=16, dyn=True):
    """Scores Q.K^T (B packed at run time: K is strided along the key axis), softmax, P.V (V
    read in place: unit stride along the head's 16 columns)."""
    hid = heads * dh
    shape = ["B" if dyn else batch, "S" if dyn else seq, hid]
    split = numpy_helper.from_array(np.array([0, 0, heads, dh], np.int64), "split")
    scale = numpy_helper.from_array(np.array(1 / np.sqrt(dh), np.float32), "scale")
    nodes = [helper.make_node("Reshape", [t, "split"], [t + "4"]) for t in "qkv"]
    nodes += [helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["qt", "kt"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(t, F, shape) for t in "qkv"],
                          [helper.make_tensor_value_info("y", F, None)], [split, scale])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return m, {t: rand(batch, seq, hid, seed=i) for i, t in enumerate("qkv")}


def matmul2_case(m_, k, n, batch=2, dyn=False, relu=False):
    """Two graph inputs: x[b, m, k] @ y[b, k, n] (y in place when n is a multiple of 16)."""
    xs = ["B" if dyn else batch, "M" if dyn else m_, k]
    ys = ["B" if dyn else batch, k, n]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t" if relu else "y"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    mdl = model(nodes, [("x", F, xs), ("w", F, ys)])
    return mdl, {"x": rand(batch, m_, k), "w": rand(batch, k, n, seed=1)}


RUNTIME_CASES = {
    "attention_dynamic": (attention_case, 2),
    "attention_static_seq7": (lambda: attention_case(seq=7, batch=1, dyn=False), 1),  # N=7: scalar
    "attention_seq40": (lambda: attention_case(seq=40, batch=1), 2),
    "matmul2_direct": (lambda: matmul2_case(19, 24, 32, relu=True), 1),
    "matmul2_packed_ragged": (lambda: matmul2_case(21, 13, 37), 1),
    "matmul2_dynamic": (lambda: matmul2_case(9, 40, 48, batch=3, dyn=True), 1),
}


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("case", list(RUNTIME_CASES))
def test_runtime_b_matches_ort(case, target):
    build, gemms = RUNTIME_CASES[case]
    m, feeds = build()
    g = compile_onnx(m)
    art = compile_cpu(g, target)
    want = oracle_outputs(m, feeds)
    got = run_plan(art, g, feeds)
    np.testing.assert_allclose(got[g.outputs[0].name], want[0], rtol=RTOL, atol=ATOL)
    assert _gemm_count(g, target) >= gemms


def _gemm_count(g, target) -> int:
    """How many of the graph's kernels take the gemm strategy."""
    from mlpack.codegen.targets.cpu import contraction
    from mlpack.codegen.targets.cpu.kernels import build_kernels
    from mlpack.codegen.targets.cpu.plan import tensor_buffers
    from mlpack.codegen.targets.cpu.target import get_target
    bufs = tensor_buffers(g)
    ks = contraction.apply(g, build_kernels(g, bufs), bufs, get_target(target))
    return sum(k.strategy == "gemm" for k in ks)


def test_attention_one_library_many_sizes():
    """Symbolic batch and sequence: one artifact, several sizes (N, K and M all vary)."""
    m, _ = attention_case()
    g = compile_onnx(m)
    art = compile_cpu(g, best_host_target(*TARGETS))
    for b, s in ((1, 1), (1, 16), (3, 33)):
        feeds = {t: rand(b, s, 64, seed=i + s) for i, t in enumerate("qkv")}
        got = run_plan(art, g, feeds)
        np.testing.assert_allclose(got[g.outputs[0].name], oracle_outputs(m, feeds)[0],
                                   rtol=RTOL, atol=ATOL)


def test_bert_block_dynamic():
    """tests/models/bert_block.onnx ($batch, $seq): attention on the gemm path too."""
    import onnx
    m = onnx.load(os.path.join(MODELS_DIR, "bert_block.onnx"))
    g = compile_onnx(m)
    target = best_host_target(*TARGETS)
    assert _gemm_count(g, target) >= 8   # q, k, v, scores, context, out, ffn x2
    art = compile_cpu(g, target)
    for b, s in ((1, 64), (2, 19)):
        ids = np.random.default_rng(s).integers(0, 1000, (b, s)).astype(np.int64)
        got = run_plan(art, g, {"ids": ids})
        np.testing.assert_allclose(got[g.outputs[0].name], oracle_outputs(m, {"ids": ids})[0],
                                   rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- direct (depthwise) kernels


def shuffle_dw_case(c=24, size=13, stride=1, groups=4):
    """A channel shuffle (absorbed into the depthwise read: a non-affine channel index under
    a bounds select) then a depthwise 3x3 and batchnorm, as in ShuffleNet."""
    shape = numpy_helper.from_array(np.array([1, groups, c // groups, size, size], np.int64), "s5")
    back = numpy_helper.from_array(np.array([1, c, size, size], np.int64), "s4")
    w = rand(c, 1, 3, 3, seed=1, scale=0.3)
    bn = [numpy_helper.from_array(rand(c, seed=i + 2, scale=0.5) + (1.0 if i == 3 else 0.0), n)
          for i, n in enumerate(["bs", "bb", "bm", "bv"])]
    bn[3] = numpy_helper.from_array(np.abs(numpy_helper.to_array(bn[3])) + 0.5, "bv")
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "s5"], ["r5"]),
             helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t5", "s4"], ["sh"]),
             helper.make_node("Conv", ["sh", "w"], ["c"], pads=[1] * 4, strides=[stride] * 2,
                              group=c),
             helper.make_node("BatchNormalization", ["c", "bs", "bb", "bm", "bv"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", F, [1, c, size, size])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [shape, back, numpy_helper.from_array(w, "w"), *bn])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return m, {"x": rand(1, c, size, size)}


DIRECT_CASES = {
    "dw3x3": lambda: conv_case(8, 8, 8, 3, group=8),
    "dw3x3_wide_row": lambda: conv_case(4, 4, 70, 3, group=4, relu=False),
    "dw3x3_stride2": lambda: conv_case(16, 16, 15, 3, stride=2, group=16),
    "dw5x5_pad1": lambda: conv_case(6, 6, 23, 5, pad=1, group=6),
    "dw3x3_dynamic_batch": lambda: conv_case(5, 5, 7, 3, group=5, batch=2, dyn=True),
    "dw_multiplier2": lambda: conv_case(4, 8, 9, 3, group=4),
    "conv_few_out_channels": lambda: conv_case(3, 5, 20, 3),
    "shuffle_dw_bn": shuffle_dw_case,
    "shuffle_dw_bn_stride2": lambda: shuffle_dw_case(c=16, size=14, stride=2),
}


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("case", list(DIRECT_CASES))
def test_direct_matches_ort(case, target):
    m, feeds = DIRECT_CASES[case]()
    g = compile_onnx(m)
    assert "Direct" in _strategies(g, target), case
    art = compile_cpu(g, target)
    want = oracle_outputs(m, feeds)
    got = run_plan(art, g, feeds)
    np.testing.assert_allclose(got[g.outputs[0].name], want[0], rtol=RTOL, atol=ATOL)


def inverted_residual_case(c=20, hidden=20, size=13, k=3):
    """1x1 expansion, a k x k depthwise convolution and a 1x1 projection with the residual:
    laid out channels last, the depthwise kernel holds several output columns per unit."""
    rw = [rand(hidden, c, 1, 1, seed=1, scale=0.3), rand(hidden, 1, k, k, seed=2, scale=0.3),
          rand(c, hidden, 1, 1, seed=3, scale=0.3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["e"]), helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("Conv", ["r", "w1", "b1"], ["d"], pads=[k // 2] * 4, group=hidden),
             helper.make_node("Relu", ["d"], ["dr"]), helper.make_node("Conv", ["dr", "w2"], ["p"]),
             helper.make_node("Add", ["p", "x"], ["y"])]
    m = model(nodes, [("x", F, [1, c, size, size])],
              [("w0", rw[0]), ("w1", rw[1]), ("b1", rand(hidden, seed=4)), ("w2", rw[2])])
    return m, {"x": rand(1, c, size, size)}


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("size,k", [(13, 3), (11, 5), (17, 3)])
def test_a_channels_last_depthwise_unit_of_several_columns_matches_ort(target, size, k):
    """The depthwise kernel's unit holds several output columns; where they do not divide the
    row, the last unit starts early and stores only its own columns, and channels that are not
    whole vectors mask the last vector's lanes inside the image as on its border."""
    from mlpack.codegen.targets.cpu.compile import schedule_kernels
    from mlpack.codegen.targets.cpu.depthwise import Direct
    from mlpack.codegen.targets.cpu.target import get_target
    m, feeds = inverted_residual_case(size=size, k=k)
    g = compile_onnx(m)
    _, kernels, _, _, _ = schedule_kernels(g, get_target(target))
    direct = [k.gemm for k in kernels if isinstance(k.gemm, Direct)]
    assert len(direct) == 1 and direct[0].w_vector and direct[0].rows > 1, direct
    assert size % direct[0].rows != 0   # (the last unit overlaps the one before)
    art = compile_cpu(g, target)
    want = oracle_outputs(m, feeds)
    got = run_plan(art, g, feeds)
    np.testing.assert_allclose(got[g.outputs[0].name], want[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("target", ["x86_64-v4", "x86_64-v3", "aarch64"])
def test_a_depthwise_epilogue_masks_the_last_vector_on_avx512(target, monkeypatch, capsys):
    """The epilogue's loop over a tile's lanes is vectorized with masks where vectors have 16
    lanes (AVX-512): 72 channels' last vector of 8 was a scalar loop. AVX2 and NEON keep the
    scalar remainder. The values match ONNX Runtime wherever the host runs the level."""
    m, feeds = inverted_residual_case(c=24, hidden=72, size=14)
    hinted = "llvm.loop.vectorize.predicate.enable" in _llvm_ir(m, target, monkeypatch, capsys)
    assert hinted == (target == "x86_64-v4")
    monkeypatch.delenv("MLPACK_DEBUG")
    if target != "aarch64" and host_lacks(target) is None:
        assert_matches_ort(m, feeds, target)


@pytest.mark.parametrize("dyn", [False, True])
@pytest.mark.parametrize("target", TARGETS)
def test_the_rows_of_a_small_image_split_evenly_into_tiles(target, dyn):
    """A 7x7 image's 49 rows (M, all of it one group at a batch of one) are tiles of even
    height that compute 50 rows at most (a last tile's rows past M are computed all the
    same): not 9 tiles of 6 (54 rows), nor full tiles and a last one of a row or two (whose
    step loads B's vectors for one FMA), for a narrow N (32 channels) and a wide one (128);
    a fully connected layer's one row keeps the full height, which a dynamic batch fills."""
    for cout in (32, 128):
        m, feeds = conv_case(64, cout, 7, 1, dyn=dyn)
        [c] = _gemms(compile_onnx(m), target)
        assert -(-49 // c.mr) * c.mr <= 50, (cout, c.mr)
        if host_lacks(target) is None:
            assert_matches_ort(m, feeds, target)
    [fc] = _gemms(compile_onnx(matmul_case(1, 64, 32)[0]), target)
    assert fc.mr > 1


@pytest.mark.parametrize("m, mr, height", [(49, 6, 5), (49, 12, 10), (49, 8, 7), (96, 6, 6),
                                           (49, 2, 2), (49, 4, 4), (7, 6, 4)])
def test_the_tile_height_computes_the_fewest_rows(m, mr, height):
    """even_rows: the height whose tiles compute the fewest rows, one row shorter than the
    register tile at most, never shorter where the tile has 4 rows or fewer."""
    assert even_rows(m, mr) == height


@pytest.mark.parametrize("dyn", [False, True])
@pytest.mark.parametrize("target", TARGETS)
def test_a_stems_tiles_stay_within_one_row_of_the_image(target, dyn):
    """A stem convolution (3 channels x a 3x3 window, stride 2, over an NCHW image) has a K of
    27 scattered steps: its tile height divides the output row (16 columns), so each tile's
    rows are one pointer plus constant steps; the outputs still match, two images at once."""
    m, feeds = conv_case(3, 16, 32, 3, stride=2, batch=2, dyn=dyn)
    [c] = _gemms(compile_onnx(m), target)
    assert 16 % c.mr == 0, c.mr
    if host_lacks(target) is None:
        assert_matches_ort(m, feeds, target)


def _gemms(g, target, prepared: set | None = None) -> list:
    """The gemm records of ``g``'s kernels for ``target``; ``prepared`` gets the tensors of the
    kernels that run once, at open."""
    from mlpack.codegen.targets.cpu import contraction
    from mlpack.codegen.targets.cpu.kernels import build_kernels
    from mlpack.codegen.targets.cpu.plan import tensor_buffers
    from mlpack.codegen.targets.cpu.target import get_target
    bufs = tensor_buffers(g)
    ks = contraction.apply(g, build_kernels(g, bufs), bufs, get_target(target))
    if prepared is not None:
        prepared.update(k.out for k in ks if k.prepare)
    return [k.gemm for k in ks if k.strategy == "gemm"]


def _strategies(g, target) -> list[str]:
    from mlpack.codegen.targets.cpu import contraction
    from mlpack.codegen.targets.cpu.kernels import build_kernels
    from mlpack.codegen.targets.cpu.plan import tensor_buffers
    from mlpack.codegen.targets.cpu.target import get_target
    bufs = tensor_buffers(g)
    ks = contraction.apply(g, build_kernels(g, bufs), bufs, get_target(target))
    return [type(k.gemm).__name__ for k in ks if k.strategy == "gemm"]


def _llvm_ir(m, target, monkeypatch, capsys) -> str:
    monkeypatch.setenv("MLPACK_DEBUG", "3")
    compile_cpu(compile_onnx(m), target)
    return capsys.readouterr().err.split("LLVM IR before optimization:")[1].split("[mlpack]")[0]


def test_weights_read_once_are_shared_among_threads_sooner():
    """A batch-1 fully connected layer streams its weights from memory once per run: an
    EfficientNet squeeze-excitation's 48 -> 1152 (55k multiply-adds) is cut for several threads,
    which fetch their parts of the weights side by side; a 1x1 convolution of 8 channels on
    32x32 (65k), which reads its weights from cache for every group of pixels, in two."""
    from mlpack.codegen.targets.cpu import contraction
    from mlpack.codegen.targets.cpu.kernels import build_kernels
    from mlpack.codegen.targets.cpu.plan import tensor_buffers
    from mlpack.codegen.targets.cpu.target import get_target
    from mlpack.spec.ir import expr as ex

    def workgroups(m):
        g = compile_onnx(m)
        bufs = tensor_buffers(g)
        [k] = [k for k in contraction.apply(g, build_kernels(g, bufs), bufs,
                                            get_target("x86_64-v4")) if k.strategy == "gemm"]
        return k.gemm.stream, ex.index_value(contraction.workgroups(k, bufs[k.out]), {})
    assert workgroups(matmul_case(1, 48, 1152)[0]) == (True, 13)
    assert workgroups(conv_case(8, 8, 32, 1)[0]) == (False, 2)


@pytest.mark.parametrize("target", ["x86_64-v4", "aarch64"])
def test_weights_read_once_are_prefetched(target, monkeypatch, capsys):
    """A batch-1 fully connected layer reads each weight once per run, from memory: its
    kernel fetches the packed panels ahead (microkernel.PREFETCH_ROWS). A 3x3 convolution on
    32x32 reuses each panel from cache over its 1024 rows, so its kernel does not."""
    fc, _ = matmul_case(1, 256, 512)
    assert "@\"llvm.prefetch.p0\"(" in _llvm_ir(fc, target, monkeypatch, capsys)
    conv, _ = conv_case(16, 32, 32, 3)
    assert "llvm.prefetch" not in _llvm_ir(conv, target, monkeypatch, capsys)


@pytest.mark.parametrize("target", ["x86_64-v4", "aarch64"])
def test_rows_read_once_are_prefetched(target, monkeypatch, capsys):
    """A GEMM whose N is one tile reads each row of A once per run, tile after tile (a 1x1
    convolution of 32 -> 16 channels, channels last): its K loop fetches the next tile's rows
    ahead. With N in several tiles the rows are read again for each, from cache: no fetch."""
    one, _ = matmul_case(1024, 32, 16)
    assert "@\"llvm.prefetch.p0\"(" in _llvm_ir(one, target, monkeypatch, capsys)
    several, _ = matmul_case(1024, 32, 256)
    assert "llvm.prefetch" not in _llvm_ir(several, target, monkeypatch, capsys)


def conv_pool_case(batch=3):
    """A 1x1 convolution and Relu over a dynamic batch whose output is then averaged along its
    rows (a mean over the columns of each row): that reader keeps the convolution's output
    NCHW (layout.py), where (n, h, w) are not adjacent."""
    cin, cout, size = 32, 48, 7
    w = rand(cout, cin, 1, 1, seed=1, scale=1 / np.sqrt(cin))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["y"], axes=[3])]
    m = model(nodes, [("x", F, ["N", cin, size, size])], [("w", w), ("b", rand(cout, seed=2))])
    return m, {"x": rand(batch, cin, size, size)}


@pytest.mark.parametrize("target", ["x86_64-v2", "x86_64-v3"])
def test_an_nchw_epilogue_over_a_dynamic_batch_runs_image_by_image(target, monkeypatch, capsys):
    """Its epilogue walks each image's pixels as one flat, vectorized loop (a division per
    image, not two per element: MnasNet's last convolution 0.89 -> 0.67 ms), and matches ONNX
    Runtime at batch 3, where tiles of rows cross images."""
    m, feeds = conv_pool_case()
    assert '"e.row.run.head"' in _llvm_ir(m, target, monkeypatch, capsys)
    assert_matches_ort(m, feeds, target)


def test_a_depthwise_units_x_offsets_step_by_constants():
    """Inside X, a channels-last depthwise unit addresses every point and row from one anchor:
    X [n, h, w, c] of 9 x 9 x 24 read at (2h + kh - 1, 2w + kw - 1, c) steps 2 * 24 floats per
    output column and 24 per window column; an index with a division has no constant step."""
    from llvmlite import ir
    from mlpack.codegen.targets.cpu.depthwise import _var_step
    from mlpack.spec.ir import expr as ex

    v = ex.var
    strides = [ir.Constant(ir.IntType(64), s) for s in (9 * 9 * 24, 9 * 24, 24, 1)]
    index = [v("n"), ex.add(ex.add(ex.mul(ex.const(2), v("h")), v("kh")), ex.const(-1)),
             ex.add(ex.add(ex.mul(ex.const(2), v("w")), v("kw")), ex.const(-1)), v("c")]
    assert _var_step(index, "w", strides) == 48
    assert _var_step(index, "kw", strides) == 24
    assert _var_step(index, "kh", strides) == 216
    halved = [v("n"), v("h"), ex.floordiv(v("w"), ex.const(2)), v("c")]
    assert _var_step(halved, "w", strides) is None

