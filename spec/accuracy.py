"""How an artifact's outputs are judged: errors against a float64 reference, scaled by the model.

Every test case carries, per output, the **float64 reference** (the model's IR run by the NumPy
interpreter with every float widened to float64) and the **baseline** (ONNX Runtime's fp32
outputs). An artifact's outputs are measured against the reference, per output and case:

    max_error = max |y - ref| / max |ref|          the worst element, on the output's own scale
    rel_l2    = ||y - ref||_2 / ||ref||_2           the error's energy

and so is the baseline: its errors are the fp32 noise floor of that model on that input, what a
correct fp32 engine shows for its own summation order. An output passes when both its errors are
within ``allowed = max(multiple * baseline error, floor)``, the ``Tolerance`` of the artifact's
precision. Because both sides scale with the output (logits of 1e5 and activations of 3e-5 are
judged alike) and with the model's own conditioning (the floor grows with depth and with sums
that cancel), a correct artifact is not refused for its rounding order, and a wrong one (a
channel off by 1e-3, a dropped bias) is: spec/SPEC.md, "Accuracy", gives the measurements the
constants come from.

Integer and bool outputs are exact: each element must equal the reference's or the baseline's
(the two differ only where a float computation before an argmax or a cast sits on a tie). A
non-finite element of either reference must be matched exactly by the artifact (nan by nan, inf
by the same inf); the errors above are over the elements both references hold finite.

``top1`` records, for outputs shaped like class scores (rank 2 or 3, last dim at least 2), the
share of rows whose argmax over the last dim agrees with the reference's. It is recorded, not
judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

REFERENCE = "float64 (mlpack reference interpreter)"


@dataclass(frozen=True)
class Tolerance:
    """What an artifact of one precision may differ from the float64 reference: each error
    within ``min(max(multiple * the baseline's error, floor), cap)``."""

    precision: str
    multiple: float
    floor: float
    cap: float = math.inf   # never more than this, however ill-conditioned the model

    def allowed(self, baseline: float) -> float:
        return min(max(self.multiple * baseline, self.floor), self.cap)

    def to_json(self) -> dict:
        out = {"precision": self.precision, "multiple": self.multiple, "floor": self.floor}
        if math.isfinite(self.cap):
            out["cap"] = self.cap
        return out


# fp32, from the measurements in spec/SPEC.md (section 8, benchmarks/accuracy.py): correct
# artifacts measured at most 5.6x the baseline's error with direct sums and 14.6x with Winograd
# convolutions (vgg19), ONNX Runtime unoptimized 2.0x; the multiple is twice the worst. The floor
# (8 fp32 ulps of the output's scale) covers exact baselines (a transpose, a concat). The
# issue's planted defects (a channel off by 1e-3, a dropped bias) measured 2,500x and more.
#
# fp16 and bf16 round the contraction weights (codegen/precisions/weights16.py), so their error
# is the model's conditioning times their unit roundoff, as the baseline's is times fp32's: the
# multiple is the ratio of the roundoffs (2**13 and 2**16), which covers the worst measured on
# the benchmark set (`python -m benchmarks.accuracy --precision bf16`: vgg19 25,700x, and 32,100x
# with bf16 activations on x86_64-v4-bf16; fp16 at most 2,150x, inception_v2) 2.0 and 3.8 times. The floor covers exact baselines, and
# the cap (half the output's scale) still refuses a broken kernel on a model whose rounding
# amplifies so much that the multiple alone would allow anything.
# int8 rounds every quantized contraction's operands to 255 steps of their range (not of each
# value, as the float types do), so its multiple is larger than the roundoffs' ratio: 2**18 is
# four times the worst measured on the benchmark set (`python -m benchmarks.accuracy --precision
# int8 --target x86_64-v4-vnni`: vgg19 and squeezenet 66,000x, the rest 7,100x to 63,500x); the
# floor (1/16 of the output's scale) covers well-conditioned models with exact baselines (1% to
# 6% measured), and the cap refuses what int8 breaks: the random-weight inception_v2, 0.70.
TOLERANCES = {"fp32": Tolerance("fp32", multiple=32.0, floor=2.0 ** -20),
              "fp16": Tolerance("fp16", multiple=2.0 ** 13, floor=2.0 ** -10, cap=0.5),
              "bf16": Tolerance("bf16", multiple=2.0 ** 16, floor=2.0 ** -7, cap=0.5),
              "int8": Tolerance("int8", multiple=2.0 ** 18, floor=2.0 ** -4, cap=0.5)}


# ONNX Runtime and the float64 reference must agree this well (max_error of each float output)
# for the vectors to stand for the model: past it, mlpack's import does not compute what ONNX
# Runtime does (or the inputs sit on a discontinuity). fp32 baselines measured 1e-7 to 1e-5.
REFERENCES_AGREE = 1e-3


def disagreement(baseline: dict[str, Errors], agree: float | None = None) -> str:
    """Why ONNX Runtime and the float64 reference disagree (one clause), or "" when they agree
    on every output: float outputs within ``agree`` (REFERENCES_AGREE by default), exact ones
    element for element."""
    agree = REFERENCES_AGREE if agree is None else agree
    for name, e in baseline.items():
        if e.note:
            return f"output {name!r}: {e.note}"
        if e.max_error > agree:
            return (f"output {name!r}: max error {e.max_error:.3g} (more than "
                    f"{agree:g})")
        if e.mismatches:
            return f"output {name!r}: {e.mismatches} element(s) differ"
    return ""


def tolerance_for(precision: str, recorded: dict | None = None) -> Tolerance:
    """The tolerance a container records for an artifact (``accuracy.tolerance``), else this
    version's for its precision."""
    if isinstance(recorded, dict):
        try:
            return Tolerance(str(recorded.get("precision", precision)),
                             float(recorded["multiple"]), float(recorded["floor"]),
                             float(recorded.get("cap", math.inf)))
        except (KeyError, TypeError, ValueError):
            pass
    if precision not in TOLERANCES:
        raise KeyError(f"no tolerance is defined for precision {precision!r}")
    return TOLERANCES[precision]


# ---------------------------------------------------------------- measuring one output


@dataclass(frozen=True)
class Errors:
    """One output's errors against the reference, worst over the cases folded in."""

    max_error: float = 0.0      # max |y - ref| / max |ref|
    rel_l2: float = 0.0         # ||y - ref|| / ||ref||
    max_abs_error: float = 0.0  # max |y - ref|, in the output's units
    mismatches: int = 0         # exact elements (ints, non-finite) that match neither reference
    top1: float | None = None   # share of rows whose argmax agrees (class-score outputs)
    note: str = ""              # why it cannot be compared (shape), if so

    def problem(self) -> str:
        """What makes these errors fail whatever the bound ("" if nothing does)."""
        if self.note:
            return self.note
        if self.mismatches:
            return f"{self.mismatches} exact element(s) match neither reference"
        return ""

    def worst(self, other: "Errors") -> "Errors":
        top1 = [t for t in (self.top1, other.top1) if t is not None]
        return Errors(max(self.max_error, other.max_error), max(self.rel_l2, other.rel_l2),
                      max(self.max_abs_error, other.max_abs_error),
                      self.mismatches + other.mismatches, min(top1) if top1 else None,
                      self.note or other.note)


def is_float(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc" or a.dtype.name in ("bfloat16", "float16")


def _looks_like_scores(ref: np.ndarray) -> bool:
    return ref.ndim in (2, 3) and ref.shape[-1] >= 2 and ref.size > 0


def _top1(got: np.ndarray, ref: np.ndarray) -> float:
    g = np.nan_to_num(got.reshape(-1, ref.shape[-1]), nan=-np.inf)
    r = np.nan_to_num(ref.reshape(-1, ref.shape[-1]), nan=-np.inf)
    return float(np.mean(np.argmax(g, axis=1) == np.argmax(r, axis=1)))


def measure(got, ref, baseline=None) -> Errors:
    """``got``'s errors against ``ref`` for one output of one case. ``baseline`` (the other
    reference, ONNX Runtime's) is accepted as equally right for exact elements."""
    got, ref = np.asarray(got), np.asarray(ref)
    base = None if baseline is None else np.asarray(baseline)
    if got.shape != ref.shape:
        return Errors(math.inf, math.inf, math.inf, max(ref.size, 1),
                      note=f"shape {list(got.shape)} != expected {list(ref.shape)}")
    if base is not None and base.shape != ref.shape:
        base = None
    if not is_float(ref):
        ok = got == ref
        if base is not None:
            ok |= got == base
        return Errors(mismatches=int(ok.size - np.count_nonzero(ok)))
    g, r = got.astype(np.float64), ref.astype(np.float64)
    b = None if base is None else base.astype(np.float64)
    finite = np.isfinite(r) if b is None else np.isfinite(r) & np.isfinite(b)
    mismatches = _nonfinite_mismatches(g, r, b, ~finite)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(g[finite] - r[finite])
        diff = np.where(np.isnan(diff), np.inf, diff)  # a nan where the references are finite
        rf = r[finite]
        scale = float(np.max(np.abs(rf))) if rf.size else 0.0
        norm = float(np.sqrt(np.sum(rf * rf))) if rf.size else 0.0
        max_abs = float(diff.max()) if diff.size else 0.0
        l2 = float(np.sqrt(np.sum(diff * diff))) if diff.size else 0.0
    # an all-zero reference has no scale: its errors are absolute
    max_error = max_abs / scale if scale > 0 else max_abs
    rel_l2 = l2 / norm if norm > 0 else l2
    top1 = _top1(g, r) if _looks_like_scores(r) else None
    return Errors(max_error, rel_l2, max_abs, mismatches, top1)


def _nonfinite_mismatches(g, r, b, where) -> int:
    if not where.any():
        return 0

    def same(x):
        return (np.isnan(g) & np.isnan(x)) | (g == x)

    ok = same(r) if b is None else same(r) | same(b)
    return int(np.count_nonzero(where & ~ok))


# ---------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class OutputVerdict:
    """One output over every test case: the artifact's errors, the baseline's, and the bound."""

    name: str
    errors: Errors
    baseline: Errors
    allowed_max_error: float
    allowed_rel_l2: float

    @property
    def ok(self) -> bool:
        e = self.errors
        return (not e.problem() and e.max_error <= self.allowed_max_error
                and e.rel_l2 <= self.allowed_rel_l2)

    def detail(self) -> str:
        """Why it failed, in one clause."""
        e = self.errors
        if e.problem():
            return f"output {self.name!r}: {e.problem()}"
        return bound_text(self.name, e.max_error, self.allowed_max_error, e.rel_l2,
                          self.allowed_rel_l2, self.baseline.max_error, self.baseline.rel_l2)


def baseline_word(baseline: str | None) -> str:
    """What a message calls the baseline a config or vectors name (``accuracy.baseline``):
    ONNX Runtime, or, for a model with custom ops written in the DSL, which ONNX Runtime cannot
    run (packager/customops.py: "mlpack interpreter fp32 (custom ops: ...)"), the fp32
    interpreter."""
    return "fp32 interpreter" if (baseline or "").startswith("mlpack interpreter") \
        else "ONNX Runtime"


def bound_text(name: str, max_error: float, allowed_max_error: float, rel_l2: float,
               allowed_rel_l2: float, baseline_max_error: float, baseline_rel_l2: float,
               baseline: str = "ONNX Runtime") -> str:
    """An output's errors beside their bounds and the baseline's own (``baseline``: its name,
    ``baseline_word``), in one clause."""
    return (f"output {name!r}: max error {max_error:.3g} (allowed {allowed_max_error:.3g}), "
            f"rel L2 {rel_l2:.3g} (allowed {allowed_rel_l2:.3g}); {baseline}'s own: "
            f"{baseline_max_error:.3g}, {baseline_rel_l2:.3g}")


def judge(name: str, errors: Errors, baseline: Errors, tol: Tolerance) -> OutputVerdict:
    return OutputVerdict(name, errors, baseline, tol.allowed(baseline.max_error),
                         tol.allowed(baseline.rel_l2))


# ---------------------------------------------------------------- can the vectors tell?


def _constant(a: np.ndarray) -> bool:
    if a.size < 2:
        return False
    if is_float(a):
        f = a.astype(np.float64)
        finite = f[np.isfinite(f)]
        if finite.size < 2:
            return True
        spread = float(finite.max() - finite.min())
        return spread <= 1e-6 * max(float(np.abs(finite).max()), np.finfo(np.float64).tiny)
    return bool(np.all(a == a.flat[0]))


def blind_spots(references: list[dict]) -> list[str]:
    """Outputs the test vectors cannot judge: the same value for every element of every case
    (constant weights, a saturated or dead network), or the same for every case (outputs that
    ignore the inputs). One sentence each; ``references`` is one {output: array} per case."""
    if not references:
        return []
    notes = []
    for name in references[0]:
        arrays = [np.asarray(c[name]) for c in references if name in c]
        if all(_constant(a) for a in arrays):
            value = arrays[0].flat[0] if arrays[0].size else None
            notes.append(f"output {name!r} is the same in every element of every case ({value:.6g}):"
                         if isinstance(value, (float, np.floating)) else
                         f"output {name!r} is the same in every element of every case:")
        elif len(arrays) > 1 and all(a.shape == arrays[0].shape for a in arrays) \
                and all(np.array_equal(a, arrays[0], equal_nan=True) for a in arrays[1:]):
            notes.append(f"output {name!r} is the same for every test case:")
    return [f"{n} the test vectors cannot tell a right artifact from a wrong one (constant "
            "weights, or inputs that do not exercise the model?); give inputs that do with "
            "--inputs" for n in notes]


__all__ = ["REFERENCE", "REFERENCES_AGREE", "disagreement", "Tolerance", "TOLERANCES",
           "tolerance_for", "Errors", "measure",
           "OutputVerdict", "judge", "baseline_word", "bound_text", "blind_spots", "is_float"]
