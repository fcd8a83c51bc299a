"""A build's validation: the container, written to a scratch file, opened with the runtime as a
user opens it, and the test vectors run on every artifact this host runs (native ones in the C
engine, libmlpack), and under qemu-user on those of another architecture where it is installed
(packager/emulate.py); each judged against the float64 reference by ``spec/accuracy.py``. An
artifact that misses its tolerance, or cannot run at all, is dead on arrival
(``DeadOnArrivalError``). A build of several precisions then times each native artifact, so
selection ranks them by what was measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from mlpack.codegen import cores
from mlpack.codegen import precisions as precision_modules
from mlpack.codegen.targets import registry
from mlpack.spec import environment
from mlpack.spec.errors import Error
from mlpack.packager.errors import DeadOnArrivalError
from mlpack.packager import heap, onethread


def scratch_path(output: str) -> str:
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


def _outputs_of(model, i: int, pairs, output: str, seconds: list | None = None) -> list[dict]:
    """The vectors run on artifact ``i``: its outputs per case, or DeadOnArrivalError;
    ``seconds`` gets each case's run time appended."""
    try:
        return model.vector_outputs(i, seconds)
    except Error as e:  # the engine cannot load or run the code: as dead as a wrong answer
        target, precision = pairs[i]
        raise DeadOnArrivalError(f"artifact {i} ({target}, {precision}) cannot run on this "
                                 f"host: {e}; nothing written to {output}") from None


# The portable interpreter runs beside a native artifact only for a model up to this size (its
# blobs): the two hold the weights twice (the interpreter's through the file, the native one's
# packed), which raised GPT-2's build peak 1.75 -> 2.4x its file; a small model's tail is where
# the time goes (Swin-T, 109 MiB, the slowest build of the real set)
BESIDE_BYTES = 128 << 20


def _interpreted(path: str, i: int, pairs, output: str) -> tuple[list[dict], tuple]:
    """The portable artifact ``i``'s outputs and its times (as the native runs store them),
    from an open of ``path`` of its own: it runs in a thread beside the native artifacts' runs
    (the engine's, outside the GIL), which read their blobs through the build's open."""
    from mlpack.runtime import load

    model = load(path, device="portable", trusted_keys="")
    try:
        with onethread.one_thread():   # (the other core runs the native artifacts)
            return _timed_outputs(model, i, pairs, output)
    finally:
        model.close()


def _timed_outputs(model, i: int, pairs, output: str) -> tuple[list[dict], tuple]:
    """``_outputs_of`` artifact ``i`` and the times a run stores: (the whole run's seconds,
    each case's)."""
    seconds: list = []
    started = time.perf_counter()
    got = _outputs_of(model, i, pairs, output, seconds)
    return got, (time.perf_counter() - started, *seconds)


def run_key(art) -> str:
    """What the outputs of ``art``'s vectors on this host follow from: the artifact's bytes (its
    manifest's digest covers its config, code, weights and vectors) and what runs them: the
    engine's library and this CPU, or the NumPy interpreter's sources. A rebuild that makes the
    same artifact judges the outputs its first build stored (the kernel cache's runs) anew
    against the reference, as the emulated runs' are (packager/emulate.py), without running it."""
    import hashlib

    from mlpack.runtime import detect_host, native

    h = hashlib.sha256(f"{art.descriptor.get('digest', '')}\0".encode())
    if art.device == "portable":
        import mlpack.runtime
        from mlpack.packager.cache import code_digest

        h.update(f"portable {code_digest()} numpy {np.__version__}".encode())
        for path in sorted(Path(mlpack.runtime.__path__[0]).glob("*.py")):
            h.update(path.read_bytes())
    else:
        host = detect_host()
        with open(native.library_path(), "rb") as f:
            h.update(f"native {hashlib.sha256(f.read()).hexdigest()} {host.arch} "
                     f"{host.x86_level} {sorted(host.cpu_features)}".encode())
    return h.hexdigest()


# A build runs another CPU's vectors under qemu for this long at most (they run side by side,
# after the targets compile): a small network's take seconds there, ResNet-50's a minute, which
# a build should not wait for. A build runs the first test cases predicted to fit (case 0 at
# the default sizes, the cheapest, first): case 0 shows the architecture's code runs and is
# right, and the native artifacts run every case, which shows the lowering's other shapes.
# 5 s, with a mobile network's compile of 10-13 s on 2 cores, keeps its build within 20 s
# (10 s made MobileNetV3's build 22-26 s: it waited for a riscv64 run of both cases).
EMULATION_SECONDS = 5.0
# What the emulated runs are predicted to take, from the same vectors' native run on this host:
# a start (qemu and the program), the engine's hashing of the artifact's blobs as it opens it,
# and a slowdown per architecture for the rest (the weights' packing included: the native run
# times it too). The hashing is per MB of the artifact: its digests are checked in the emulated
# code, several times slower than the run's own native load, and most of a big model's run when
# its test cases are small (DistilBERT's 253 MB took 6.3 s under qemu-aarch64 at sequence 1,
# predicted under 5 s from a start and a slowdown alone: started, killed at 5 s, its weights held
# beside the build's). Measured side by side, as a build runs them, on a 2-core AMD EPYC: a
# Gather from tables of 8-256 MB, 0.02 s per MB under qemu-aarch64 (its SHA-256 instructions
# emulated by helpers) and 0.012 under qemu-riscv64, a start of 0.05-0.1 s; the slowdowns against
# the fastest x86-64 artifact's vectors (2 cases, 2 threads): aarch64 285-1150x (median 466),
# riscv64 357-960x (median 588) over SqueezeNet, an MLP, MobileNetV2, MobileNetV3, RegNetY-400MF
# and DistilBERT (GEMMs emulate slowest: qemu runs vector FMAs through helpers).
# A run predicted past the limit is not started: it would most likely be killed there, after
# the build waited for it (one slowdown for both, 350x, started RegNetY's two runs and
# MobileNetV3's riscv64 one, and the build waited the whole 10 s for none of them to finish).
EMULATION_START_SECONDS = 0.1
EMULATION_SECONDS_PER_MB = {"arm64": 0.020, "riscv64": 0.012}
EMULATION_SLOWDOWN = {"arm64": 470.0, "riscv64": 600.0}


def emulation_seconds() -> float:
    """The build's limit on each emulated run: MLPACK_EMULATION_SECONDS, else
    EMULATION_SECONDS (a slower host or CI runner that wants every architecture validated in the
    build raises it; 0 runs none)."""
    text = environment.get("MLPACK_EMULATION_SECONDS").strip()
    if not text:
        return EMULATION_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):   # (nan too)
        raise Error(f"MLPACK_EMULATION_SECONDS={text!r}: expected a number of seconds >= 0")
    return seconds


def predicted_seconds(native_seconds: float | None, arch: str | None = None,
                      nbytes: int = 0) -> float | None:
    """What an emulated run on OCI architecture ``arch`` of the vectors that took
    ``native_seconds`` here should take, for an artifact of ``nbytes`` (its blobs, which the
    engine hashes as it opens them; an architecture not measured: the slowest known)."""
    if native_seconds is None:
        return None
    slowdown = EMULATION_SLOWDOWN.get(arch, max(EMULATION_SLOWDOWN.values()))
    per_mb = EMULATION_SECONDS_PER_MB.get(arch, max(EMULATION_SECONDS_PER_MB.values()))
    return EMULATION_START_SECONDS + per_mb * nbytes / 2 ** 20 + slowdown * native_seconds


def hashed_bytes(art) -> int:
    """The bytes the engine hashes as it opens artifact ``art``: all its blobs."""
    return sum(layer.size for layer in art.layers)


@dataclasses.dataclass(frozen=True)
class NativeRun:
    """One native run of an artifact's vectors: its seconds in all (the artifact's load
    included) and each case's run."""

    seconds: float
    cases: tuple[float, ...]

    def first(self, k: int) -> float:
        """The seconds a run of the first ``k`` cases alone would take, its load included."""
        return self.seconds - sum(self.cases[k:])


def emulated_cases(native: NativeRun | None, arch: str | None, count: int,
                   nbytes: int = 0) -> tuple[int, float | None]:
    """(how many of the first cases an emulated run on ``arch`` of an artifact of ``nbytes``
    runs, what that is predicted to take): as many as are predicted to fit within
    emulation_seconds(); where not even case 0 does, (1, its prediction), which the run refuses.
    No native run to predict from: all."""
    if native is None or len(native.cases) != count:
        return count, None
    k, limit = count, emulation_seconds()
    while k > 1 and predicted_seconds(native.first(k), arch, nbytes) > limit:
        k -= 1
    return k, predicted_seconds(native.first(k), arch, nbytes)


def _validate_emulated(path: str, verdict, emu, pairs, output: str, progress, runs,
                       cases: list, k: int, predicted: float | None):
    """Artifact ``verdict.artifact`` of another architecture under qemu-user
    (packager/emulate.py): its ValidationResult, over the first ``k`` of ``cases``, the run
    predicted to take ``predicted`` seconds (``emulated_cases``: the cases the build's limit
    fits); DeadOnArrivalError as _outputs_of, or emulate.NotEmulated where qemu could not run
    it after all, or is predicted not to within the limit."""
    from mlpack.packager import emulate

    i = verdict.artifact.index
    target, precision = pairs[i]
    if progress:
        some = f" (case{'s' * (k > 1)} {', '.join(map(str, range(k)))} of {len(cases)})" \
            if k < len(cases) else ""
        progress(f"  validate {target} {precision} under {emu.qemu}{some}")
    try:
        result = emulate.validate(path, verdict.artifact, verdict.reason, emu, progress,
                                  timeout=emulation_seconds(), trusted_keys="",   # its own file
                                  runs=runs, predicted=predicted, cases=cases[:k])
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
    (packager/emulate.py); ``runs``: the kernel cache whose stored outputs of the same artifact
    bytes (``run_key``; emulated ones: emulate.run_key) are judged instead of running it again.

    Returns ({artifact index: ValidationResult}, {index: why not run}); raises
    DeadOnArrivalError for the first artifact that fails."""
    from mlpack.packager import emulate
    from mlpack.runtime import detect_host, load
    from mlpack.runtime.model import judge_vectors, vector_cases
    from mlpack.spec.container import open_container
    from mlpack.spec.errors import PortableFallbackWarning, UnsignedContainerWarning

    from concurrent.futures import ThreadPoolExecutor

    checks, passed_over, emulated, to_emulate = {}, {}, {}, []
    # the emulated runs (one qemu process each, minutes for a big model) go side by side, and
    # beside the portable interpreter's; they start once the native code has run, which times
    # the vectors that predict them (``predicted_seconds``)
    pool = ThreadPoolExecutor(max(1, os.cpu_count() or 1), thread_name_prefix="mlpack-qemu")
    fastest: NativeRun | None = None

    running = []   # the emulated runs predicted to run (not refused at once): qemu processes

    def start_emulated():
        for verdict, emu, why in to_emulate:
            cases = vector_cases(container, verdict.artifact)
            k, predicted = emulated_cases(fastest, emu.arch, len(cases),
                                          hashed_bytes(verdict.artifact))
            if predicted is None or predicted <= emulation_seconds():
                running.append(verdict.artifact.index)
            emulated[verdict.artifact.index] = (why, pool.submit(
                _validate_emulated, path, verdict, emu, pairs, output, progress, runs,
                cases, k, predicted))
        to_emulate.clear()
    model = None
    stack = contextlib.ExitStack()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PortableFallbackWarning)  # the build host is not the target
            warnings.simplefilter("ignore", UnsignedContainerWarning)  # the file it just wrote
            container = stack.enter_context(open_container(path, verify=False))
            verdicts, model = _verdicts(container, path)
            arch = detect_host().arch
            reasons = {v.artifact.index: v.reason for v in verdicts}
            native = []
            for verdict in verdicts:
                i = verdict.artifact.index
                if verdict.runnable:
                    native.append(i)
                    continue
                why = verdict.reason.removeprefix("passed over: ")
                emu = emulate.emulator_for(verdict.artifact, arch)
                missing = emulate.missing(emu) if emu else ""
                if emu and not missing:
                    to_emulate.append((verdict, emu, why))
                else:
                    passed_over[i] = why + (f"; not run under emulation: {missing}" if missing
                                            else "")
            # native code first, the interpreter last (beside qemu)
            native.sort(key=lambda i: container.artifacts[i].device == "portable")
            keys = {i: run_key(container.artifacts[i]) if runs is not None else None
                    for i in native}
            found = {i: runs.get_run(keys[i]) if keys[i] is not None else (None, None)
                     for i in native}
            # the interpreter's run (most of the vectors' time where the model is big) beside
            # the native ones after the first, on a machine with a core for each (the first,
            # the fastest, times the emulated runs' predictions: alone, as they were calibrated)
            interpreted = [i for i in native if container.artifacts[i].device == "portable"
                           and not isinstance(found[i][0], list)
                           and hashed_bytes(container.artifacts[i]) <= BESIDE_BYTES] \
                if cores.machine() > 1 else []
            beside = {}
            chosen = None
            if any(not isinstance(got, list) for got, _ in found.values()):
                # the artifact load() chose runs first, on the executor it loaded (its load
                # untimed, as the emulated runs' predictions were calibrated), and is then
                # unloaded: every other one is loaded in turn, never two at once (GPT-2's
                # build peaked 1 GB higher)
                model = load(path, trusted_keys="")
                chosen = model.artifact.index
                if chosen in native and container.artifacts[chosen].device != "portable":
                    native.remove(chosen)
                    native.insert(0, chosen)
                else:
                    model.unload()
            for i in native:
                art, reason = container.artifacts[i], reasons[i]
                if art.device == "portable":
                    start_emulated()
                key, (got, stored) = keys[i], found[i]
                if progress:
                    progress(f"  validate {pairs[i][0]} {pairs[i][1]}" +
                             (" (its outputs from the kernel cache)" if isinstance(got, list) else ""))
                ran = i in beside or not isinstance(got, list)
                if i in beside:
                    got, stored = beside.pop(i).result()
                elif ran:
                    # (the interpreter's BLAS on one thread where qemu's runs hold the cores)
                    with onethread.one_thread() if art.device == "portable" and running \
                            else contextlib.nullcontext():
                        got, stored = _timed_outputs(model, i, pairs, output)
                if ran and key is not None:
                    runs.put_outputs(key, got, stored)
                if i == chosen:
                    model.unload()
                heap.release()   # (its packed weights, before the next one's)
                # (a rebuild predicts from the first build's times: the emulated runs it stored
                # are keyed by how many cases those times fit)
                if art.device != "portable" and stored and \
                        (fastest is None or stored[0] < fastest.seconds):
                    fastest = NativeRun(stored[0], tuple(stored[1:]))
                if interpreted and art.device != "portable":
                    j = interpreted.pop()
                    beside[j] = pool.submit(_interpreted, path, j, pairs, output)
                result = judge_vectors(art, vector_cases(container, art), got, reason)
                if not result.ok:
                    raise _dead_on_arrival(result, pairs, output)
                checks[i] = result
        start_emulated()
        if model is not None:
            model.close()
            model = None
        for i, (why, future) in sorted(emulated.items()):
            try:
                checks[i] = future.result()
            except emulate.NotEmulated as e:
                passed_over[i] = f"{why}; not run under emulation: {e}"
                # (the future keeps the exception, whose traceback reaches this frame and the
                # build's: a cycle that kept a big model's configs and graph alive until the
                # interpreter's exit collected 160,000 objects, 0.4 s of GPT-2's rebuild)
                e.__traceback__ = None
        _time_precisions(path, pairs, native, checks, progress)   # (qemu done: a quiet host)
    finally:
        if model is not None:
            model.close()
        stack.close()
        pool.shutdown(wait=False, cancel_futures=True)
    return checks, passed_over


def _verdicts(container, path: str):
    """(this host's verdict on each artifact, in order; a loaded model or None): the engine
    selects without loading any code (a rebuild whose runs are cached opens none), or,
    without libmlpack, the runtime loads the file as a user would."""
    from mlpack.runtime import engine, load, native
    from mlpack.spec.errors import NoRunnableArtifactError

    if engine.available():
        try:
            handle = native.open_model(container.path, fd=container.fileno(), strict=False,
                                       verify=False, trusted_keys="", select_only=True)
        except NoRunnableArtifactError:
            handle = None
        if handle is not None:
            with handle:
                return engine.verdicts(handle, container, None), None
    model = load(path, trusted_keys="")
    return list(model.verdicts), model


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
