"""What Intel AMX would give an fp32 contraction on this machine: its bf16 tile-multiply rate
next to the fp32 matmul peak, and how many bf16 products an fp32 product needs.

``python -m benchmarks.amx [--seconds 0.2] [--rounds 5] [--capsule RUNS]``

AMX multiplies bf16 tiles only. An fp32 value splits exactly into three bf16 parts
(x = x1 + x2 + x3, 8 significant bits each), so an fp32 product is emulated by summing the
part products of order above 2**-24: three (x1y1, x1y2, x2y1: bf16x3) or six (adding x1y3,
x2y2, x3y1: bf16x6). This tool measures

* the capsule primitive (tests/models/capsule.py, the benchmark's shapes and data) computed
  with bf16x3 and bf16x6 against float64, at the container's fp32 tolerance
  (packager/build.py: rtol 1e-4, atol 1e-5);
* the tile-multiply rate of the inner steps in ``KERNELS``: a 2x2 block with its operands held
  in tiles (the ceiling), and the bf16x3 and bf16x6 steps with their parts loaded from L1 at
  every step, into one accumulator tile or two (one chain of dependent multiplies, or two);
  each next to ONNX Runtime's fp32 matmul peak, alternating, best of ``--rounds``;
* with ``--capsule``, the capsule as one bf16x6 tile gemm (``CapsuleGemm``: its operands split
  and packed beforehand, so the time is the multiplies' alone) against mlpack's x86_64-v4
  artifact and ONNX Runtime's Einsum, one thread, alternating.

mlpack does not generate AMX code; this measures whether a cpu target level with it would pay
(benchmarks/RESULTS.md, "AMX").
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import time

import numpy as np
from mlpack.packager.build import ATOL, RTOL

from .models import tests_module

ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158
TILE_FLOPS = 16 * 16 * 32 * 2   # one tdpbf16ps: a 16x16 f32 tile += 16x32 by 32x16 bf16

_DECLS = """
declare void @llvm.x86.ldtilecfg(ptr)
declare void @llvm.x86.tilezero(i8 immarg)
declare void @llvm.x86.tileloadd64(i8 immarg, ptr, i64)
declare void @llvm.x86.tdpbf16ps(i8 immarg, i8 immarg, i8 immarg)
declare void @llvm.x86.tilestored64(i8 immarg, ptr, i64)
declare void @llvm.x86.tilerelease()
"""


def _kernel_ir(products, loads_in_loop: bool) -> str:
    """``void amx(cfg, a, b, c, n)``: n steps of the tile products ``(c, a, b)`` (tile numbers:
    accumulators 0-3, A parts 4-5 or 1-3, B parts 6-7 or 4-6), each A tile loaded from ``a`` +
    1 KB per tile and each B from ``b``, once before the loop or at every step."""
    accs = sorted({c for c, _, _ in products})
    a_tiles = sorted({x for _, x, _ in products})
    b_tiles = sorted({x for _, _, x in products})
    loads = [f"call void @llvm.x86.tileloadd64(i8 {t}, ptr %{src}{i}, i64 64)"
             for src, tiles in (("a", a_tiles), ("b", b_tiles)) for i, t in enumerate(tiles)]
    ptrs = [f"%{src}{i} = getelementptr i8, ptr %{src}, i64 {1024 * i}"
            for src, tiles in (("a", a_tiles), ("b", b_tiles)) for i in range(len(tiles))]
    muls = [f"call void @llvm.x86.tdpbf16ps(i8 {c}, i8 {x}, i8 {y})" for c, x, y in products]
    lines = ["define void @amx(ptr %cfg, ptr %a, ptr %b, ptr %c, i64 %n) {", "entry:",
             "call void @llvm.x86.ldtilecfg(ptr %cfg)",
             *[f"call void @llvm.x86.tilezero(i8 {c})" for c in accs], *ptrs,
             *([] if loads_in_loop else loads), "br label %loop", "loop:",
             "%i = phi i64 [0, %entry], [%i1, %loop]", *(loads if loads_in_loop else []), *muls,
             "%i1 = add i64 %i, 1", "%done = icmp eq i64 %i1, %n",
             "br i1 %done, label %exit, label %loop", "exit:",
             "call void @llvm.x86.tilestored64(i8 0, ptr %c, i64 64)",
             "call void @llvm.x86.tilerelease()", "ret void", "}"]
    return _DECLS + "\n".join(lines)


# an fp32-grade step, (accumulator, A part, B part) per product: A1..A3 in tiles 1-3, B1..B3 in
# 4-6; the products alternate between accumulators 0 and 7, so two chains run at once
BF16X6_STEP = ((0, 1, 4), (7, 1, 5), (0, 2, 4), (7, 1, 6), (0, 2, 5), (7, 3, 4))
# (what, tile products per step, loads every step, bf16 products per fp32 product)
KERNELS = (
    ("2x2 block, operands held in tiles (the ceiling)",
     ((0, 4, 6), (1, 4, 7), (2, 5, 6), (3, 5, 7)), False, 1),
    ("bf16x3 step: A1 A2 B1 B2 loaded, C += A1B1 + A1B2 + A2B1",
     ((0, 1, 4), (0, 1, 5), (0, 2, 4)), True, 3),
    ("bf16x6 step: A1-A3 B1-B3 loaded, C += the six products",
     ((0, 1, 4), (0, 1, 5), (0, 2, 4), (0, 1, 6), (0, 2, 5), (0, 3, 4)), True, 6),
    ("bf16x3 step, two accumulators (C and C' summed at the end)",
     ((0, 1, 4), (7, 1, 5), (0, 2, 4)), True, 3),
    ("bf16x6 step, two accumulators", BF16X6_STEP, True, 6),
)


def amx_usable() -> str | None:
    """Why AMX cannot run here, or None: the cpu flags, then the kernel's permission to use
    the tile state (Linux asks each process to request it)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"not x86-64 Linux ({platform.system()} {platform.machine()})"
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    missing = [x for x in ("amx_tile", "amx_bf16") if x not in flags]
    if missing:
        return f"the cpu lacks {', '.join(missing)}"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
        return f"the kernel refused the tile state (errno {ctypes.get_errno()})"
    return None


def _require_amx() -> None:
    """Raise unless this process may run tile instructions (it asks Linux for the state)."""
    why = amx_usable()
    if why:
        raise RuntimeError(f"no AMX here: {why}")


def _tile_config() -> np.ndarray:
    """ldtilecfg's 64 bytes: palette 1, 8 tiles of 16 rows x 64 bytes."""
    cfg = np.zeros(64, np.uint8)
    cfg[0], cfg[48:56] = 1, 16
    cfg[16:32].view(np.uint16)[:] = 64
    return cfg


def _jit(ir: str, name: str, pointers: int, *rest):
    """(engine, ctypes function) for ``name`` in ``ir``, compiled for this host with AMX; the
    engine must outlive the function."""
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine(   # the engine owns it
        features="+amx-tile,+amx-bf16,+avx512f", opt=2)
    ee = llvm.create_mcjit_compiler(llvm.parse_assembly(ir), tm)
    ee.finalize_object()
    fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * pointers, *rest)(ee.get_function_address(name))
    return ee, fn


def tile_rates(seconds: float) -> dict[str, float]:
    """bf16 GFLOP/s of each of KERNELS, best of 5 calls of about ``seconds`` / 5 each."""
    _require_amx()
    cfg = _tile_config()
    a = np.full(1536, 0x3F80, np.uint16)         # bf16 ones: 3 tiles each of A and B
    b, c = a.copy(), np.zeros(256, np.float32)
    rates, keep = {}, []
    for name, products, in_loop, _ in KERNELS:
        ee, fn = _jit(_kernel_ir(products, in_loop), "amx", 4, ctypes.c_int64)
        keep.append(ee)
        args = (cfg.ctypes.data, a.ctypes.data, b.ctypes.data, c.ctypes.data)
        fn(*args, 10)
        want = 10 * 32 * sum(1 for p in products if p[0] == 0)   # dot products of ones
        if c[0] != want:
            raise RuntimeError(f"AMX kernel computed {c[0]}, not {want}")
        n, best = 1000, float("inf")
        while True:                              # grow n until one call takes ~seconds/5
            t0 = time.perf_counter()
            fn(*args, n)
            if time.perf_counter() - t0 > seconds / 5:
                break
            n *= 4
        for _ in range(5):
            t0 = time.perf_counter()
            fn(*args, n)
            best = min(best, time.perf_counter() - t0)
        rates[name] = len(products) * n * TILE_FLOPS / best / 1e9
    return rates


def _gemm_ir(mt: int, nt: int, ks: int) -> str:
    """``void gemm(cfg, a, b, c, scratch)``: C[16 mt x 16 nt] = A B with fp32 products as bf16x6
    (two accumulator tiles, summed through ``scratch`` into C's row-major f32 rows). A's parts
    are packed [3][mt][ks][16 rows][32 k], B's [3][nt][ks][16 k pairs][16 cols x 2] (VNNI)."""
    body = []
    for part in range(3):
        for op, count, tile in (("a", mt, 1 + part), ("b", nt, 4 + part)):
            v = f"%{op}{part}"
            body += [f"{v}i = add i64 {part * count}, %{op}t", f"{v}j = mul i64 {v}i, {ks}",
                     f"{v}k = add i64 {v}j, %ks", f"{v}o = mul i64 {v}k, 1024",
                     f"{v}p = getelementptr i8, ptr %{op}, i64 {v}o",
                     f"call void @llvm.x86.tileloadd64(i8 {tile}, ptr {v}p, i64 64)"]
    body += [f"call void @llvm.x86.tdpbf16ps(i8 {c}, i8 {x}, i8 {y})" for c, x, y in BF16X6_STEP]
    return _DECLS + f"""
define void @gemm(ptr %cfg, ptr %a, ptr %b, ptr %c, ptr %s) {{
entry:
  call void @llvm.x86.ldtilecfg(ptr %cfg)
  %s1 = getelementptr i8, ptr %s, i64 1024
  br label %mloop
mloop:
  %at = phi i64 [0, %entry], [%at1, %nend]
  br label %nloop
nloop:
  %bt = phi i64 [0, %mloop], [%bt1, %rend]
  call void @llvm.x86.tilezero(i8 0)
  call void @llvm.x86.tilezero(i8 7)
  br label %kloop
kloop:
  %ks = phi i64 [0, %nloop], [%ks1, %kloop]
  {chr(10).join(body)}
  %ks1 = add i64 %ks, 1
  %kd = icmp eq i64 %ks1, {ks}
  br i1 %kd, label %kend, label %kloop
kend:
  call void @llvm.x86.tilestored64(i8 0, ptr %s, i64 64)
  call void @llvm.x86.tilestored64(i8 7, ptr %s1, i64 64)
  br label %rloop
rloop:
  %r = phi i64 [0, %kend], [%r1, %rloop]
  %so = mul i64 %r, 64
  %sp0 = getelementptr i8, ptr %s, i64 %so
  %sp1 = getelementptr i8, ptr %s1, i64 %so
  %v0 = load <16 x float>, ptr %sp0, align 4
  %v1 = load <16 x float>, ptr %sp1, align 4
  %v = fadd <16 x float> %v0, %v1
  %row = mul i64 %at, 16
  %row1 = add i64 %row, %r
  %co = mul i64 %row1, {nt * 64}
  %cn = mul i64 %bt, 64
  %co1 = add i64 %co, %cn
  %cp = getelementptr i8, ptr %c, i64 %co1
  store <16 x float> %v, ptr %cp, align 4
  %r1 = add i64 %r, 1
  %rd = icmp eq i64 %r1, 16
  br i1 %rd, label %rend, label %rloop
rend:
  %bt1 = add i64 %bt, 1
  %nd = icmp eq i64 %bt1, {nt}
  br i1 %nd, label %nend, label %nloop
nend:
  %at1 = add i64 %at, 1
  %md = icmp eq i64 %at1, {mt}
  br i1 %md, label %exit, label %mloop
exit:
  call void @llvm.x86.tilerelease()
  ret void
}}
"""


class CapsuleGemm:
    """The capsule as one bf16x6 AMX gemm (rows n, x, y, i; columns co, j; depth kx, ky, ci,
    k): A's patches split and packed here in NumPy, which a real pack kernel would do at run
    time, so ``run`` times the tile multiplies alone. ``out`` is V after ``run``."""

    def __init__(self, batch: int = 8, size: int = 16, caps: int = 32):
        _require_amx()
        capsule = tests_module("capsule")
        self.poses, w = capsule.poses(batch, size, caps), capsule.weights(caps)
        a = capsule.patches(self.poses).transpose(0, 1, 3, 6, 2, 4, 5, 7)   # n x y i a b c k
        a = a.reshape(np.prod(a.shape[:4]), -1)
        b = w.transpose(0, 1, 2, 4, 3, 5).reshape(a.shape[1], caps * 4)
        self.exact = a.astype(np.float64) @ b.astype(np.float64)
        m, k, n = (-(-d // q) * q for d, q in zip((a.shape[0], a.shape[1], b.shape[1]), (16, 32, 16)))
        a, b = np.pad(a, ((0, m - a.shape[0]), (0, k - a.shape[1]))), \
            np.pad(b, ((0, k - b.shape[0]), (0, n - b.shape[1])))
        mt, nt, ks = m // 16, n // 16, k // 32
        bits = [(p.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
                for p in (*bf16_parts(a), *bf16_parts(b))]
        self.a = np.ascontiguousarray(np.stack(
            [p.reshape(mt, 16, ks, 32).transpose(0, 2, 1, 3) for p in bits[:3]]))
        self.b = np.ascontiguousarray(np.stack(
            [p.reshape(ks, 16, 2, nt, 16).transpose(3, 0, 1, 4, 2) for p in bits[3:]]))
        self.c = np.zeros((m, n), np.float32)
        self._s, self._cfg = np.zeros(512, np.float32), _tile_config()
        self._ee, self._fn = _jit(_gemm_ir(mt, nt, ks), "gemm", 5)
        self._args = tuple(v.ctypes.data for v in (self._cfg, self.a, self.b, self.c, self._s))

    def run(self) -> None:
        self._fn(*self._args)

    @property
    def out(self) -> np.ndarray:
        rows, cols = self.exact.shape
        return self.c[:rows, :cols]


def time_capsule(runs: int) -> dict[str, float]:
    """Median ms of the capsule: the AMX gemm, mlpack's x86_64-v4 artifact and ONNX Runtime's
    Einsum, one thread each, at least ``runs`` each, alternating as the benchmark does."""
    import tempfile

    import mlpack
    from mlpack.packager.bench import ort_session, time_alternating
    capsule = tests_module("capsule")
    gemm = CapsuleGemm()
    model = capsule.einsum_model()
    feeds = {model.graph.input[0].name: gemm.poses}
    sess = ort_session(model.SerializeToString(), 1)
    with tempfile.TemporaryDirectory() as tmp:
        mlpack.build(model, f"{tmp}/c.mlpack", targets=["x86_64-v4"])
        with mlpack.load(f"{tmp}/c.mlpack", threads=1) as ours:
            timings, _ = time_alternating(
                {"AMX bf16x6 gemm": gemm.run, "mlpack x86_64-v4": lambda: ours.run(feeds),
                 "ONNX Runtime Einsum": lambda: sess.run(None, feeds)}, repeat=runs)
    return {k: t.median_s * 1e3 for k, t in timings.items()}


def bf16_parts(x: np.ndarray, count: int = 3) -> list[np.ndarray]:
    """f32 ``x`` as ``count`` bf16 values (held in float64) summing to it, largest first; each
    rounded to nearest even, so three parts hold every normal f32 exactly."""
    parts, rest = [], x.astype(np.float64)
    for _ in range(count):
        bits = rest.astype(np.float32).view(np.uint32)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        part = bits.view(np.float32).astype(np.float64)
        parts.append(part)
        rest = rest - part
    return parts


SPLITS = {"bf16x3": ((0, 0), (0, 1), (1, 0)),
          "bf16x6": ((0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0))}


def capsule_errors(batch: int = 8, size: int = 16, caps: int = 32) -> dict[str, tuple[float, bool]]:
    """Max abs error of the capsule computed with each split against float64, and whether it
    is within the fp32 tolerance; plus the fp32 direct sum's, for scale."""
    capsule = tests_module("capsule")
    p, w = capsule.poses(batch, size, caps), capsule.weights(caps)
    exact = capsule.reference(p.astype(np.float64), w.astype(np.float64))
    ps, ws = bf16_parts(p), bf16_parts(w)
    out = {"fp32 direct": capsule.reference(p, w)}
    for name, terms in SPLITS.items():
        out[name] = sum(capsule.reference(ps[i], ws[j]) for i, j in terms)
    return {name: (float(np.abs(v - exact).max()),
                   bool(np.allclose(v, exact, rtol=RTOL, atol=ATOL))) for name, v in out.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.2, help="time per measurement")
    ap.add_argument("--capsule", type=int, default=0, metavar="RUNS",
                    help="also time the capsule as a bf16x6 AMX gemm against mlpack and ONNX "
                         "Runtime, at least RUNS alternating runs each")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of (fp32 peak, AMX rates); the best of each is reported")
    a = ap.parse_args(argv)
    errors = capsule_errors()
    print(f"capsule against float64 (fp32 tolerance rtol {RTOL:g}, atol {ATOL:g}):")
    for name, (err, ok) in errors.items():
        print(f"  {name:12s} max abs error {err:.2e}  {'within' if ok else 'outside'}")
    why = amx_usable()
    if why:
        print(f"AMX: not measured: {why}")
        return
    from mlpack.packager.bench import matmul_peak
    peak, rounds = float("nan"), []
    for i in range(a.rounds):   # interleaved: this machine's speed drifts between phases
        peak = matmul_peak(1, refresh=i > 0) or float("nan")
        rounds.append(tile_rates(a.seconds))
    print(f"fp32 matmul peak (ONNX Runtime's MatMul, 1 thread, best of {a.rounds}): "
          f"{peak:.0f} GFLOP/s")
    for name, _, _, split in KERNELS:
        r = max(x[name] for x in rounds)
        each = " ".join(f"{x[name]:.0f}" for x in rounds)
        print(f"{name}:\n  bf16 best {r:.0f} GFLOP/s (rounds: {each}); as fp32 products, "
              f"{r / split:.0f} GFLOP/s = {r / split / peak:.2f}x the fp32 peak")
    if a.capsule:
        ms = time_capsule(a.capsule)
        ort_ms = ms["ONNX Runtime Einsum"]
        print(f"capsule, 1 thread, medians of at least {a.capsule} alternating runs (the AMX "
              "gemm without its pack):")
        for k, v in ms.items():
            print(f"  {k:22s} {v:7.3f} ms  ORT/this {ort_ms / v:.2f}")


if __name__ == "__main__":
    main()
