"""A convolution written for one image, lifted over a (batch, time) video, against mlpack's
batched convolution of the same data, side by side in one process (issue 23's lifting bar).

    python -m benchmarks.lifted_conv [--threads 1,2] [--batch 4 --time 8 --size 28 --channels 64]

One DSL function, a 'same' 3x3 convolution of an image {x, y, ci} (``conv2d``, as
tests/codegen/dsl/test_lift.py writes it), built three ways into containers for this host's
cpu target and timed alternating (packager/bench.py ``time_alternating``) on the same seeded
video:

* ``lifted``: a custom ONNX op whose node takes the video [b, t, x, y, ci] itself, so the
  function is lifted over b and t (the op registers only x y ci);
* ``dsl batched``: the same function registered over one batch dim, on the video with b and t
  merged [b*t, x, y, ci] (a reshape that moves nothing, outside the timing): what lifting
  should equal;
* ``onnx Conv``: an ONNX Conv node (NCHW) on the video's images [b*t, ci, x, y] (transposed
  outside the timing), mlpack's own batched convolution: its channels-last pass transposes
  inside the run.

Prints each one's median and fastest run at each thread count and their ratios to ``lifted``'s
(the bar: lifted within 10% of the batched ones; on a shared machine the fastest runs are the
steadier measure), and each one's error against a float64 NumPy convolution.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

from mlpack.codegen import dsl

DOMAIN = "benchmarks.lifted"


def conv2d(image, kernel):
    """A 'same' 3x3 convolution of one image (x, y, ci)."""
    x, y = image.dim("x"), image.dim("y")
    kx, ky, ci = dsl.dims("kx ky ci")
    return dsl.sum[kx, ky, ci](image(x=x + kx - 1, y=y + ky - 1, pad=0.0) * kernel)


# the lifted op names only the image's dims: a node with more axes is lifted over them
dsl.register(DOMAIN, "Conv2dImage", conv2d, inputs={"image": "x y ci", "kernel": "kx ky ci co"},
             outputs={"out": "x y co"})
# the batched op names the batch dim itself
dsl.register(DOMAIN, "Conv2dBatch", conv2d,
             inputs={"image": "n x y ci", "kernel": "kx ky ci co"}, outputs={"out": "n x y co"})


def _value(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(node, ins, outs, inits=(), custom=True) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(DOMAIN, 1)] if custom else [])
    m = helper.make_model(helper.make_graph([node], node.op_type, ins, outs, list(inits)),
                          opset_imports=opsets)
    m.ir_version = 8
    return m


def models(b, t, s, c, kernel) -> dict[str, onnx.ModelProto]:
    """The three models; ``kernel`` [kx, ky, ci, co] is an initializer of each."""
    k_init = onnx.numpy_helper.from_array(kernel, "K")
    oihw = onnx.numpy_helper.from_array(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1)), "W")
    lifted = _model(helper.make_node("Conv2dImage", ["V", "K"], ["out"], domain=DOMAIN),
                    [_value("V", [b, t, s, s, c])], [_value("out", [b, t, s, s, c])], [k_init])
    batched = _model(helper.make_node("Conv2dBatch", ["I", "K"], ["out"], domain=DOMAIN),
                     [_value("I", [b * t, s, s, c])], [_value("out", [b * t, s, s, c])], [k_init])
    conv = _model(helper.make_node("Conv", ["X", "W"], ["out"], pads=[1, 1, 1, 1]),
                  [_value("X", [b * t, c, s, s])], [_value("out", [b * t, c, s, s])], [oihw],
                  custom=False)
    return {"lifted": lifted, "dsl batched": batched, "onnx Conv": conv}


def reference(video, kernel):
    """float64 NumPy: every (b, t) image convolved, zero padding 1: [b, t, x, y, co]."""
    v = np.pad(video.astype(np.float64), [(0, 0), (0, 0), (1, 1), (1, 1), (0, 0)])
    s = video.shape[2]
    out = 0
    for kx in range(3):
        for ky in range(3):
            out = out + np.einsum("btxyc,co->btxyo", v[:, :, kx:kx + s, ky:ky + s],
                                  kernel[kx, ky].astype(np.float64))
    return out


def host_target() -> str:
    from mlpack.runtime import detect_host
    host = detect_host()
    return f"x86_64-v{host.x86_level}" if host.x86_level and host.x86_level >= 2 else "aarch64"


def main(argv=None) -> int:
    from mlpack.packager.bench import load_mlpack, time_alternating
    from mlpack.packager.build import build

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--time", type=int, default=8)
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    b, t, s, c = args.batch, args.time, args.size, args.channels
    rng = np.random.default_rng(0)
    video = rng.standard_normal((b, t, s, s, c)).astype(np.float32)
    kernel = (rng.standard_normal((3, 3, c, c)) / np.sqrt(9 * c)).astype(np.float32)
    feeds = {"lifted": {"V": video}, "dsl batched": {"I": video.reshape(b * t, s, s, c)},
             "onnx Conv": {"X": np.ascontiguousarray(
                 video.reshape(b * t, s, s, c).transpose(0, 3, 1, 2))}}
    as_video = {"lifted": lambda y: y,
                "dsl batched": lambda y: y.reshape(b, t, s, s, c),
                "onnx Conv": lambda y: y.transpose(0, 2, 3, 1).reshape(b, t, s, s, c)}
    want = reference(video, kernel)
    target = host_target()
    print(f"video [b={b}, t={t}, x={s}, y={s}, ci={c}], 3x3 'same' convolution to {c} "
          f"channels, {target}; load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="lifted-conv-") as tmp:
        paths = {}
        for name, model in models(b, t, s, c, kernel).items():
            src = os.path.join(tmp, name.replace(" ", "_") + ".onnx")
            onnx.save(model, src)
            paths[name] = src.removesuffix(".onnx") + ".mlpack"
            build(src, paths[name], targets=[target], inputs=feeds[name], cache=False)
        for threads in [int(x) for x in args.threads.split(",")]:
            mods = {name: load_mlpack(p, threads) for name, p in paths.items()}
            fns = {name: (lambda m=m, f=feeds[name]: m.run(f)) for name, m in mods.items()}
            times, results = time_alternating(fns, repeat=args.repeat, min_seconds=10.0,
                                              max_seconds=90.0)
            base = times["lifted"].median_s
            parts = []
            for name, tm in times.items():
                got = as_video[name](results[name]["out"])
                err = float(np.abs(got - want).max() / np.abs(want).max())
                parts.append(f"{name} {1e3 * tm.median_s:.2f} ms ({tm.median_s / base:.3f}x "
                             f"lifted's; min {1e3 * tm.min_s:.2f} ms, "
                             f"{tm.min_s / times['lifted'].min_s:.3f}x; error {err:.1e})")
            print(f"{threads} thread(s): " + "; ".join(parts))
            for m in mods.values():
                m.close()
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
