"""A build's validation: the container, written to a scratch file, opened with the runtime as a
user opens it, and the test vectors run on every artifact this host runs (native ones in the C
engine, libmlpack), and under qemu-user on those of another architecture where it is installed
(packager/emulate.py); each judged against the float64 reference by ``spec/accuracy.py``. An
artifact that misses its tolerance, or cannot run at all, is dead on arrival
(``DeadOnArrivalError``). A build of several precisions then times each native artifact, so
selection ranks them by what was measured.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings

from mlpack.codegen import precisions as precision_modules
from mlpack.codegen.targets import registry
from mlpack.spec.errors import Error
from mlpack.packager.errors import DeadOnArrivalError


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
