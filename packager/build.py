"""``mlpack build``: one ONNX model in, one container out, every artifact in it proven to run.

    report = build("model.onnx", "model.mlpack")            # all implemented targets/precisions
    build(model, out, dims={"batch": 2}, cases=2, seed=0)   # test-vector shapes and data

The steps, each timed in ``BuildReport.timings`` and announced through ``progress``:

1. **import** and **compile** the model (``codegen.compile_onnx``) into an IR graph;
2. **reference outputs**: seeded inputs (or the user's ``.npz``), the float64 reference outputs
   (``reference.float64_outputs``) and ONNX Runtime's fp32 outputs for them, the test vectors
   every artifact carries (``testvectors.py``). Outputs the vectors cannot judge (the same for
   every case or element) are warned about (``BlindVectorsWarning``);
3. **lower** each requested target x precision into an artifact, with its weights and the
   vectors: the portable program, and per cpu target (x86_64-v2/v3/v4, aarch64) the kernels
   compiled by ``compile_cpu`` (an ELF library plus its plan), each timed on its own
   (``BuildReport.target_seconds``). A cpu target that cannot lower some op of the model is
   skipped with a warning (``BuildReport.skipped``; the portable artifact still runs the model)
   unless the caller named it, which makes it an error;
4. **validate**: the container is written to a scratch file and opened with the runtime, exactly
   as a user would; every artifact this host can run runs the vectors (native ones in the C
   engine, libmlpack), judged against the float64 reference by ``spec/accuracy.py``: each
   output's error within its precision's multiple of ONNX Runtime's own error. One that misses
   it, or cannot run at all, is dead on arrival and the build fails (``DeadOnArrivalError``)
   with no output;
5. **write** the final container (deterministic bytes, atomic rename) with each artifact's
   measured accuracy in its config. The scratch file is removed whatever happens, Ctrl-C
   included, and the output path only ever appears complete. The output path is checked before
   anything is compiled.

A target or precision that is planned but not implemented (cuda; fp16, bf16, int8) is refused by
name, never skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mlpack.codegen import precisions as precision_modules
from mlpack.codegen.passes import recompute
from mlpack.codegen.precisions.int8 import quantizes
from mlpack.codegen.targets import registry
from mlpack.codegen.targets.base import Code
from mlpack.spec import accuracy, media
from mlpack.spec.container import ArtifactSpec, Layer, make_config, write_container
from mlpack.spec.errors import Error
from mlpack.packager import customops
from mlpack.packager import testvectors as tv
# config inputs and outputs; a SignatureError for a size the container cannot state
from mlpack.packager.signature import model_signature

# every target and precision mlpack knows, from their registries (codegen/targets/registry.py,
# codegen/precisions/): what a build makes by default, and what it refuses as planned
TARGETS = registry.names()
IMPLEMENTED_TARGETS = registry.implemented()
DEFAULT_TARGETS = registry.defaults()
PRECISIONS = precision_modules.names()
IMPLEMENTED_PRECISIONS = precision_modules.implemented()


class BuildError(Error):
    """The build cannot go on: an unknown or unimplemented target, a model it cannot package."""


class DeadOnArrivalError(BuildError):
    """An artifact fails its own test vectors on the build host; no container is written."""

    index: int | None = None   # the failing artifact's index in the build's pairs
    missed: bool = False       # it ran and missed its tolerance (not: it could not run)


@dataclass
class ArtifactReport:
    """One artifact of a finished build and what validating it measured."""

    target: str
    device: str
    precision: str
    validated: bool  # False where this host cannot run it (another machine will)
    cases: int = 0
    # worst over the outputs, against the float64 reference (spec/accuracy.py)
    max_error: float | None = None      # max |y - ref| / max |ref|
    rel_l2: float | None = None         # ||y - ref|| / ||ref||
    max_abs_error: float | None = None  # max |y - ref|
    baseline_max_error: float | None = None  # ONNX Runtime's own max_error (the fp32 floor)
    top1: float | None = None           # worst top-1 agreement of class-score outputs
    seconds: float | None = None  # compiling this target's code (None: portable, nothing to do)
    reason: str = ""  # why it was not validated here
    emulator: str = ""  # the qemu-user program it was validated under; "" when this host ran it
    # inexact passes (winograd, bf16_products) left out because the first build of it missed
    # its precision's tolerance
    dropped_passes: tuple[str, ...] = ()
    # int8: the activations kept in f32 after quantizing them all missed the tolerance
    f32_activations: int = 0


@dataclass
class BuildReport:
    """What ``build`` wrote: the file, its parts' sizes, the artifacts and the time per step."""

    path: str
    name: str
    size: int
    reference: str
    cases: int
    artifacts: list[ArtifactReport]
    layer_sizes: dict[str, int]  # code, weights, vectors: bytes, each blob counted once
    # seconds per step: import, compile, reference, lower, validate, write
    timings: dict[str, float] = field(default_factory=dict)
    # seconds compiling each native target (part of timings["lower"])
    target_seconds: dict[str, float] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (target, why) not built
    blind_spots: list[str] = field(default_factory=list)  # outputs the vectors cannot judge
    # the kernel cache (packager/cache.py): targets x precisions reused and compiled anew,
    # entries found corrupt; empty when the build ran without it
    cache: dict = field(default_factory=dict)


# ---------------------------------------------------------------- choosing what to build


def _pick(asked, known: tuple[str, ...], implemented: tuple[str, ...], what: str,
          default: tuple[str, ...] | None = None) -> list[str]:
    """The requested names, checked; ``default`` (all implemented ones) when none were asked
    for."""
    if not asked:
        return list(implemented if default is None else default)
    out = []
    for name in asked:
        if name not in known:
            raise BuildError(f"unknown {what} {name!r}; {what}s are: {', '.join(known)}")
        if name not in implemented:
            raise BuildError(f"{what} {name} is not implemented yet (planned); available: "
                             f"{', '.join(implemented)}")
        if name not in out:
            out.append(name)
    return out


class TargetPrecisionError(BuildError):
    """A target named with --target builds none of the precisions asked for."""


def plan_artifacts(targets=None, precisions=None) -> list[tuple[str, str]]:
    """(target, precision) pairs to build, each precision on the targets that build it; the
    portable fp32 artifact is always among them (the spec promises that every container runs
    somewhere)."""
    targets = registry.expand(targets)   # (--target cuda: every cuda level)
    names = _pick(targets, registry.names(), registry.implemented(), "target", registry.defaults())
    wanted = _pick(precision_modules.expand(precisions), precision_modules.names(),
                   precision_modules.implemented(), "precision", precision_modules.defaults())
    pairs = [(t, p) for t in names for p in wanted if p in registry.get(t).precisions]
    for t in targets or ():
        if not any(n == t for n, _ in pairs):
            raise TargetPrecisionError(f"target {t} builds {', '.join(registry.get(t).precisions)}, "
                                       f"not {', '.join(wanted)}")
    if (registry.ALWAYS, "fp32") not in pairs:
        pairs.insert(0, (registry.ALWAYS, "fp32"))
    return pairs


# ---------------------------------------------------------------- progress


class _Steps:
    """Times the steps and tells ``progress`` (a callable taking one line) when each starts."""

    def __init__(self, progress: Callable[[str], None] | None):
        self.progress = progress
        self.timings: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str, detail: str = ""):
        if self.progress:
            self.progress(f"{name}{' ' + detail if detail else ''}...")
        t0 = time.perf_counter()
        yield
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0


# ---------------------------------------------------------------- the pieces


def _compile(proto):
    from mlpack.codegen.compile import compile_onnx
    from mlpack.codegen.onnx.builder import NeedsValue

    try:
        return compile_onnx(proto)
    except NeedsValue as e:
        raise BuildError(f"{e}; mlpack build packages models whose shapes follow from their "
                         "input shapes only (this one needs an input's value at compile time)") from None


def _number(value) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None  # JSON has no inf


def _accuracy(baseline: str, precision: str, check=None) -> dict:
    """The config's ``accuracy``: what the errors are measured against, the tolerance (of
    ``precision``: the artifact's, or int8's for a model that quantizes itself), and (once
    validated) the worst errors and each output's (spec/SPEC.md, "Accuracy")."""
    acc = {"reference": accuracy.REFERENCE, "baseline": baseline,
           "tolerance": accuracy.TOLERANCES[precision].to_json()}
    if check is None:
        return acc
    outputs = {}
    for o in check.outputs:
        entry = {"max_error": o.max_error, "rel_l2": o.rel_l2, "max_abs_error": o.max_abs_error,
                 "baseline_max_error": o.baseline_max_error, "baseline_rel_l2": o.baseline_rel_l2,
                 "top1": o.top1}
        numbers = {k: _number(v) for k, v in entry.items()}
        outputs[o.name] = {k: v for k, v in numbers.items() if v is not None}
    for key in ("max_error", "rel_l2", "max_abs_error", "baseline_max_error", "top1"):
        values = [e[key] for e in outputs.values() if key in e]
        if values:
            acc[key] = min(values) if key == "top1" else max(values)
    acc["outputs"] = outputs
    return acc


class SkippedTargetWarning(UserWarning):
    """A cpu target cannot lower the model (the op is named); the container runs through its
    portable artifact there instead. Naming the target explicitly makes this a BuildError."""


@dataclass
class _Native:
    """One (target, precision) compiled: the code, its weights archive and how long it took."""

    code: Code
    weights: bytes
    seconds: float
    dropped: tuple[str, ...] = ()   # inexact passes left out after the first try missed
    f32_activations: int = 0        # int8 activations kept in f32 after the first try missed


def _skip_reason(error: Exception) -> str:
    return str(error).removeprefix("cpu: ")


def _compile_one(graph, target: str, precision: str = "fp32", disabled=frozenset(),
                 calibration=None):
    """One target's code (in a worker process for the slow ones): (Code, seconds), or the
    UnsupportedTargetError saying what it cannot lower. ``disabled``: the target's passes to
    leave out; ``calibration``: what the precision needs beside the graph (int8's ranges)."""
    from mlpack.codegen.errors import UnsupportedTargetError

    from mlpack.codegen.progress import reporting
    from mlpack.packager.progress import done

    t0 = time.perf_counter()
    try:
        with reporting((target, precision)):   # what the progress display says is compiling
            code = registry.get(target).compile(
                precision_modules.apply(precision, graph, calibration), precision,
                frozenset(disabled))
    except UnsupportedTargetError as e:
        return e, 0.0
    finally:
        done((target, precision))
    return code, time.perf_counter() - t0


# Models with at least this many ops compile their cpu targets in parallel worker processes
# (LLVM's optimizer is most of a build: resnet50 spends ~10 s per target in it). Smaller ones
# compile in this process, where a worker's start (importing llvmlite and mlpack) would cost
# more than it saves.
PARALLEL_MIN_OPS = 64


def _compile_all(graph, pairs: list[tuple[str, str]], calibrations: dict) -> dict:
    """{(target, precision): (Code or UnsupportedTargetError, seconds)}: the slow targets in
    parallel worker processes when it pays, the others here. ``calibrations``: per precision,
    what it needs beside the graph."""
    slow = [pair for pair in pairs if registry.get(pair[0]).parallel]
    one = lambda pair: _compile_one(graph, *pair, calibration=calibrations.get(pair[1]))  # noqa: E731
    results = {pair: one(pair) for pair in pairs if pair not in slow}
    workers = min(len(slow), os.cpu_count() or 1)
    if workers < 2 or len(graph.ops) < PARALLEL_MIN_OPS:
        results.update((pair, one(pair)) for pair in slow)
        return {pair: results[pair] for pair in pairs}
    import multiprocessing
    import signal
    import threading
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: the build process has ONNX Runtime's threads running by now
    from mlpack.packager.progress import pool_options

    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context, **pool_options(context))
    processes = pool._processes  # private, but the only handle on the workers
    futures, failed = {}, []

    def start() -> None:
        # The workers start (on submit) in a thread of their own, so a Ctrl-C, raised in the
        # main thread, cannot cut one's start in half (it would die with a traceback), and with
        # SIGINT blocked, a mask they inherit through exec: a terminal sends them Ctrl-C too,
        # and this process answers it, not they.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            futures.update((pair, pool.submit(_compile_one, graph, *pair, frozenset(),
                                              calibrations.get(pair[1]))) for pair in slow)
        except BaseException as e:  # after the shutdown below, too: it starts no more workers
            failed.append(e)

    try:
        starter = threading.Thread(target=start, name="mlpack-compile-start")
        starter.start()
        starter.join()
        if failed:
            raise failed[0]
        results.update((pair, f.result()) for pair, f in futures.items())
    except BaseException:
        # Ctrl-C (or a failed compile): stop now, not after the other targets' LLVM runs. The
        # shutdown waits out a submit under way, so ``processes`` is complete after it.
        pool.shutdown(wait=False, cancel_futures=True)
        for process in list(processes.values()):
            process.terminate()
        raise
    pool.shutdown()
    return {pair: results[pair] for pair in pairs}


def _compile_tracked(progress, graph, pairs, calibrations) -> dict:
    """_compile_all with a live line on ``progress`` saying what compiles (packager/progress.py)."""
    from mlpack.packager.progress import tracking

    with tracking(progress, pairs):
        return _compile_all(graph, pairs, calibrations)


def _archive(code: Code, shared: dict) -> bytes:
    """The weights archive of ``code``, one bytes object per distinct archive (``shared``): the
    writer stores equal blobs once anyway, and _layer_sizes counts by identity."""
    from mlpack.spec.tensorfile import write_tensors

    archive = write_tensors(code.weights)
    return shared.setdefault(archive, archive)


def compile_targets(pairs, graph, explicit, step, progress,
                    calibrations=None, cache=None) -> tuple[dict, list]:
    """Compile every requested (target, precision): ({pair: _Native}, [(target, why skipped)]).

    A target that cannot lower the model is skipped, or a BuildError if it is in ``explicit``
    (the portable one lowers every model). ``cache``: the KernelCache (packager/cache.py) that
    the code of earlier builds is reused from and this one's is stored in; None compiles all."""
    from mlpack.codegen.errors import UnsupportedTargetError
    from mlpack.packager.cache import compile_cached

    compiled, skipped, shared = {}, [], {}
    slow = [pair for pair in pairs if registry.get(pair[0]).parallel]
    label = ", ".join(dict.fromkeys(t for t, _ in slow))
    with step("lower", f"{label} {'/'.join(dict.fromkeys(p for _, p in slow))}" if slow else ""):
        results = compile_cached(cache, graph, pairs, calibrations or {},
                                 functools.partial(_compile_tracked, progress),
                                 lambda code: _archive(code, shared))
    hits = set(cache.stats.hits) if cache is not None else set()
    for pair in pairs:
        target = pair[0]
        code, seconds, weights = results[pair]
        if isinstance(code, UnsupportedTargetError):
            if target in explicit or target == registry.ALWAYS:
                raise BuildError(f"{target}: {_skip_reason(code)} (asked for with --target "
                                 f"{target}; leave it out to build the portable artifact)"
                                 ) from None
            skipped.append((target, _skip_reason(code)))
            continue
        compiled[pair] = _Native(code, shared.setdefault(weights, weights) if weights
                                 else _archive(code, shared), seconds)
        if progress and pair in hits and pair in slow:
            progress(f"  {target}: from the kernel cache ({seconds:.2f}s)")
        elif progress and pair in slow:
            t = code.timings
            progress(f"  {target}: {seconds:.1f}s (lower {t.get('lower', 0):.1f}s, "
                     f"llvm {t.get('llvm', 0):.1f}s, link {t.get('link', 0):.1f}s)")
    return compiled, skipped


def skip_lines(skipped) -> list[str]:
    """One warning line per reason, naming every target it skipped."""
    by_reason: dict[str, list[str]] = {}
    for target, why in skipped:
        by_reason.setdefault(why, []).append(target)
    return [f"{', '.join(targets)}: skipped: {why}; the container still runs through the portable "
            "artifact" for why, targets in by_reason.items()]


def artifact_spec(name: str, target: str, precision: str, code: Code, weights: bytes, sig,
                  reference: str, *, vectors: bytes | None = None, check=None,
                  judged_as: str | None = None) -> ArtifactSpec:
    """The ArtifactSpec of one artifact, the same for every target: ``code`` is what the target
    compiled, ``weights`` its weights archive, ``sig`` the ``model_signature``, ``check`` the
    validation that fills in measured accuracy. ``vectors`` (the test vectors layer) may be left
    out: ``mlpack.backend``'s native mode runs without them."""
    t = registry.get(target)
    config = make_config(name, *sig, device=t.device, precision=precision, target=target,
                         cpu_features=code.config.get("cpu_features", ()), plan=code.config.get("plan"),
                         cuda_sm=code.config.get("cuda_sm"),
                         accuracy=_accuracy(reference, judged_as or precision, check),
                         min_runtime=media.MIN_RUNTIME)
    if check is not None and check.seconds is not None:
        config["latency"] = {"seconds": check.seconds, "threads": 1, "runs": TIMED_RUNS,
                             "inputs": "test case 0", "host": _host_name()}
    layers = [Layer(mt, data) for mt, data in code.layers] + [Layer(media.WEIGHTS, weights)]
    if vectors is not None:
        layers.append(Layer(media.TESTVECTORS, vectors))
    return ArtifactSpec(config, layers, t.platform and dict(t.platform))


def _host_name() -> str:
    """The build host as a latency's record names it: its CPU and the level it runs."""
    from mlpack.runtime import detect_host
    from mlpack.runtime.host import cpu_name

    host = detect_host()
    level = f" x86-64 v{host.x86_level}" if host.x86_level else ""
    return f"{cpu_name() or host.arch}{level} ({host.os}/{host.arch})"


def _lower(pairs, name, graph, vectors, reference, judged_as, checks,
           compiled) -> list[ArtifactSpec]:
    """One ArtifactSpec per (target, precision); ``checks`` fills in measured accuracy."""
    sig = model_signature(graph)
    return [artifact_spec(name, target, precision, compiled[target, precision].code,
                          compiled[target, precision].weights, sig, reference, vectors=vectors,
                          check=checks.get(i), judged_as=judged_as)
            for i, (target, precision) in enumerate(pairs)]


# ---------------------------------------------------------------- validation


def _scratch_path(output: str) -> str:
    """A new empty file next to ``output``, for the container under validation."""
    folder = os.path.dirname(os.path.abspath(output))
    fd, path = tempfile.mkstemp(prefix=f".{os.path.basename(output)}.", suffix=".validating",
                                dir=folder)
    os.close(fd)
    return path


def _dead_on_arrival(result, pairs, output: str,
                     where: str = "on this host") -> DeadOnArrivalError:
    i = result.artifact.index
    target, precision = pairs[i]
    bad = [o for o in result.outputs if not o.ok]
    if result.cases == 0:
        detail = "it carries no test vectors"
    else:
        detail = "; ".join(o.detail() for o in bad)
    hint = ""
    if precision_modules.calibrates(precision) and result.cases:
        hint = (f" ({precision} quantizes to ranges calibrated on random inputs unless "
                "--calibration gives real ones; or build without it)")
    error = DeadOnArrivalError(f"artifact {i} ({target}, {precision}) fails its test vectors "
                               f"{where}: {detail}{hint}; nothing written to {output}")
    error.index, error.missed = i, result.cases > 0
    return error


def _validate_one(model, i: int, pairs, output: str):
    """The vectors on artifact ``i``: its ValidationResult, or DeadOnArrivalError."""
    try:
        result = model.validate(i)
    except Error as e:  # the engine cannot load or run the code: as dead as a wrong answer
        target, precision = pairs[i]
        raise DeadOnArrivalError(f"artifact {i} ({target}, {precision}) cannot run on this "
                                 f"host: {e}; nothing written to {output}") from None
    if not result.ok:
        raise _dead_on_arrival(result, pairs, output)
    return result


# A build runs another CPU's vectors under qemu for this long at most (they run side by side):
# a small network's take seconds there, ResNet-50's a minute, which a build should not wait for
EMULATION_SECONDS = 10.0


def _validate_emulated(path: str, verdict, emu, pairs, output: str, progress, runs=None):
    """Artifact ``verdict.artifact`` of another architecture under qemu-user
    (packager/emulate.py): its ValidationResult; DeadOnArrivalError as _validate_one, or
    emulate.NotEmulated where qemu could not run it after all."""
    from mlpack.packager import emulate

    i = verdict.artifact.index
    target, precision = pairs[i]
    if progress:
        progress(f"  validate {target} {precision} under {emu.qemu}")
    try:
        result = emulate.validate(path, verdict.artifact, verdict.reason, emu, progress,
                                  timeout=EMULATION_SECONDS, trusted_keys="",   # its own file
                                  runs=runs)
    except emulate.NotEmulated:
        raise
    except Error as e:  # it ran and the engine failed, or the program crashed
        raise DeadOnArrivalError(f"artifact {i} ({target}, {precision}) cannot run under "
                                 f"{emu.qemu}: {e}; nothing written to {output}") from None
    if not result.ok:
        raise _dead_on_arrival(result, pairs, output, f"under {emu.qemu}")
    return result


def validate_container(path: str, pairs, output: str, progress=None,
                       runs=None) -> tuple[dict, dict]:
    """Open ``path`` with the runtime and run the vectors on every artifact this host can run,
    and under qemu-user on those of another architecture where it is installed
    (packager/emulate.py); ``runs``: the kernel cache whose stored emulated outputs of the
    same artifact bytes are judged instead of running qemu again.

    Returns ({artifact index: ValidationResult}, {index: why not run}); raises
    DeadOnArrivalError for the first artifact that fails."""
    from mlpack.packager import emulate
    from mlpack.runtime import load
    from mlpack.spec.errors import PortableFallbackWarning, UnsignedContainerWarning

    from concurrent.futures import ThreadPoolExecutor

    checks, passed_over, emulated = {}, {}, {}
    # the emulated runs (one qemu process each, minutes for a big model) go side by side, and
    # beside the native ones
    pool = ThreadPoolExecutor(max(1, os.cpu_count() or 1), thread_name_prefix="mlpack-qemu")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PortableFallbackWarning)  # the build host is not the target
            warnings.simplefilter("ignore", UnsignedContainerWarning)  # the file it just wrote
            with load(path, trusted_keys="") as model:
                native = []
                for verdict in model.verdicts:
                    i = verdict.artifact.index
                    if verdict.runnable:
                        native.append(i)
                        continue
                    why = verdict.reason.removeprefix("passed over: ")
                    emu = emulate.emulator_for(verdict.artifact, model.host.arch)
                    missing = emulate.missing(emu) if emu else ""
                    if emu and not missing:
                        emulated[i] = (why, pool.submit(_validate_emulated, path, verdict, emu, pairs,
                                                        output, progress, runs))
                    else:
                        passed_over[i] = why + (f"; not run under emulation: {missing}" if missing
                                                else "")
                for i in native:
                    if progress:
                        progress(f"  validate {pairs[i][0]} {pairs[i][1]}")
                    checks[i] = _validate_one(model, i, pairs, output)
        for i, (why, future) in sorted(emulated.items()):
            try:
                checks[i] = future.result()
            except emulate.NotEmulated as e:
                passed_over[i] = f"{why}; not run under emulation: {e}"
        _time_precisions(path, pairs, native, checks, progress)   # (qemu done: a quiet host)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return checks, passed_over


TIMED_RUNS = 5   # runs of the first test case timed per artifact, at one thread (the median counts)


def _time_precisions(path: str, pairs, native: list[int], checks: dict, progress) -> None:
    """Time this host's native artifacts when the build makes several precisions (one thread,
    the first test case), so that selection under an accuracy budget ranks them by what was
    measured rather than by their target's level and precision's name (spec/SPEC.md section 5):
    a variant with 16-bit weights can be slower than fp32 where the arithmetic, not the memory,
    bounds a run, and bf16 products slower than f32 on a model of depthwise convolutions."""
    from mlpack.runtime import load
    from mlpack.spec.errors import PortableFallbackWarning, UnsignedContainerWarning

    if len({p for _, p in pairs}) < 2:
        return
    timed = [i for i in native if registry.get(pairs[i][0]).device != "portable"]
    if not timed:
        return
    if progress:
        progress(f"  time {len(timed)} artifacts of several precisions (1 thread)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PortableFallbackWarning)
        warnings.simplefilter("ignore", UnsignedContainerWarning)
        model = load(path, threads=1, trusted_keys="")   # its own file: no trust policy applies
    with model:
        for i in timed:
            checks[i] = dataclasses.replace(checks[i], seconds=model.time(i, TIMED_RUNS))


# ---------------------------------------------------------------- the driver


def _model_name(proto, model, name: str | None) -> str:
    if name:
        return name
    if isinstance(model, (str, os.PathLike)):
        return Path(model).stem or "model"
    return proto.graph.name or "model"


def _vectors(proto, graph, inputs, dims, seed: int, cases: int, custom=()):
    """(inputs, the baseline's outputs, float64 reference outputs), one dict per case; the
    baseline is ONNX Runtime, or with DSL custom ops (``custom``) the fp32 interpreter
    (packager/customops.py). The interpreter evaluates the model as imported, before any pass
    (``reference.as_written``): what the artifacts are judged against owes nothing to the
    compiler's rewrites."""
    from mlpack.packager.reference import as_written, float64_outputs

    if inputs is None:
        feeds = tv.random_cases(graph, dims=dims, cases=cases, seed=seed)
    else:  # one case per .npz path or dict
        many = inputs if isinstance(inputs, (list, tuple)) else [inputs]
        feeds = [case for one in many for case in
                 (tv.user_case(one, graph, "inputs") if isinstance(one, dict)
                  else tv.load_npz(one, graph))]
    source = as_written(proto)
    outputs = customops.baseline_outputs(proto, source, feeds, custom)
    return feeds, outputs, float64_outputs(source, feeds)


class ReferenceMismatchError(BuildError):
    """ONNX Runtime and the float64 reference disagree: the vectors would prove nothing."""


def check_references(expected: list[dict], references: list[dict], quantized: bool = False) -> None:
    """Refuse vectors whose two references disagree (``accuracy.disagreement``). A model that
    quantizes itself (QDQ, QLinear ops: ``int8.quantizes``) steps where its roundings do, and
    ONNX Runtime's integer kernels round its requantizations otherwise than float64 does, so
    its references may differ by a quantization step anywhere: they need only agree within
    int8's cap, and its artifacts are judged with int8's tolerance whatever their precision."""
    worst: dict[str, accuracy.Errors] = {}
    for ort_out, ref in zip(expected, references):
        for name, r in ref.items():
            if name in ort_out:
                e = accuracy.measure(ort_out[name], r)
                worst[name] = worst[name].worst(e) if name in worst else e
    why = accuracy.disagreement(worst, accuracy.TOLERANCES["int8"].cap if quantized else None)
    if why:
        raise ReferenceMismatchError(
            f"ONNX Runtime and mlpack's float64 reference disagree on the test inputs, {why}: "
            "mlpack does not compute this model as ONNX Runtime does (a bug in mlpack: please "
            "report it), or the inputs sit where the model is discontinuous (try --inputs)")


class BlindVectorsWarning(UserWarning):
    """The test vectors cannot tell a right artifact from a wrong one for some output (it is
    the same for every case or every element); ``--inputs`` gives better ones."""


def check_output_path(output: str) -> None:
    """Refuse an output path the container cannot be written to, before any slow work."""
    folder = os.path.dirname(os.path.abspath(output)) or "."
    if os.path.isdir(output):
        raise BuildError(f"{output}: is a folder; give a file path for the container (-o)")
    if not os.path.isdir(folder):
        raise BuildError(f"{output}: folder {folder} does not exist (-o)")
    try:  # a probe, not os.access: root passes that test on a read-only file system
        _remove(_scratch_path(output))
    except OSError as e:
        raise BuildError(f"{output}: cannot write into folder {folder} (-o): "
                         f"{e.strerror or e}") from None


def _layer_sizes(artifacts: list[ArtifactSpec]) -> dict[str, int]:
    kinds = {media.WEIGHTS: "weights", media.TESTVECTORS: "vectors"}
    sizes, seen = {"code": 0, "weights": 0, "vectors": 0}, set()
    for a in artifacts:
        for layer in a.layers:
            key = (layer.media_type, id(layer.data))
            if key not in seen:  # a blob shared between artifacts is stored once
                seen.add(key)
                sizes[kinds.get(layer.media_type, "code")] += len(layer.data)
    return sizes


def build(model, output, *, targets=None, precisions=None, inputs=None, dims=None, seed: int = 0,
          cases: int = 2, name: str | None = None, calibration=None,
          progress: Callable[[str], None] | None = None, cache=True, ops=(),
          memory_budget=None) -> BuildReport:
    """Compile ``model`` (a path, bytes or ModelProto) into the container ``output``.

    ``targets``/``precisions``: names to build (default: every implemented one); ``inputs``: a
    ``.npz`` path (or a dict) of test inputs instead of random ones, or a list of them (one
    test case each); ``dims``: sizes for the size
    symbols in the random inputs (default 1); ``seed``/``cases``: the random test vectors;
    ``name``: the model name (default: the file's stem); ``calibration``: the inputs int8 takes
    its activation ranges from, a directory of ``.npz`` files (or a list of input dicts;
    default: CALIBRATION_CASES seeded random input sets); ``progress``: called with a line as
    each step starts; ``cache``: reuse and store each target's compiled code in the kernel
    cache (packager/cache.py: MLPACK_CACHE_DIR, or this folder when a path), False to compile
    everything; ``ops``: modules (``.py`` paths or dotted names) that register custom ops
    written in the DSL (packager/customops.py), imported first; ``memory_budget``: bytes (an int,
    or a string like ``"64MB"``) the graph may keep in intermediates the ``recompute`` pass could
    recompute instead (codegen/passes/recompute.py; default: no cap, its cost model decides).
    Raises an ``mlpack.Error`` and writes nothing if any step fails.
    """
    from mlpack.codegen.onnx.importer import load_model

    output = os.fspath(output)
    budget = recompute.as_bytes(memory_budget)
    try:   # refuse bad names before any slow work
        pairs = plan_artifacts(targets, precisions)
    except TargetPrecisionError:
        if precisions:
            raise
        pairs = None   # the default precision may be int8 (a quantized model): see below
    customops.load(ops)
    check_output_path(output)
    step = _Steps(progress)
    with step("import"):
        proto = load_model(model)
    name = _model_name(proto, model, name)
    custom = customops.used(proto)
    baseline = customops.baseline_name(custom)
    with step("compile"), recompute.memory_budget(budget):
        graph = _compile(proto)
        model_signature(graph)  # a size the container cannot state stops the build here
    quantized = quantizes(graph)
    if quantized and not precisions:   # the default is the model's own precision
        pairs = plan_artifacts(targets, ["int8"])
    elif pairs is None:
        pairs = plan_artifacts(targets, precisions)   # the error deferred above
    with step("reference", f"outputs (float64; {baseline})"):
        feeds, expected, references = _vectors(proto, graph, inputs, dims, seed, cases, custom)
        check_references(expected, references, quantized)
        vectors = tv.pack(feeds, expected, baseline, references)
    blind = accuracy.blind_spots(references)
    _warn(BlindVectorsWarning, blind, progress)
    calibrations = _calibrate(pairs, graph, calibration, dims, seed, step)
    sensitive: list = []   # int8's full calibration, then its activations by sensitivity
    kernels = _kernel_cache(cache)
    compiled, skipped = compile_targets(pairs, graph, set(targets or ()), step, progress,
                                        calibrations, kernels)
    _warn_skipped(skipped, progress)
    pairs = [pair for pair in pairs if pair in compiled]
    # a quantized model's artifacts are judged with int8's tolerance (see check_references)
    lower = customops.recording(custom, functools.partial(
        _lower, pairs, name, graph, vectors, baseline, "int8" if quantized else None))
    while True:
        artifacts = lower({}, compiled)
        scratch = _scratch_path(output)
        try:
            with step("validate", "every artifact this host runs"):
                write_container(scratch, name, artifacts)
                checks, passed_over = validate_container(scratch, pairs, output, progress,
                                                         kernels)
            break
        except DeadOnArrivalError as e:
            if not (_direct_again(e, pairs, compiled, graph, progress, calibrations, kernels)
                    or _quantize_less(e, pairs, compiled, graph, progress, calibrations, kernels,
                                      sensitive, lambda: calibration_inputs(graph, calibration,
                                                                            dims, seed)[0])):
                raise
        finally:
            _remove(scratch)
    with step("write"):
        artifacts = lower(checks, compiled)
        write_container(output, name, artifacts)
    seconds = {t: n.seconds for (t, _), n in compiled.items() if registry.get(t).parallel}
    reports = _reports(pairs, artifacts, checks, passed_over, seconds)
    for report, pair in zip(reports, pairs):
        report.dropped_passes = compiled[pair].dropped
        report.f32_activations = compiled[pair].f32_activations
    report = BuildReport(output, name, os.path.getsize(output), baseline, len(feeds),
                         reports, _layer_sizes(artifacts), step.timings, seconds, skipped, blind)
    if kernels is not None:
        report.cache = {"folder": str(kernels.folder), "hits": len(kernels.stats.hits),
                        "misses": len(kernels.stats.misses), "dropped": kernels.stats.dropped}
    return report


# random input sets int8 calibrates on when the user gives none (seeded apart from the vectors,
# so the artifact is not judged on the inputs it was calibrated on)
CALIBRATION_CASES = 8
CALIBRATION_SEED = 1 << 20


def calibration_inputs(graph, calibration, dims, seed: int) -> list[dict]:
    """The input sets to calibrate on: every ``.npz`` of the directory ``calibration`` (sorted by
    name), the dicts of a list, or CALIBRATION_CASES random sets."""
    if calibration is None:
        return tv.random_cases(graph, dims=dims, cases=CALIBRATION_CASES,
                               seed=seed + CALIBRATION_SEED)
    if isinstance(calibration, (list, tuple)):
        return [c for one in calibration for c in tv.user_case(one, graph, "calibration")]
    folder = Path(calibration)
    if not folder.is_dir():
        raise BuildError(f"{folder}: not a directory (--calibration takes a directory of .npz "
                         "files, an array per model input in each)")
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise BuildError(f"{folder}: no .npz files in it (--calibration)")
    return [c for f in files for c in tv.load_npz(f, graph)]


def _calibrate(pairs, graph, calibration, dims, seed: int, step) -> dict:
    """{precision: its calibration} for the precisions of ``pairs`` that need one."""
    wanted = [p for p in dict.fromkeys(p for _, p in pairs) if precision_modules.calibrates(p)]
    if not wanted:
        return {}
    with step("calibrate", ", ".join(wanted)):
        feeds = calibration_inputs(graph, calibration, dims, seed)
        return {p: precision_modules.calibrate(p, graph, feeds) for p in wanted}


def _kernel_cache(cache):
    """The KernelCache ``build``'s ``cache`` argument names: None for False."""
    from mlpack.packager.cache import KernelCache

    if cache is False or cache is None:
        return None
    return KernelCache(None if cache is True else cache)


def _direct_again(error: DeadOnArrivalError, pairs, compiled: dict, graph, progress,
                  calibrations: dict, cache=None) -> bool:
    """Compile the failing artifact again without its inexact passes, if it ran any (the cpu
    target's Winograd convolutions: their rounding, codegen/targets/cpu/winograd.py, is the one
    difference from the direct sums that the tolerance may not cover). Whether it did so."""
    pair = pairs[error.index] if error.index is not None else None
    native = compiled.get(pair)
    if native is None or not native.code.inexact_passes:
        return False
    passes = native.code.inexact_passes
    if progress:
        progress(f"  {pair[0]}: {', '.join(passes)} misses the {pair[1]} tolerance; compiling "
                 f"without it")
    _compile_again(cache, graph, [pair], compiled, calibrations, disabled=passes)
    return True


def _compile_again(cache, graph, again: list, compiled: dict, calibrations: dict,
                   disabled=frozenset(), f32_activations: int = 0) -> None:
    """Compile the pairs ``again`` once more (through the kernel cache) into ``compiled``,
    their seconds added to the first try's: a retry after an artifact missed its tolerance."""
    from mlpack.packager.cache import compile_cached

    one = lambda g, ps, cal: {p: _compile_one(g, *p, disabled=disabled,  # noqa: E731
                                              calibration=cal.get(p[1])) for p in ps}
    results = compile_cached(cache, graph, again, calibrations, one, lambda c: _archive(c, {}),
                             disabled=disabled)
    for p in again:
        code, seconds, weights = results[p]
        compiled[p] = _Native(code, weights or _archive(code, {}), compiled[p].seconds + seconds,
                              tuple(disabled), f32_activations)


def _quantize_less(error: DeadOnArrivalError, pairs, compiled: dict, graph, progress,
                   calibrations: dict, cache, sensitive: list, calibration_feed) -> bool:
    """After an int8 artifact ran and missed its tolerance: keep the activations whose
    quantization alone moves the outputs most (``int8.most_sensitive``, measured once into
    ``sensitive``) in f32, 1, 2, 4, ... of them up to half, and compile every int8 artifact
    again with the rest quantized; whether it did. The mixed precision ONNX Runtime's and
    TensorRT's users reach by excluding layers by hand, found by measurement."""
    from mlpack.codegen.precisions import int8

    pair = pairs[error.index] if error.index is not None else None
    if pair is None or pair[1] != "int8" or not error.missed or not calibrations.get("int8"):
        return False
    if not sensitive:
        sensitive.append(dict(calibrations["int8"]))
        sensitive.extend(int8.most_sensitive(graph, sensitive[0], calibration_feed()))
    full, order = sensitive[0], sensitive[1:]
    kept = max(1, 2 * compiled[pair].f32_activations)
    if kept > len(order) // 2:
        return False
    if progress:
        progress(f"  int8 misses its tolerance on {pair[0]}; compiling every int8 artifact again "
                 f"with the {kept} most sensitive of {len(order)} quantized activations in f32")
    calibrations["int8"] = {n: r for n, r in full.items() if n not in order[:kept]}
    _compile_again(cache, graph, [p for p in pairs if p[1] == "int8"], compiled, calibrations,
                   f32_activations=kept)
    return True


def _warn_skipped(skipped, progress) -> None:
    _warn(SkippedTargetWarning, skip_lines(skipped), progress)


def _warn(kind: type, lines: list[str], progress) -> None:
    for line in lines:
        if progress:
            progress(f"warning: {line}")
        warnings.warn(kind(line), stacklevel=4)


def _reports(pairs, artifacts: list[ArtifactSpec], checks: dict, passed_over: dict,
             seconds: dict) -> list[ArtifactReport]:
    out = []
    for i, ((target, precision), art) in enumerate(zip(pairs, artifacts)):
        device = art.config["artifact"]["device"]
        report = ArtifactReport(target, device, precision, i in checks, seconds=seconds.get(target),
                                reason=passed_over.get(i, ""))
        if i in checks:
            result = checks[i]
            acc = art.config["accuracy"]
            report.cases, report.emulator = result.cases, result.emulator
            report.max_error, report.rel_l2 = acc.get("max_error"), acc.get("rel_l2")
            report.max_abs_error = acc.get("max_abs_error")
            report.baseline_max_error, report.top1 = acc.get("baseline_max_error"), acc.get("top1")
        out.append(report)
    return out


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["build", "BuildReport", "ArtifactReport", "BuildError", "DeadOnArrivalError",
           "SkippedTargetWarning", "BlindVectorsWarning", "ReferenceMismatchError",
           "check_output_path", "artifact_spec", "model_signature", "TARGETS", "PRECISIONS",
           "IMPLEMENTED_TARGETS", "DEFAULT_TARGETS", "IMPLEMENTED_PRECISIONS"]
