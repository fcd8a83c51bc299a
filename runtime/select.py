"""The selection algorithm of spec/SPEC.md section 5: which artifact of a container to run.

One algorithm, in three steps, written flat so the C engine can port it line for line:

1. **Drop** what the host cannot run: format major, OCI os/architecture, x86-64 level variant,
   required CPU features, CUDA present with a high enough compute capability, ``min_runtime``
   newer than this runtime, and (when the caller says which code it can execute) a code format
   without a loader. Then drop what the caller excluded: device, precision, accuracy budget.
2. **Rank** the rest, fastest first, with or without an accuracy budget (the budget only drops
   artifacts): the device (cuda > cpu > the portable interpreter, whatever the precision), then
   of a device the artifact measured fastest at build time (``latency``: the build timed them
   all on one host; one that host could not run, a higher level or extra features, counts as
   fast as the fastest timed one of its precision whose target it extends, ``timed_as``, and
   ranks above it), and where none was timed, the most specific target (highest CPU level, most
   features) and then the narrowest precision. Every artifact in a container passed its
   precision's tolerance when it was built, so without a budget the fastest is the choice, as
   a TensorRT engine built with fp16 allowed runs its fastest kernels; ``precision="fp32"``
   pins the reference precision.
3. **Explain**: every artifact gets a ``Verdict`` whose reason is a sentence a user can act on.

Nothing here reads code or weights: the descriptor annotations (copies of config fields, made
for this purpose) and the config documents are all it looks at.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from mlpack import __version__ as RUNTIME_VERSION
from mlpack.spec import media
from mlpack.spec.container import Artifact
from mlpack.spec.errors import Error, NoRunnableArtifactError

from mlpack.runtime.host import Host

# speed order of artifacts the build did not time: narrower is faster
PRECISION_SPEED = {"int8": 3, "fp16": 2, "bf16": 2, "fp32": 1}
_CODE_NAMES = {media.PROGRAM_PORTABLE: "portable program", media.CODE_ELF: "native ELF code",
               media.CODE_PTX: "PTX code", media.CODE_CUBIN: "cubin code"}


@dataclass
class Verdict:
    """Why one artifact was chosen or passed over."""

    artifact: Artifact
    runnable: bool  # the host (and this runtime) can run it
    chosen: bool
    reason: str

    def __repr__(self) -> str:  # not the dataclass's: that prints the artifact's whole config
        return f"<Verdict {describe(self.artifact)}: {self.reason}>"


# ---------------------------------------------------------------- reading an artifact


def code_layer(art: Artifact):
    """The artifact's code layer (the first layer of a known code media type), or None."""
    return next((layer for layer in art.layers if layer.media_type in media.CODE_MEDIA_TYPES), None)


def cpu_features(art: Artifact) -> list[str]:
    text = art.annotations.get(media.ANN_CPU_FEATURES)
    if text is None:
        return list(art.config["artifact"].get("cpu_features") or [])
    return [f.strip() for f in text.split(",") if f.strip()]


def cuda_sm(art: Artifact) -> int | None:
    text = art.annotations.get(media.ANN_CUDA_SM)
    value = art.config["artifact"].get("cuda_sm") if text is None else text
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _recorded_number(art: Artifact, key: str, section: str, field: str) -> float | None:
    """A non-negative number the annotation ``key`` holds as JSON text, else the config's
    ``section.field``; None when neither records one (as select.c's mp_recorded_number)."""
    text = art.annotations.get(key)
    if text is not None:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):   # nested past the recursion limit: not a number
            return None
    else:
        block = art.config.get(section)
        value = block.get(field) if isinstance(block, dict) else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else None


def max_error(art: Artifact) -> float | None:
    """The recorded error against the float64 reference on the output's own scale (max |y - ref|
    / max |ref|, worst over the outputs); None when the artifact records none."""
    return _recorded_number(art, media.ANN_MAX_ERROR, "accuracy", "max_error")


def latency(art: Artifact) -> float | None:
    """Seconds per run measured on the build host (config ``latency``, one thread); None when
    the build did not time this artifact."""
    return _recorded_number(art, media.ANN_LATENCY, "latency", "seconds")


def min_runtime(art: Artifact) -> str:
    return art.annotations.get(media.ANN_MIN_RUNTIME) or art.config.get("min_runtime") or "0"


def x86_variant_level(art: Artifact) -> int | None:
    """1..4 for an amd64 artifact (variant v1..v4; none means v1); None for other platforms."""
    p = art.platform or {}
    if p.get("architecture") != "amd64":
        return None
    m = re.fullmatch(r"v([1-9])", p.get("variant") or "v1")
    return int(m.group(1)) if m else 99  # an unknown variant ranks as unreachable


def describe(art: Artifact) -> str:
    """A short name for messages: ``x86-64 v3 cpu fp32``, ``arm64 cpu fp16``, ``cuda sm_80 fp32``."""
    p = art.platform or {}
    if art.device == "portable":
        where = "portable"
    elif art.device == "cuda":
        where = f"cuda sm_{cuda_sm(art)}" if cuda_sm(art) else "cuda"
    elif p.get("architecture") == "amd64":   # "+amx", "+bf16", "+vnni": no OCI variant of
        # their own
        feats = cpu_features(art)
        extra = "".join(tag for flag, tag in (("amx_tile", "+amx"), ("avx512_bf16", "+bf16"),
                                              ("avx512_vnni", "+vnni")) if flag in feats)
        where = f"x86-64 v{x86_variant_level(art)}{extra} {art.device}"
    else:
        where = f"{p.get('architecture', '?')} {art.device}"
    return f"{where} {art.precision} (artifact {art.index})"


def specificity(art: Artifact) -> tuple:
    """Higher is more specific (and faster): cuda > CPU by level/features > portable."""
    if art.device == "cuda":
        return (3, cuda_sm(art) or 0, 0)
    if art.device == "cpu":
        return (2, x86_variant_level(art) or 1, len(cpu_features(art)))
    return (0, 0, 0)


def _version_tuple(text: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"([0-9]+)(?:\.([0-9]+))?(?:\.([0-9]+))?", str(text))
    return tuple(int(g or 0) for g in m.groups()) if m else None


# ---------------------------------------------------------------- step 1: what cannot run here


def _platform_fault(art: Artifact, host: Host) -> str | None:
    p = art.platform
    if p is None:
        # (GPU code runs on any CPU)
        return None if art.device in ("portable", "cuda") else f"{art.device} artifact has no OCI platform"
    if p.get("os", host.os) != host.os:
        return f"{p.get('os')}, this host is {host.os}"
    arch = p.get("architecture", host.arch)
    if arch != host.arch:
        return f"{arch}, this host is {host.arch}"
    level = x86_variant_level(art)
    if level is not None and level > (host.x86_level or 0):
        have = f"x86-64 v{host.x86_level}" if host.x86_level else "not x86-64 leveled"
        return f"needs x86-64 {p.get('variant')}, this host is {have}"
    if arch == "arm64" and (p.get("variant") or "v8") not in ("v8",):
        return f"arm64 variant {p.get('variant')!r} is unknown to this runtime"
    return None


def _device_fault(art: Artifact, host: Host) -> str | None:
    if art.device not in media.DEVICES:
        return f"device {art.device!r} is unknown to this runtime"
    if art.device != "cuda":
        return None
    if host.cuda_sm is None:
        return f"needs a CUDA GPU: {host.cuda_why or 'this host has none'}"
    need = cuda_sm(art)
    if need is not None and need > host.cuda_sm:
        return f"needs sm_{need}, this host's GPU is sm_{host.cuda_sm}"
    return None


def _feature_fault(art: Artifact, host: Host) -> str | None:
    missing = [f for f in cpu_features(art) if f not in host.cpu_features]
    if not missing:
        return None
    return f"needs {', '.join(missing)}, this host lacks {'it' if len(missing) == 1 else 'them'}"


def _runtime_fault(art: Artifact, code_types) -> str | None:
    major = art.config.get("mlpack_format", "1.0").split(".")[0]
    if not major.isdigit() or int(major) > media.FORMAT_VERSION[0]:
        return f"format {art.config.get('mlpack_format')} is newer than this runtime reads"
    need, have = _version_tuple(min_runtime(art)), _version_tuple(RUNTIME_VERSION)
    if need is None or need > have:
        return f"needs mlpack runtime {min_runtime(art)}, this is {RUNTIME_VERSION}"
    layer = code_layer(art)
    if layer is None:
        return "has no code layer this runtime knows"
    if code_types is not None and layer.media_type not in code_types:
        return (f"{_CODE_NAMES[layer.media_type]}, which this runtime cannot execute yet "
                "(only the C engine runs native code)")
    return None


# an artifact a partial pull left out (spec/container.py Artifact.present; select.c's words)
NOT_PULLED = "not in this partial container (mlpack pull --all fetches every artifact)"


def host_fault(art: Artifact, host: Host, code_types=None) -> str | None:
    """Why ``host`` cannot run ``art`` (a clause for "passed over: ..."), or None if it can."""
    if not art.present:
        return NOT_PULLED
    return (_platform_fault(art, host) or _device_fault(art, host) or _feature_fault(art, host)
            or _runtime_fault(art, code_types))


def _policy_fault(art: Artifact, device, precision, budget) -> str | None:
    if device is not None and art.device != device:
        return f"device {device!r} was requested"
    if precision is not None and art.precision != precision:
        return f"precision {precision!r} was requested"
    if budget is not None:
        err = max_error(art)
        if err is None:
            return f"records no measured error, so it cannot meet the accuracy budget {budget:g}"
        if err > budget:
            return f"max_error {err:g} exceeds the accuracy budget {budget:g}"
    return None


def check_policy(device, precision, budget) -> None:
    """Error for a device, precision or accuracy budget that is not in the vocabulary."""
    if device is not None and device not in media.DEVICES:
        raise Error(f"device {device!r} is not one of {', '.join(media.DEVICES)}")
    if precision is not None and precision not in media.PRECISIONS:
        raise Error(f"precision {precision!r} is not one of {', '.join(media.PRECISIONS)}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not budget >= 0):
        raise Error(f"accuracy budget {budget!r} is not a non-negative number")


# ---------------------------------------------------------------- step 2: rank


def timed_as(art: Artifact, artifacts) -> Artifact | None:
    """The timing that stands for an artifact the build did not time (its host could not run
    it): the fastest measured artifact of ``artifacts`` of the same device, architecture and
    precision whose target ``art`` extends (a CPU level no higher, every required feature among
    ``art``'s), as more instructions never make the same computation slower; ``art`` itself
    when measured; None when there is none."""
    if latency(art) is not None:
        return art
    best = None
    arch = (art.platform or {}).get("architecture", "")
    for b in artifacts:
        if latency(b) is None or b.device != art.device or b.precision != art.precision \
                or (b.platform or {}).get("architecture", "") != arch \
                or (x86_variant_level(b) or 0) > (x86_variant_level(art) or 0) \
                or not set(cpu_features(b)) <= set(cpu_features(art)):
            continue
        if best is None or latency(b) < latency(best):
            best = b
    return best


def rank_key(art: Artifact, artifacts=()) -> tuple:
    """Sort key, larger is better: the device, then the measured fastest (build-time latency;
    an artifact the build host could not run by ``timed_as`` among ``artifacts``), then the most
    specific target and the narrowest precision (see the module docstring)."""
    timed = timed_as(art, artifacts)
    device, *rest = specificity(art)   # native code before the interpreter, whatever precision
    measured = (1, -int(latency(timed) * 1e9)) if timed is not None else (0, 0)
    return (device, *measured, *rest, PRECISION_SPEED.get(art.precision, 0), -art.index)


# ---------------------------------------------------------------- step 3: explain


def _chosen_reason(art: Artifact, device, budget, others: int, artifacts) -> str:
    if device == "portable":
        return "chosen: the portable artifact was requested"
    if budget is not None:
        return (f"chosen: {describe(art)} is the fastest artifact within the accuracy budget "
                f"{budget:g} (max_error {max_error(art):g})")
    if art.device == "portable":
        return "chosen: portable: runs anywhere; slower (no native artifact fits)"
    if others == 0:
        return f"chosen: {describe(art)} is the only artifact this host runs"
    timed = timed_as(art, artifacts)
    if timed is art:
        return f"chosen: {describe(art)} is the fastest artifact this host runs (timed at build)"
    if timed is not None:
        return (f"chosen: {describe(art)} is the fastest artifact this host runs (as "
                f"{describe(timed)} timed at build, whose instructions it extends)")
    return f"chosen: {describe(art)} is the most specific artifact this host runs"


def _loser_reason(art: Artifact, winner: Artifact) -> str:
    if art.device == "portable":
        return "portable: runs anywhere; slower"
    if art.device == winner.device and art.precision != winner.precision:
        return (f"passed over: {describe(winner)} ranks higher "
                f"(ask for precision={art.precision!r})")
    return f"passed over: {describe(winner)} ranks higher"


def explain(verdicts: list[Verdict]) -> str:
    """Every artifact and its verdict, one per line (for error messages and ``inspect``)."""
    return "\n".join(f"  {describe(v.artifact)}: {v.reason}" for v in verdicts)


def select_artifact(container, host: Host, *, device=None, precision=None, accuracy_budget=None,
                    code_types=None) -> tuple[Artifact, list[Verdict]]:
    """The artifact of ``container`` to run on ``host``, and a verdict for every artifact.

    ``device``/``precision`` restrict the choice; ``accuracy_budget`` drops every artifact whose
    recorded ``max_error`` exceeds it; of the rest the fastest is chosen. ``code_types`` is the set of code media types
    the caller can execute (None: any known one, which is what ``mlpack inspect --host`` shows).
    Raises NoRunnableArtifactError naming each artifact and why it was passed over.
    """
    check_policy(device, precision, accuracy_budget)
    verdicts, candidates = [], []
    for art in container.artifacts:
        fault = host_fault(art, host, code_types)
        if fault is None:
            fault = _policy_fault(art, device, precision, accuracy_budget)
            if fault is None:
                candidates.append(art)
            verdicts.append(Verdict(art, True, False, f"passed over: {fault}" if fault else ""))
        else:
            verdicts.append(Verdict(art, False, False, f"passed over: {fault}"))
    if not candidates:
        raise NoRunnableArtifactError(
            f"{container.path}: no artifact runs on this host ({host.describe()}) as requested:\n"
            + explain(verdicts))
    arts = list(container.artifacts)
    winner = max(candidates, key=lambda a: rank_key(a, arts))
    runnable = sum(v.runnable for v in verdicts)
    for v in verdicts:
        if v.artifact is winner:
            v.chosen = True
            v.reason = _chosen_reason(winner, device, accuracy_budget, runnable - 1, arts)
        elif not v.reason:
            v.reason = _loser_reason(v.artifact, winner)
    return winner, verdicts


__all__ = ["Verdict", "select_artifact", "check_policy", "describe", "explain", "host_fault",
           "specificity", "code_layer", "RUNTIME_VERSION"]
