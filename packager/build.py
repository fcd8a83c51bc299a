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

import functools
import math
import os
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
from mlpack.packager import compiling, customops, heap, onethread, validation
from mlpack.packager import testvectors as tv
from mlpack.packager import weights as weights_files
from mlpack.packager.errors import BuildError, DeadOnArrivalError
from mlpack.packager.validation import validate_container
# config inputs and outputs; a SignatureError for a size the container cannot state
from mlpack.packager.signature import model_signature

# every target and precision mlpack knows, from their registries (codegen/targets/registry.py,
# codegen/precisions/): what a build makes by default, and what it refuses as planned
TARGETS = registry.names()
IMPLEMENTED_TARGETS = registry.implemented()
DEFAULT_TARGETS = registry.defaults()
PRECISIONS = precision_modules.names()
IMPLEMENTED_PRECISIONS = precision_modules.implemented()


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
    # int8: the contractions that sum 8-bit integers (0: none of the model's takes them, so the
    # artifact computes in f32); None for other precisions
    integer_sums: int | None = None


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


def _cached_file_graph(source, kernels):
    """The compiled graph the kernel cache holds under the model file's digest (packager/
    source.py: stored only for a file without external data, with no custom op), or None. Not
    while a DSL op is registered: a node of its domain would import through it now."""
    if kernels is None or source.file_key is None or customops.registered():
        return None
    return kernels.get_graph(source.file_key)


def _compile_cached(source, kernels, found) -> tuple:
    """(the compiled graph, the key to store it under or None, the model's custom ops, its key
    or None): ``found`` (``_cached_file_graph``), else from the kernel cache where it holds
    this model's graph (packager/cache.py, ``graphs/``), else compiled. A model with custom ops
    is compiled each time (its DSL functions are code the key does not cover). No key without
    a cache."""
    if found is not None:
        return found, None, [], source.file_key
    model = source.importable()
    custom = customops.used(source.proto())
    if kernels is None:
        return _compile(model), None, custom, None
    k = source.key()
    if custom:
        return _compile(model), None, custom, k
    graph = kernels.get_graph(k)
    return (graph, None, custom, k) if graph is not None else (_compile(model), k, custom, k)


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


# one target's compile (the name tests put their own in place of)
_compile_one = compiling.compile_one


def skip_lines(skipped) -> list[str]:
    """One warning line per reason, naming every target it skipped."""
    by_reason: dict[str, list[str]] = {}
    for target, why in skipped:
        by_reason.setdefault(why, []).append(target)
    return [f"{', '.join(targets)}: skipped: {why}; the container still runs through the portable "
            "artifact" for why, targets in by_reason.items()]


def artifact_spec(name: str, target: str, precision: str, code: Code, weights, sig,
                  reference: str, *, vectors: bytes | None = None, check=None,
                  judged_as: str | None = None) -> ArtifactSpec:
    """The ArtifactSpec of one artifact, the same for every target: ``code`` is what the target
    compiled, ``weights`` its weights archive, ``sig`` the ``model_signature``, ``check`` the
    validation that fills in measured accuracy. ``weights``: the archive, bytes or a FileBlob
    (packager/weights.py). ``vectors`` (the test vectors layer) may be left out:
    ``mlpack.backend``'s native mode runs without them."""
    t = registry.get(target)
    config = make_config(name, *sig, device=t.device, precision=precision, target=target,
                         cpu_features=code.config.get("cpu_features", ()), plan=code.config.get("plan"),
                         cuda_sm=code.config.get("cuda_sm"),
                         accuracy=_accuracy(reference, judged_as or precision, check),
                         min_runtime=media.MIN_RUNTIME)
    if check is not None and check.seconds is not None:
        config["latency"] = {"seconds": check.seconds, "threads": 1, "runs": validation.TIMED_RUNS,
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


# ---------------------------------------------------------------- the driver


def _model_name(proto, model, name: str | None) -> str:
    if name:
        return name
    if isinstance(model, (str, os.PathLike)):
        return Path(model).stem or "model"
    return proto.graph.name or "model"


def _vectors(source, graph, inputs, dims, seed: int, cases: int, custom=(), cache=None,
             key: str | None = None, busy=lambda: False):
    """(inputs, the baseline's outputs, float64 reference outputs, the test-vector archive),
    one dict per case; the baseline is ONNX Runtime (on the model's file where it is one),
    or with DSL custom ops (``custom``) the fp32 interpreter (packager/customops.py). The
    interpreter evaluates the model as imported, before any pass (``reference.as_written``):
    what the artifacts are judged against owes nothing to the compiler's rewrites.
    ``source``: the model (packager/source.py; parsed only if the vectors are computed);
    ``cache``: the KernelCache that keeps the archive of the same model (``key``: its key)
    and inputs; ``busy()``: whether the compile workers hold the cores now (then ONNX Runtime
    and the reference's BLAS run on one thread: packager/onethread.py)."""
    from mlpack.packager.cache import vectors_key
    from mlpack.packager.reference import as_written, float64_outputs

    if inputs is None:
        feeds = tv.random_cases(graph, dims=dims, cases=cases, seed=seed)
    else:  # one case per .npz path or dict
        many = inputs if isinstance(inputs, (list, tuple)) else [inputs]
        feeds = [case for one in many for case in
                 (tv.user_case(one, graph, "inputs") if isinstance(one, dict)
                  else tv.load_npz(one, graph))]
    baseline = customops.baseline_name(custom)
    key = vectors_key(graph, key, feeds, baseline) if cache is not None and key else None
    stored = cache.get_vectors(key) if key is not None else None
    if stored is not None:
        _, outputs, references = tv.unpack(stored)
        return feeds, outputs, references, stored
    # (a file's weights are views of its mapping: let go while ONNX Runtime's session, which
    # reads the file itself, holds a copy of its own; a custom op's baseline is the
    # interpreter on the graph as written)
    written = as_written(source.importable()) if custom else None
    source.release()
    heap.release(collect=True)
    outputs = customops.baseline_outputs(source.proto(), [p.name for p in graph.outputs], feeds,
                                         custom, source.path, written,
                                         onethread.THREADS if busy() else 0)
    heap.release()
    references = float64_outputs(written or as_written(source.importable()), feeds,
                                 lambda: onethread.while_busy(busy))
    del written   # (the mapping is let go by the caller, which releases the source)
    heap.release(collect=True)
    vectors = tv.pack(feeds, outputs, baseline, references)
    if key is not None:
        cache.put_vectors(key, vectors)
    return feeds, outputs, references, vectors


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
        _remove(validation.scratch_path(output))
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
    from mlpack.packager.source import ModelSource

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
    validation.emulation_seconds()   # (a bad MLPACK_EMULATION_SECONDS stops it here)
    step = _Steps(progress)
    kernels = _kernel_cache(cache)
    with step("import"):
        # (a rebuild of an unchanged file finds its graph by the file's digest: not parsed;
        # the archive its last build used is checked meanwhile, on another core)
        if kernels is not None and isinstance(model, (str, os.PathLike)):
            kernels.check_ahead(model)
        source = ModelSource(model, budget, kernels is not None)
        found = _cached_file_graph(source, kernels)
        proto = source.proto() if found is None else None
    name = _model_name(proto, model, name)
    with step("compile"), recompute.memory_budget(budget):
        graph, graph_entry, custom, model_key = _compile_cached(source, kernels, found)
        model_signature(graph)  # a size the container cannot state stops the build here
    baseline = customops.baseline_name(custom)
    quantized = quantizes(graph)
    if quantized and not precisions:   # the default is the model's own precision
        pairs = plan_artifacts(targets, ["int8"])
    elif pairs is None:
        pairs = plan_artifacts(targets, precisions)   # the error deferred above
    # ONNX Runtime reads a model file itself: once the references are computed from the model
    # as written, the weights are in one place, the model's archive, a file the graph maps
    # (packager/weights.py)
    models = _models(graph, {}, kernels, output)
    started = None
    try:
        graph = models.graph("fp32")
        if graph_entry is not None and models.blob("fp32") is not None:
            kernels.put_graph(graph_entry, models.base, models.blob("fp32"))
        if source.file_key is not None and models.blob("fp32") is not None:
            kernels.put_hint(source.path, models.blob("fp32"))
        # (the import's copy of every weight freed: the archive's mapped file has them)
        models.rebase()
        heap.release()
        one = _compile_one   # (looked up now: a test may put another in its place)
        # the targets compile (in workers) while the references run here
        started = compiling.Started(one, models, compiling.early_pairs(pairs), progress, kernels)
        with step("reference", f"outputs (float64; {baseline})"):
            # (the compiled graph as the kernel cache keys it: its digest is taken once; the
            # fp32 graph, its constants mapped from the archive, is another object, and
            # hashing a 500 MB model's weights again took a third of a second)
            feeds, expected, references, vectors = _vectors(
                source, models.base, inputs, dims, seed, cases, custom, kernels, model_key,
                started.busy)
            source.release()   # (the graphs map the weights archive from here on)
            check_references(expected, references, quantized)
        blind = accuracy.blind_spots(references)
        _warn(BlindVectorsWarning, blind, progress)
        models.calibrations.update(_calibrate(pairs, graph, calibration, dims, seed, step))
        sensitive: list = []   # int8's full calibration, then its activations by sensitivity
        compiled, skipped = compiling.compile_targets(one, models, pairs, set(targets or ()),
                                                      step, progress, kernels, BuildError,
                                                      started)
        started = None
        _warn_skipped(skipped, progress)
        pairs = [pair for pair in pairs if pair in compiled]
        # a quantized model's artifacts are judged with int8's tolerance (see check_references)
        lower = customops.recording(custom, functools.partial(
            _lower, pairs, name, graph, vectors, baseline, "int8" if quantized else None))
        while True:
            artifacts = lower({}, compiled)
            scratch = validation.scratch_path(output)
            try:
                with step("validate", "every artifact this host runs"):
                    write_container(scratch, name, artifacts, durable=False)
                    checks, passed_over = validate_container(scratch, pairs, output, progress,
                                                             kernels)
                break
            except DeadOnArrivalError as e:
                if not (compiling.direct_again(one, e, pairs, compiled, models, progress, kernels)
                        or compiling.quantize_less(
                            one, e, pairs, compiled, models, progress, kernels, sensitive,
                            lambda: calibration_inputs(graph, calibration, dims, seed)[0])):
                    raise
            finally:
                _remove(scratch)
        with step("write"):
            artifacts = lower(checks, compiled)
            write_container(output, name, artifacts)
        sums = {p: _integer_sums(models.graph(p[1])) for p in pairs if p[1] == "int8"}
    finally:
        if started is not None:   # (the build failed before it collected the compile)
            started.cancel()
        models.close()
    seconds = {t: n.seconds for (t, _), n in compiled.items() if registry.get(t).parallel}
    reports = _reports(pairs, artifacts, checks, passed_over, seconds)
    for report, pair in zip(reports, pairs):
        report.dropped_passes = compiled[pair].dropped
        report.f32_activations = compiled[pair].f32_activations
        report.integer_sums = sums.get(pair)
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


def _models(graph, calibrations: dict, kernels, output: str) -> compiling.Models:
    """The build's models per precision (compiling.Models), their weights archives written in
    the kernel cache's blobs, or without one in a scratch folder beside ``output``."""
    if kernels is not None:
        return compiling.Models(graph, calibrations, kernels.folder / "blobs", kernels)
    return compiling.Models(graph, calibrations, weights_files.scratch_folder(output),
                            scratch=True)


def _kernel_cache(cache):
    """The KernelCache ``build``'s ``cache`` argument names: None for False."""
    from mlpack.packager.cache import KernelCache

    if cache is False or cache is None:
        return None
    return KernelCache(None if cache is True else cache)


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


def _integer_sums(graph) -> int:
    """How many contractions of ``graph`` sum in 32-bit integers (int8's, or a quantized
    model's own)."""
    return sum(1 for op in graph.ops if getattr(op, "reduce", None) == "sum"
               and op.type.dtype == "i32")


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["build", "BuildReport", "ArtifactReport", "BuildError", "DeadOnArrivalError",
           "SkippedTargetWarning", "BlindVectorsWarning", "ReferenceMismatchError",
           "check_output_path", "artifact_spec", "model_signature", "TARGETS", "PRECISIONS",
           "IMPLEMENTED_TARGETS", "DEFAULT_TARGETS", "IMPLEMENTED_PRECISIONS"]
