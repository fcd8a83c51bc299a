"""Fixtures for the C execution tests (test_run.c): containers plus their expected results.

    python3 runtime/c/tests/make_fixtures.py OUT_DIR

Native: tests/kernels/mlp_kernels.c is compiled (cc -shared -fPIC -nostdlib) into kernel
libraries (a good one, one with a wrong ABI version, one without the table symbol, one with a
version-1 table that records no bindings, one whose bindings are malformed) and put in cpu artifacts with a plan (SPEC.md section
7), some of which disagree with the kernels' bindings (ABI 1.3). Portable: small IR graphs (spec/ir text) cover
each construct of the interpreter; their expected outputs come from the NumPy reference
interpreter (spec.ir.interp.run_graph). For every container NAME.mlpack, NAME.vectors is a
tensor archive of "case<i>/input/<name>" and "case<i>/output/<name>" arrays ({"cases": N}).
OUT_DIR/fixtures.list names the portable fixtures, one a line.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "..")))  # mlpack importable from the checkout

from mlpack.spec import container as c  # noqa: E402
from mlpack.spec import media  # noqa: E402
from mlpack.spec.ir import parse_graph, run_graph  # noqa: E402
from mlpack.spec.ir.program import dumps_program  # noqa: E402
from mlpack.spec.tensorfile import write_tensors  # noqa: E402

RNG = np.random.default_rng(7)
ACCURACY = {"reference": "test", "max_abs_error": 0.0, "max_rel_error": 0.0, "rtol": 1e-5, "atol": 1e-6}

# ---------------------------------------------------------------- portable graphs

PORTABLE = {
    # sum reduction with a constant, symbolic batch, output stored transposed
    "matmul": ("""graph "matmul" {
  in %a: f32{n=$n, k=6} (n, k)
  const %b: f32{k=6, m=2} (k, m) = [0.5, -1.0, 2.0, 0.25, -0.75, 1.5, 1.0, 0.0, -2.0, 3.0, 0.125, -0.5]
  %c: f32{n=$n, m=2} = sum{k=6} %a[n=n, k=k] * %b[k=k, m=m]
  out %c (m, n)
}""", lambda: [{"a": RNG.standard_normal((5, 6)).astype(np.float32)},
               {"a": RNG.standard_normal((1, 6)).astype(np.float32)}]),
    # padded reads with a stride: conv1d, and maxpool over -inf padding
    "conv_pool": ("""graph "conv_pool" {
  in %x: f32{c=2, t=9} (c, t)
  in %w: f32{o=3, c=2, k=3} (o, c, k)
  %y: f32{o=3, p=5} = sum{c=2, k=3} %x[c=c, t=2 * p + k - 1; pad=0.0] * %w[o=o, c=c, k=k]
  %m: f32{o=3, q=3} = max{j=3} %y[o=o, p=2 * q + j - 1; pad=-inf]
  out %y (o, p)
  out %m (o, q)
}""", lambda: [{"x": RNG.standard_normal((2, 9)).astype(np.float32),
                "w": RNG.standard_normal((3, 2, 3)).astype(np.float32)}]),
    # arg reductions with ties (first vs last), and min/prod over two dims
    "argreduce": ("""graph "argreduce" {
  in %x: i32{n=6, k=5} (n, k)
  %i: i64{n=6} = argmax{k=5} %x[n=n, k=k]
  %j: i64{n=6} = argmin_last{k=5} %x[n=n, k=k]
  %lo: i32{} = min{a=6, b=5} %x[n=a, k=b]
  %pr: i64{n=6} = prod{k=5} cast<i64>(%x[n=n, k=k]) + 1
  out %i (n)
  out %j (n)
  out %lo ()
  out %pr (n)
}""", lambda: [{"x": RNG.integers(-3, 3, (6, 5)).astype(np.int32)}]),
    # softmax: max, exp, sum, div
    "softmax": ("""graph "softmax" {
  in %x: f32{n=$n, c=5} (n, c)
  %m: f32{n=$n} = max{k=5} %x[n=n, c=k]
  %e: f32{n=$n, c=5} = exp(%x[n=n, c=c] - %m[n=n])
  %s: f32{n=$n} = sum{k=5} %e[n=n, c=k]
  %y: f32{n=$n, c=5} = div(%e[n=n, c=c], %s[n=n])
  out %y (n, c)
}""", lambda: [{"x": (RNG.standard_normal((4, 5)) * 3).astype(np.float32)}]),
    # gather: an index read from another tensor; broadcast over a dim the body ignores
    "gather": ("""graph "gather" {
  in %table: f32{v=10, e=3} (v, e)
  in %ids: i64{s=$s} (s)
  %emb: f32{s=$s, e=3, r=2} = %table[v=%ids[s=s], e=e]
  out %emb (r, s, e)
}""", lambda: [{"table": RNG.standard_normal((10, 3)).astype(np.float32),
                "ids": np.array([3, 0, 9, 3], np.int64)}]),
    # integer arithmetic: truncating div, Python-style floordiv/mod, C-style fmod, shifts, wrap
    "intops": ("""graph "intops" {
  in %a: i32{n=8} (n)
  in %b: i32{n=8} (n)
  %q: i32{n=8} = div(%a[n=n], %b[n=n])
  %f: i32{n=8} = floordiv(%a[n=n], %b[n=n])
  %r: i32{n=8} = mod(%a[n=n], %b[n=n])
  %fm: i32{n=8} = fmod(%a[n=n], %b[n=n])
  %sl: i32{n=8} = shl(%a[n=n], abs(%b[n=n]))
  %sr: i32{n=8} = shr(%a[n=n], abs(%b[n=n]))
  %w: i8{n=8} = cast<i8>(%a[n=n]) * cast<i8>(100:i32)
  %bits: i32{n=8} = bitxor(bitand(%a[n=n], 12:i32), bitnot(%b[n=n]))
  %mx: i32{n=8} = max(%a[n=n], %b[n=n]) - min(%a[n=n], %b[n=n])
  out %q (n)
  out %f (n)
  out %r (n)
  out %fm (n)
  out %sl (n)
  out %sr (n)
  out %w (n)
  out %bits (n)
  out %mx (n)
}""", lambda: [{"a": np.array([7, -7, 7, -7, 0, 100, -2147483647, 5], np.int32),
                "b": np.array([2, 2, -2, -2, 3, 0, 3, 33], np.int32)}]),
    # casts (float->int truncates, non-finite -> 0; ->bool; ->f16), rounding, unary math
    "casts_math": ("""graph "casts_math" {
  in %x: f32{n=10} (n)
  %i: i32{n=10} = cast<i32>(%x[n=n])
  %u: u8{n=10} = cast<u8>(cast<i32>(%x[n=n]))
  %b: bool{n=10} = cast<bool>(%x[n=n])
  %h: f16{n=10} = cast<f16>(%x[n=n] * 1000.0)
  %rd: f32{n=10} = round(%x[n=n])
  %fl: f32{n=10} = floor(%x[n=n]) + ceil(%x[n=n]) + sign(%x[n=n])
  %t: f32{n=10} = select(isnan(%x[n=n]), -1.0, tanh(%x[n=n]) + sigmoid(%x[n=n]) + erf(%x[n=n]))
  %p: f32{n=10} = pow(abs(%x[n=n]), 0.5) + sqrt(abs(%x[n=n])) + fmod(%x[n=n], 1.5) + mod(%x[n=n], 1.5)
  %fd: f32{n=10} = floordiv(%x[n=n], 0.75)
  %c: bool{n=10} = and(gt(%x[n=n], 0.0), not(isinf(%x[n=n])))
  out %i (n)
  out %u (n)
  out %b (n)
  out %h (n)
  out %rd (n)
  out %fl (n)
  out %t (n)
  out %p (n)
  out %fd (n)
  out %c (n)
}""", lambda: [{"x": np.array([0.5, 1.5, 2.5, -0.5, -1.7, 300.9, np.nan, np.inf, -np.inf, 0.0], np.float32)}]),
    # a procedure with a data-dependent size (NonZero): For, If, Let, Store, SetSize
    "nonzero": ("""graph "nonzero" {
  in %x: f32{n=$len} (n)
  %idx: i64{k=$nnz}, %val: f32{k=$nnz} = proc bounds{$nnz=$len} {
    let count: i64 = 0
    for i in $len {
      if ne(%x[n=i], 0.0) {
        %idx[k=count] = i
        %val[k=count] = %x[n=i] * 2.0
        let count: i64 = count + 1
      }
    }
    size $nnz = count
  }
  %after: f32{k=$nnz} = %val[k=k] + 1.0
  out %idx (k)
  out %after (k)
}""", lambda: [{"x": np.array([0, 1.5, 0, -2, 3, 0], np.float32)},
               {"x": np.zeros(4, np.float32)}]),
    # a procedure with a While loop, an else branch and a local tensor (prefix sums)
    "prefix": ("""graph "prefix" {
  in %x: f32{n=$len} (n)
  %y: f32{n=$len}, %steps: i64{one=1} = proc locals{%t: f32{n=$len}} {
    let acc: f32 = 0.0
    for i in $len {
      let acc: f32 = acc + %x[n=i]
      %t[n=i] = acc
    }
    for i in $len {
      if gt(%t[n=i], 0.0) {
        %y[n=i] = %t[n=i]
      } else {
        %y[n=i] = 0.0
      }
    }
    let v: i64 = 1000
    let s: i64 = 0
    while gt(v, 1) {
      let v: i64 = floordiv(v, 3)
      let s: i64 = s + 1
    }
    %steps[one=0] = s
  }
  out %y (n)
  out %steps (one)
}""", lambda: [{"x": RNG.standard_normal(11).astype(np.float32)}]),
    # two inputs sharing symbols; output layout differs from the signature order
    "two": ("""graph "two" {
  in %ids: i64{batch=$batch, seq=$seq} (batch, seq)
  in %mask: f32{batch=$batch, seq=$seq} (batch, seq)
  in %scale: f32{c=3} (c)
  %y: f32{batch=$batch, seq=$seq, c=3} = cast<f32>(%ids[batch=batch, seq=seq]) * %mask[batch=batch, seq=seq] * %scale[c=c]
  out %y (c, batch, seq)
}""", lambda: [{"ids": RNG.integers(0, 9, (2, 8)).astype(np.int64),
                "mask": RNG.standard_normal((2, 8)).astype(np.float32),
                "scale": np.array([1.0, -2.0, 0.5], np.float32)}]),
}


def _size(e):
    return "$" + e.arg if e.op == "sym" else e.arg


def _sig(g, name):
    ty = g.types[name]
    port = next(p for p in g.inputs + g.outputs if p.name == name)
    return c.signature(name, ty.dtype, [(d, _size(ty.dims[d])) for d in port.layout])


def portable_artifact(g) -> c.ArtifactSpec:
    config = c.make_config(g.name, [_sig(g, p.name) for p in g.inputs], [_sig(g, p.name) for p in g.outputs],
                           device="portable", precision="fp32", target="portable", accuracy=ACCURACY)
    weights = write_tensors({k.name: k.data for k in g.constants.values()})
    return c.ArtifactSpec(config, [c.Layer(media.PROGRAM_PORTABLE, dumps_program(g)), c.Layer(media.WEIGHTS, weights)])


def vectors(g, cases) -> bytes:
    tensors = {}
    for i, feeds in enumerate(cases):
        outs = run_graph(g, feeds)
        for name, a in feeds.items():
            tensors[f"case{i}/input/{name}"] = np.array(a, order="C")
        for name, a in outs.items():
            tensors[f"case{i}/output/{name}"] = np.array(a, order="C")
    return write_tensors(tensors, {"cases": len(cases)})


def write_portable(out: str) -> list[str]:
    names = []
    for name, (text, cases) in PORTABLE.items():
        g = parse_graph(text)
        c.write_container(os.path.join(out, name + ".mlpack"), g.name, [portable_artifact(g)])
        with open(os.path.join(out, name + ".vectors"), "wb") as f:
            f.write(vectors(g, cases()))
        names.append(name)
    return names


# ---------------------------------------------------------------- native (hand-written kernels)


def build_kernels(out: str, name: str, defines=()) -> bytes:
    path = os.path.join(out, name + ".so")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", "-nostdlib", "-ffreestanding", "-fno-builtin", "-O2",
                    "-fvisibility=hidden", "-fno-tree-loop-distribute-patterns",
                    "-I", os.path.join(HERE, "..", "include"), *[f"-D{d}" for d in defines],
                    os.path.join(HERE, "kernels", "mlp_kernels.c"), "-o", path], check=True)
    with open(path, "rb") as f:
        return f.read()


def host_target() -> str:
    return "aarch64" if platform.machine() in ("aarch64", "arm64") else "x86_64-v2"


def mlp_plan(second_kernel: int = 1, weight_b: str = "b") -> dict:
    rows = ["mul", "$batch", 12]  # bytes of a [batch, 3] f32 scratch
    return {"abi": 1, "symbols": ["batch"], "symbol_sources": [{"symbol": "batch", "input": 0, "axis": 0}],
            "buffers": [{"kind": "input", "index": 0}, {"kind": "weight", "name": "w"},
                        {"kind": "arena", "offset": 64, "size": rows}, {"kind": "weight", "name": weight_b},
                        {"kind": "output", "index": 0}],
            "arena_size": ["add", rows, 64], "arena_align": 64,
            "dispatches": [{"kernel": 0, "workgroups": "$batch", "bindings": [0, 1, 2]},
                           {"kernel": second_kernel, "workgroups": "$batch", "bindings": [2, 3, 4]}]}


def rebound_plan(dispatch: int, bindings: list[int]) -> dict:
    """mlp_plan with dispatch ``dispatch`` binding ``bindings`` instead (ABI 1.3's checks)."""
    plan = mlp_plan()
    plan["dispatches"][dispatch]["bindings"] = bindings
    return plan


def computed_plan(minor: int = 1, bound="$n") -> dict:
    """Plan ABI 1.1: $count is computed by dispatch 0 (kernel `compact`), bounded by $n."""
    scratch = ["mul", "$n", 4]
    return {"abi": 1, "abi_minor": minor, "symbols": ["n", "count"],
            "symbol_sources": [{"symbol": "n", "input": 0, "axis": 0},
                               {"symbol": "count", "dispatch": 0, "bound": bound}],
            "buffers": [{"kind": "input", "index": 0}, {"kind": "output", "index": 0, "shape": ["$count"]},
                        {"kind": "arena", "offset": 0, "size": scratch}],
            "arena_size": scratch, "arena_align": 64,
            "dispatches": [{"kernel": 3, "workgroups": 1, "bindings": [2, 0]},
                           {"kernel": 4, "workgroups": "$count", "bindings": [1, 2]}]}


def write_native_computed(out: str, lib: bytes, target: str, features) -> None:
    """native_computed*: a data-dependent output size through a computed symbol."""
    sig_in = [c.signature("x", "f32", [("n", "$n")])]
    sig_out = [c.signature("y", "f32", [("k", "$count")])]
    variants = {"native_computed": computed_plan(), "native_computed_newer": computed_plan(minor=9),
                "native_computed_unbounded": computed_plan(bound=1)}
    for name, plan in variants.items():
        config = c.make_config("compact", sig_in, sig_out, device="cpu", precision="fp32", target=target,
                               accuracy=ACCURACY, cpu_features=features, plan=plan)
        art = c.ArtifactSpec(config, [c.Layer(media.CODE_ELF, lib)], media.platform_for(target))
        c.write_container(os.path.join(out, name + ".mlpack"), "compact", [art])
    tensors = {}
    xs = [np.array([1.5, -2, 0, 3, -1, 0.25], np.float32), -np.ones(3, np.float32), np.zeros(0, np.float32)]
    for i, x in enumerate(xs):
        tensors[f"case{i}/input/x"] = x
        tensors[f"case{i}/output/y"] = 2 * x[x > 0]
    with open(os.path.join(out, "native_computed.vectors"), "wb") as f:
        f.write(write_tensors(tensors, {"cases": len(xs)}))


def write_native(out: str) -> None:
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    b = np.array([0.1, -0.2, 0.3], np.float32)
    weights = write_tensors({"w": w, "b": b})
    target = host_target()
    sig_in = [c.signature("x", "f32", [("batch", "$batch"), ("c", 4)])]
    sig_out = [c.signature("y", "f32", [("batch", "$batch"), ("m", 3)])]
    features = ("neon",) if target == "aarch64" else ()
    libs = {"good": build_kernels(out, "kernels_good"), "bad_abi": build_kernels(out, "kernels_bad_abi", ["BAD_ABI"]),
            "no_table": build_kernels(out, "kernels_no_table", ["NO_TABLE"]),
            "table_v1": build_kernels(out, "kernels_table_v1", ["TABLE_V1"]),
            "bad_bindings": build_kernels(out, "kernels_bad_bindings", ["BAD_BINDINGS"])}
    variants = {"native_mlp": ("good", mlp_plan()), "native_bad_abi": ("bad_abi", mlp_plan()),
                "native_no_table": ("no_table", mlp_plan()), "native_fail": ("good", mlp_plan(second_kernel=2)),
                "native_no_weight": ("good", mlp_plan(weight_b="ghost")),
                "native_bad_kernel": ("good", {**mlp_plan(), "dispatches": [{"kernel": 9, "workgroups": 1, "bindings": []}]}),
                # ABI 1.3: a version-1 table still runs; a version-2 one is checked against
                "native_table_v1": ("table_v1", mlp_plan()),
                "native_bad_bindings": ("bad_bindings", mlp_plan()),
                "native_missing_binding": ("good", rebound_plan(1, [2, 3])),
                "native_weight_written": ("good", rebound_plan(1, [2, 4, 3])),
                "native_input_written": ("good", rebound_plan(0, [2, 1, 0]))}
    for name, (lib, plan) in variants.items():
        config = c.make_config("mlp", sig_in, sig_out, device="cpu", precision="fp32", target=target,
                               accuracy=ACCURACY, cpu_features=features, plan=plan)
        art = c.ArtifactSpec(config, [c.Layer(media.CODE_ELF, libs[lib]), c.Layer(media.WEIGHTS, weights)],
                             media.platform_for(target))
        c.write_container(os.path.join(out, name + ".mlpack"), "mlp", [art])
    write_native_computed(out, libs["good"], target, features)
    cases = []
    for batch in (5, 37):
        x = RNG.standard_normal((batch, 4)).astype(np.float32)
        cases.append((x, np.maximum(x @ w + b, 0).astype(np.float32)))
    tensors = {}
    for i, (x, y) in enumerate(cases):
        tensors[f"case{i}/input/x"] = x
        tensors[f"case{i}/output/y"] = y
    with open(os.path.join(out, "native_mlp.vectors"), "wb") as f:
        f.write(write_tensors(tensors, {"cases": len(cases)}))


def main(argv: list[str]) -> int:
    out = argv[1] if len(argv) > 1 else os.path.join(HERE, "..", "build", "fixtures")
    os.makedirs(out, exist_ok=True)
    names = write_portable(out)
    write_native(out)
    with open(os.path.join(out, "fixtures.list"), "w") as f:
        f.write("\n".join(names) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
