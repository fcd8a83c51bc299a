"""The ``mlpack`` command line (typer).

    mlpack build MODEL.onnx -o OUT.mlpack [--target T]... [--precision P]... [--inputs FILE.npz]
                 [--dim NAME=SIZE]... [--seed N] [--cases N] [--name NAME] [--no-cache] [--quiet]
    mlpack inspect FILE.mlpack [--host] [--json]
    mlpack validate FILE.mlpack
    mlpack run FILE.mlpack --input NAME=FILE.npy ... --output DIR [--device D] [--precision P]
    mlpack push FILE.mlpack REGISTRY/REPO:TAG;  mlpack pull REGISTRY/REPO:TAG -o FILE [--all]
    mlpack keygen NAME;  mlpack sign FILE.mlpack --key NAME.key;  mlpack verify FILE --key NAME.pub
    mlpack import MODEL.onnx [--ir FILE] [--print-ir]
    mlpack run-reference MODEL.onnx --input NAME=FILE.npy ... --output DIR
    mlpack conformance [--filter REGEX] [--jobs N] [-v]
    mlpack bench FILE.mlpack [--compare MODEL.onnx] [--threads 1,2] [--repeat N] [--json]
    mlpack --version

Every command body runs under ``_errors``: an ``mlpack.Error`` (a user's mistake or an
unsupported model) prints as one paragraph ``error: ...`` on stderr and exits 2, never with a
traceback; anything else is an mlpack bug and prints ``internal error: ...`` with a hint to
rerun with ``MLPACK_DEBUG=1`` (which shows the traceback), exit 1; Ctrl-C prints one line,
``interrupted`` (and what it left: ``nothing written to OUT``), and exits 130. The compiler is
imported inside the commands, so ``mlpack --help`` stays quick. Help is click's plain text
(``-h`` or ``--help``); ``mlpack --help`` lists the commands in the order above, whatever the
order of their functions here. The container commands (build, inspect, validate, run) are at
the end; each is one ``@command`` function.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from pathlib import Path
from typing import Callable, Optional

import typer

from mlpack.spec import environment
from mlpack.spec.errors import Error, InputError


class _Commands(typer.core.TyperGroup):
    """Lists the commands in the order a user needs them: make a container, look into it, check
    it, run it; then the tools that work on the ONNX model itself."""

    ORDER = ("build", "inspect", "validate", "run", "push", "pull", "keygen", "sign", "verify",
             "import", "run-reference", "conformance", "bench")

    def list_commands(self, ctx) -> list[str]:
        rank = {name: i for i, name in enumerate(self.ORDER)}
        return sorted(self.commands, key=lambda name: rank.get(name, len(rank)))


app = typer.Typer(
    name="mlpack",
    cls=_Commands,
    help="Compile one ONNX model into one file that runs on every kind of hardware.",
    epilog="Environment (spec/environment.py):\n\n" + "\n\n".join(
        f"  {line}" for line in environment.listing(("compiler", "runtime", "engine")).splitlines()),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help, as other tools print it: rich's would show `--quiet <bool>` and read
    # `[...]` in help text as markup, dropping it
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

EXIT_USER = 2
EXIT_INTERNAL = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


# ---------------------------------------------------------------- error reporting


def _debug_level() -> int:
    from mlpack.codegen import debug  # the one registry of flags; imports nothing heavy

    return debug.level()


def one_paragraph(text: str) -> str:
    """``text`` with its whitespace runs (newlines included) folded to single spaces."""
    return " ".join(str(text).split())


def report_error(exc: BaseException) -> int:
    """Print ``exc`` for a person and give the exit code."""
    from mlpack.codegen.onnx.builder import NeedsValue

    if isinstance(exc, NeedsValue):
        msg = (f"{exc}; mlpack compiles such a model for given values of its integer inputs "
               "(mlpack run-reference --input NAME=FILE.npy)")
        typer.echo(f"error: {one_paragraph(msg)}", err=True)
        return EXIT_USER
    if isinstance(exc, Error):
        typer.echo(f"error: {one_paragraph(exc)}", err=True)
        return getattr(exc, "exit_code", EXIT_USER)
    if _debug_level() >= 1:
        traceback.print_exception(exc, file=sys.stderr)
    detail = one_paragraph(f"{type(exc).__name__}: {exc}")
    typer.echo(f"internal error: {detail}", err=True)
    if _debug_level() < 1:
        typer.echo("(this is a bug in mlpack; rerun with MLPACK_DEBUG=1 to see the traceback)",
                   err=True)
    return EXIT_INTERNAL


def _errors(fn: Callable) -> Callable:
    """Run a command body, turning every failure into a message and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except KeyboardInterrupt as e:  # Ctrl-C: one line, no traceback, no "Aborted!"
            typer.echo(f"interrupted{'; ' + str(e) if str(e) else ''}", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            # `mlpack import ... | head`: the reader left early; nothing is wrong
            sys.stdout = open(os.devnull, "w")
            raise typer.Exit(0) from None
        except Exception as e:
            if type(e).__module__.startswith("click"):
                raise
            raise typer.Exit(report_error(e)) from None

    return wrapper


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what it left behind (``nothing written to OUT``) for the one-line message."""


def command(name: str | None = None, **kwargs) -> Callable:
    """``app.command`` with mlpack's error handling around the body."""

    def register(fn: Callable) -> Callable:
        app.command(name, **kwargs)(_errors(fn))
        return fn

    return register


# ---------------------------------------------------------------- summaries


def _existing(path: Path, what: str = "model", **policy) -> Path:
    if what == "container" and str(path).startswith("oci:/"):   # oci://REGISTRY/REPO:TAG
        from mlpack.packager.registry_cli import pulled

        return pulled(path, **policy)   # this host's artifact, pulled into the cache
    if not path.exists():
        raise InputError(f"{path}: no such file ({what})")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a {what} file")
    return path


def format_port(graph, port) -> str:
    """``x: f32[batch=$batch, d1=784]``: a graph input/output with its dims in layout order."""
    from mlpack.spec.ir.printer import format_expr

    ty = graph.types[port.name]
    dims = ", ".join(f"{d}={format_expr(ty.dims[d])}" for d in port.layout)
    return f"{port.name}: {ty.dtype}[{dims}]"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def summary(model, graph, path: str = "") -> list[str]:
    """The lines ``mlpack import`` prints about a compiled model."""
    from mlpack.spec.ir.graph import Comprehension, Procedure

    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    comps = sum(isinstance(op, Comprehension) for op in graph.ops)
    procs = sum(isinstance(op, Procedure) for op in graph.ops)
    nbytes = sum(c.data.nbytes for c in graph.constants.values())
    name = model.graph.name or graph.name
    lines = [f"model:      {name}" + (f" ({path})" if path else ""),
             f"opset:      {opsets}"]
    lines += [f"input:      {format_port(graph, p)}" for p in graph.inputs]
    lines += [f"output:     {format_port(graph, p)}" for p in graph.outputs]
    lines.append(f"ops:        {comps} comprehension{'s' * (comps != 1)}, "
                 f"{procs} procedure{'s' * (procs != 1)}")
    lines.append(f"constants:  {len(graph.constants)} ({_bytes(nbytes)})")
    return lines


# ---------------------------------------------------------------- commands


_BUDGET_HELP = ("the most bytes of intermediates to keep that could be recomputed where they "
                "are read instead (4096, 64MB, 1.5GiB; default: no cap, the cost model "
                "decides); MLPACK_DEBUG=1 shows each choice")


@command("import")
def import_(
    model: Path = typer.Argument(..., metavar="MODEL.onnx", help="the ONNX model file"),
    ir: Optional[Path] = typer.Option(None, "--ir", metavar="FILE",
                                      help="write the IR text form to this file"),
    print_ir: bool = typer.Option(False, "--print-ir", help="print the IR text form"),
    ops: list[str] = typer.Option(
        [], "--ops", metavar="MODULE",
        help="a Python module that registers custom ops written in mlpack.codegen.dsl, as "
             "for build; repeatable"),
    memory_budget: Optional[str] = typer.Option(
        None, "--memory-budget", metavar="BYTES", help=_BUDGET_HELP),
) -> None:
    """Import and compile an ONNX model; print a summary of its IR."""
    from mlpack.codegen.compile import compile_onnx
    from mlpack.codegen.passes import recompute
    from mlpack.spec.ir.printer import format_graph
    from mlpack.codegen.onnx.importer import load_model
    from mlpack.packager import customops

    customops.load(ops)
    budget = recompute.as_bytes(memory_budget)
    proto = load_model(_existing(model))
    with recompute.memory_budget(budget):
        graph = compile_onnx(proto)
    for line in summary(proto, graph, str(model)):
        typer.echo(line)
    text = format_graph(graph) if (print_ir or ir) else ""
    if ir is not None:
        ir.write_text(text)
        typer.echo(f"IR written to {ir}")
    if print_ir:
        typer.echo("")
        typer.echo(text, nl=False)


def parse_inputs(items: list[str]) -> dict:
    """``NAME=FILE.npy`` pairs -> {name: array}."""
    import numpy as np

    feeds = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InputError(f"--input {item!r}: expected NAME=FILE.npy")
        if name in feeds:  # keeping either one would be a guess
            raise InputError(f"--input {name!r} is given twice; give each input once")
        path = _existing(Path(file), f"input {name!r}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except Exception as e:
            raise InputError(f"{path}: not a readable .npy file for input {name!r} ({e})") from None
    return feeds


@command("run-reference")
def run_reference_cmd(
    model: Path = typer.Argument(..., metavar="MODEL.onnx", help="the ONNX model file"),
    inputs: list[str] = typer.Option([], "--input", "-i", metavar="NAME=FILE.npy",
                                     help="an input's array, once per input"),
    output: Path = typer.Option(..., "--output", "-o", metavar="DIR",
                                help="folder to write NAME.npy per output"),
) -> None:
    """Run a model on the NumPy reference interpreter; write each output as NAME.npy."""
    import numpy as np

    from mlpack.packager.reference import run_reference

    feeds = parse_inputs(inputs)
    results = run_reference(_existing(model), feeds)
    output.mkdir(parents=True, exist_ok=True)
    for name, value in results.items():
        safe = name.replace("/", "_").replace(os.sep, "_")
        target = output / f"{safe}.npy"
        np.save(target, value)
        typer.echo(f"{name}: {value.dtype}{list(value.shape)} -> {target}")


@command("conformance")
def conformance_cmd(
    filter: Optional[str] = typer.Option(None, "--filter", metavar="REGEX",
                                         help="regular expression on case names"),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", metavar="N", help="worker processes"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="print each failure"),
    json_out: Optional[Path] = typer.Option(None, "--json", metavar="FILE",
                                            help="write {case: [op, verdict, detail]}"),
    update_floor: Optional[Path] = typer.Option(
        None, "--update-floor", metavar="FILE",
        help="add the cases that now pass to this floor file (it only rises)"),
) -> None:
    """Run ONNX's backend node suite through mlpack: pass/fail per operator and in total."""
    import json
    import re
    import time

    from mlpack import conformance

    if filter is not None:
        try:
            re.compile(filter)
        except re.error as e:
            raise InputError(f"--filter {filter!r} is not a regular expression: {e}") from None
    t0 = time.time()
    results = conformance.run_suite(filter, jobs)
    if not results:
        raise InputError(f"no node test case matches --filter {filter!r}")
    conformance.report(results, verbose, out=sys.stdout)
    typer.echo(f"({time.time() - t0:.0f}s)")
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=0, sort_keys=True))
    if update_floor is not None:
        _update_floor(conformance, results, update_floor)


def _update_floor(conformance, results, path: Path) -> None:
    """Add the passing cases to the floor file; refuse (exit 1) if a floor case fails now."""
    floor = conformance.read_floor(str(path))
    lost = sorted(n for n in floor if results.get(n, ("", "fail"))[1] != "pass")
    if lost:
        typer.echo(f"not updating the floor: {len(lost)} floor cases fail now: {lost[:10]}", err=True)
        raise typer.Exit(1)
    passing = {n for n, (_, verdict, _) in results.items() if verdict == "pass"}
    conformance.write_floor(str(path), floor | passing)
    typer.echo(f"floor: {len(floor)} -> {len(floor | passing)} cases")


# ---------------------------------------------------------------- container commands


def _key_int(items: list[str], flag: str) -> dict[str, int]:
    """``NAME=SIZE`` pairs -> {name: size}."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit() or int(value) < 1:
            raise InputError(f"{flag} {item!r}: expected NAME=SIZE with a positive integer size")
        if name in out:
            raise InputError(f"{flag} {name!r} is given twice; give each size once")
        out[name] = int(value)
    return out


def _progress(quiet: bool):
    """Progress lines on stderr for a person watching (a terminal), nothing for logs or pipes."""
    if quiet or not sys.stderr.isatty():
        return None
    from mlpack.packager.progress import Terminal

    return Terminal(sys.stderr)   # lines, and a live one while targets compile


def _err(value) -> str:
    return "-" if value is None else f"{value:.2e}"


def _build_help() -> str:
    """`mlpack build --help`'s text: the targets and precisions from their registries."""
    from mlpack.codegen import precisions
    from mlpack.codegen.targets import registry

    listed = "\n\n".join(f"  {line}" for line in registry.help_text().splitlines())
    made = ", ".join(p + (" (the default)" if p in precisions.defaults() else "")
                     for p in precisions.implemented())
    planned = ", ".join(p for p in precisions.names() if p not in precisions.implemented())
    return ("Compile a model into one container, with reference test vectors, validated before "
            "writing.\n\nTargets (--target, repeatable; by default every one not marked):\n\n"
            f"{listed}\n\nPrecisions (--precision, repeatable or comma-separated, or all): {made}"
            + (f"; planned: {planned}" if planned else "")
            + ". A model quantized by its author (QDQ, QLinear ops) builds int8 by default, its "
            "own precision, on the integer kernels.\n\nA cpu target that cannot lower an op of the model is skipped with a warning, "
            "unless named with --target.")


@command("build", help=_build_help())
def build_cmd(
    model: Path = typer.Argument(..., metavar="MODEL.onnx", help="the ONNX model file"),
    output: Path = typer.Option(..., "--output", "-o", metavar="OUT.mlpack",
                                help="the container to write"),
    target: list[str] = typer.Option([], "--target", "-t", metavar="TARGET",
                                     help="target to build, repeatable (default: every one not "
                                          "marked in the list above)"),
    precision: list[str] = typer.Option(
        [], "--precision", "-p", metavar="PRECISION",
        help="precision to build, repeatable or comma-separated; all: every implemented one "
             "(default: fp32; int8 for a model that is already quantized)"),
    inputs: list[Path] = typer.Option(
        [], "--inputs", metavar="FILE.npz",
        help="test inputs, an array per input; repeat for more cases"),
    dim: list[str] = typer.Option(
        [], "--dim", metavar="NAME=SIZE", help="a size symbol in the test inputs (default 1)"),
    seed: int = typer.Option(0, "--seed", metavar="N", help="seed of the random test inputs"),
    cases: int = typer.Option(2, "--cases", metavar="N", help="how many random test cases"),
    calibration: Optional[Path] = typer.Option(
        None, "--calibration", metavar="DIR",
        help="int8: calibrate the activations on these inputs, a directory of .npz files with "
             "an array per model input (default: 8 seeded random input sets)"),
    name: Optional[str] = typer.Option(None, "--name", metavar="NAME",
                                       help="model name (default: the file's stem)"),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="compile every target anew, neither reading nor writing the "
                                  "kernel cache (MLPACK_CACHE_DIR, default ~/.cache/mlpack/kernels)"),
    ops: list[str] = typer.Option(
        [], "--ops", metavar="MODULE",
        help="a Python module (a .py file or a dotted name) that registers custom ops written "
             "in mlpack.codegen.dsl for the model's nodes of its own domain; repeatable"),
    memory_budget: Optional[str] = typer.Option(
        None, "--memory-budget", metavar="BYTES", help=_BUDGET_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print nothing but errors"),
) -> None:
    """Compile a model into one container (the help text is _build_help's)."""
    import warnings

    from mlpack.packager.build import BlindVectorsWarning, SkippedTargetWarning, build, skip_lines

    progress = _progress(quiet)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedTargetWarning)  # said once, as a line, below
        warnings.simplefilter("ignore", BlindVectorsWarning)
        try:
            report = build(_existing(model), output, targets=target, precisions=precision,
                           inputs=[_existing(p, "test inputs") for p in inputs] or None,
                           dims=_key_int(dim, "--dim"), seed=seed, cases=cases, name=name,
                           calibration=calibration, progress=progress, cache=not no_cache,
                           ops=ops, memory_budget=memory_budget)
        except KeyboardInterrupt:  # build() removes its scratch file and writes OUT last
            raise Interrupted(f"nothing written to {output}") from None
    if quiet:
        return
    if progress is None:  # the progress lines (a terminal) already said it
        for line in skip_lines(report.skipped) + report.blind_spots:
            typer.echo(f"warning: {line}", err=True)
    secs = sum(report.timings.values())
    typer.echo(f"wrote {report.path} ({_bytes(report.size)}) in {secs:.1f}s: model {report.name}, "
               f"{len(report.artifacts)} artifact{'s' * (len(report.artifacts) != 1)}, "
               f"{report.cases} test case{'s' * (report.cases != 1)} ({report.reference})"
               + _cache_note(report.cache))
    from mlpack.spec.accuracy import baseline_word

    for a in report.artifacts:
        typer.echo(f"  {a.target} {a.precision}: "
                   f"{_artifact_state(a, baseline_word(report.reference), report.cases)}"
                   f"{_dropped(a)}")


def _cache_note(cache: dict) -> str:
    """", 5 of 6 compiled artifacts from the kernel cache", or "" when none came from it."""
    if not cache.get("hits"):
        return ""
    return (f"; {cache['hits']} of {cache['hits'] + cache['misses']} artifacts' code from the "
            "kernel cache")


def _artifact_state(a, baseline: str = "ONNX Runtime", cases: int | None = None) -> str:
    built = f"built in {a.seconds:.1f}s, " if a.seconds is not None else ""
    if a.validated:
        where = f"under {a.emulator} " if a.emulator else ""
        # (an emulated run takes the first cases that fit a build's time limit)
        some = f"{a.cases} of {cases}" if cases and a.cases < cases else f"{a.cases}"
        return (f"{built}validated {where}on {some} case{'s' * (some != '1')} "
                f"against float64: max err "
                f"{_err(a.max_error)} ({baseline} {_err(a.baseline_max_error)}), rel L2 "
                f"{_err(a.rel_l2)}" + (f", top-1 {a.top1:.0%}" if a.top1 is not None else ""))
    return f"{built}not validated: {a.reason or 'not runnable here'}"


def _dropped(a) -> str:
    """The clause for an int8 artifact that quantized nothing, or one compiled again without
    its inexact passes or with some int8 activations kept in f32, or ""."""
    if a.integer_sums == 0:
        return (" (nothing quantized: no contraction of this model is one int8 takes, deep "
                "enough and reading a weight, so it computes in f32)")
    if a.f32_activations:
        return (f" ({a.f32_activations} activation{'s' * (a.f32_activations != 1)} kept in f32: "
                f"with all quantized the artifact missed the {a.precision} tolerance)")
    if not a.dropped_passes:
        return ""
    return (f" (compiled without {', '.join(a.dropped_passes)}: with it the artifact missed "
            f"the {a.precision} tolerance)")


# ---- inspect


def _layer_sizes(container) -> dict[str, int]:
    """Bytes of code, weights and test vectors, each distinct blob counted once."""
    from mlpack.spec import media

    kinds = {media.WEIGHTS: "weights", media.TESTVECTORS: "vectors"}
    kinds.update({m: "code" for m in media.CODE_MEDIA_TYPES})
    sizes, seen = {"code": 0, "weights": 0, "vectors": 0, "other": 0}, set()
    for art in container.artifacts:
        for layer in art.layers:
            if layer.digest not in seen:
                seen.add(layer.digest)
                sizes[kinds.get(layer.media_type, "other")] += layer.size
    return sizes


def _sig_text(sig: dict) -> str:
    dims = ", ".join(f"{d['name']}={d['size']}" for d in sig["dims"])
    return f"{sig['name']}: {sig['dtype']}[{dims}]"


def _artifact_doc(art) -> dict:
    cfg = art.config
    return {"index": art.index, "device": art.device, "precision": art.precision,
            "target": cfg["artifact"]["target"], "platform": art.platform,
            "cpu_features": cfg["artifact"].get("cpu_features") or [],
            "cuda_sm": cfg["artifact"].get("cuda_sm"), "accuracy": cfg.get("accuracy") or {},
            "min_runtime": cfg.get("min_runtime"), "latency": cfg.get("latency"),
            "present": art.present, "cuda": _cuda_doc(art),
            "layers": [{"media_type": layer.media_type, "digest": layer.digest, "size": layer.size}
                       for layer in art.layers]}


def _cuda_doc(art) -> dict | None:
    """A cuda artifact's code: its PTX ISA version, the driver that reads it, and whether it
    carries a cubin (codegen/targets/cuda/)."""
    from mlpack.spec import media

    if art.device != "cuda" or not art.present:
        return None
    cuda = (art.config.get("plan") or {}).get("cuda") or {}
    return {"ptx_isa": cuda.get("ptx_isa"), "driver": cuda.get("driver"),
            "cubin": art.layer(media.CODE_CUBIN) is not None}


def _engine_rows(container) -> list[dict] | None:
    """The C engine's selection on this host (what ``mlpack.load`` runs); None without it. The
    engine selects only (select_only): inspecting a file never loads its code."""
    from mlpack.runtime import engine, native
    from mlpack.spec.errors import Error, NoRunnableArtifactError

    if not engine.available():
        return None
    try:
        handle = native.open_model(container.path, fd=container.fileno(), strict=False,
                                   verify=False, trusted_keys="", select_only=True)
    except NoRunnableArtifactError:
        return None  # the Python rows below say why for each artifact
    except Error as e:
        raise Error(f"the C engine cannot open {container.path}: {e}") from None
    with handle:
        verdicts = engine.verdicts(handle, container, None)
    return [{"index": v.artifact.index, "runnable": v.runnable, "chosen": v.chosen,
             "reason": v.reason} for v in verdicts]


def _signature_doc(container) -> dict:
    """Who signed the container, as the file says (``mlpack verify --key`` checks it)."""
    keys = sorted({s.key or "unknown key" for s in container.signatures})
    return {"signed": bool(container.signatures), "keys": keys}


def _host_doc(container) -> dict:
    """This host and, per artifact, whether ``mlpack.load`` would pick it and why: the C
    engine's verdicts when libmlpack is built (selection is implemented there), else Python's."""
    from mlpack.runtime import detect_host, engine
    from mlpack.runtime.model import EXECUTORS
    from mlpack.runtime.select import host_fault, select_artifact
    from mlpack.spec.errors import NoRunnableArtifactError

    host = detect_host()
    rows = _engine_rows(container)
    if rows is not None:
        return {"host": host.describe(), "engine": engine.describe_engine(), "verdicts": rows}
    try:
        _, verdicts = select_artifact(container, host, code_types=set(EXECUTORS))
        rows = [{"index": v.artifact.index, "runnable": v.runnable, "chosen": v.chosen,
                 "reason": v.reason} for v in verdicts]
    except NoRunnableArtifactError:
        rows = []
        for art in container.artifacts:
            fault = host_fault(art, host, set(EXECUTORS))
            rows.append({"index": art.index, "runnable": fault is None, "chosen": False,
                         "reason": f"passed over: {fault}" if fault else "runnable"})
    return {"host": host.describe(), "engine": engine.describe_engine(), "verdicts": rows}


def _custom_ops_doc(container) -> list[dict]:
    """The custom ops written in the DSL that the artifacts record (spec/SPEC.md, "Custom
    ops"), each (domain, op type, source digest) once: which function defines it, the digest
    of its module's source, and the source itself."""
    seen, out = set(), []
    for art in container.artifacts:
        if not art.present:
            continue
        for op in art.config.get("custom_ops") or []:
            key = (op.get("domain"), op.get("op_type"), op.get("sha256"))
            if key not in seen:
                seen.add(key)
                out.append({k: op.get(k) for k in ("domain", "op_type", "function", "language",
                                                   "sha256", "source")})
    return out


def inspect_doc(container, host: bool) -> dict:
    """Everything ``mlpack inspect`` shows, as one JSON-able document."""
    model = next(a for a in container.artifacts if a.present).config["model"]
    doc = {"file": container.path, "size": container.file_size,
           "format_version": ".".join(map(str, container.format_version)),
           "model": container.name, "tag": container.tag, "sizes": _layer_sizes(container),
           "inputs": model["inputs"], "outputs": model["outputs"],
           "custom_ops": _custom_ops_doc(container),
           "artifacts": [_artifact_doc(a) for a in container.artifacts],
           "signature": _signature_doc(container)}
    if host:
        doc.update(_host_doc(container))
    return doc


def _inspect_lines(doc: dict) -> list[str]:
    sizes = doc["sizes"]
    lines = [f"file:       {doc['file']} ({_bytes(doc['size'])})",
             f"format:     {doc['format_version']}",
             f"model:      {doc['model']} (tag {doc['tag']})",
             "signature:  " + (f"signed by {', '.join(doc['signature']['keys'])} (not checked "
                               "here: mlpack verify FILE --key PUB)" if doc["signature"]["signed"]
                               else "unsigned (mlpack sign FILE --key NAME.key)"),
             f"contents:   code {_bytes(sizes['code'])}, weights {_bytes(sizes['weights'])}, "
             f"test vectors {_bytes(sizes['vectors'])}"]
    lines += [f"input:      {_sig_text(s)}" for s in doc["inputs"]]
    lines += [f"output:     {_sig_text(s)}" for s in doc["outputs"]]
    for op in doc.get("custom_ops", []):
        source = op.get("source") or ""
        lines.append(f"custom op:  {op['domain']} {op['op_type']} = {op['function']} "
                     f"({len(source.splitlines())} lines of source, sha256 {op['sha256']})")
    lines.append(f"artifacts:  {len(doc['artifacts'])}")
    for a in doc["artifacts"]:
        if not a.get("present", True):   # a partial container's (spec/SPEC.md section 2)
            lines.append(f"  [{a['index']}] {a['device']:<8} {'-':<10} {a['precision']:<5} "
                         f"platform {_platform_doc(a['platform'])}, not in this partial "
                         "container (mlpack pull --all fetches it)")
            continue
        timed = a.get("latency") or {}
        speed = (f", {timed['seconds'] * 1e3:.3g} ms a run at build ({timed.get('threads', 1)} "
                 f"thread)" if isinstance(timed.get("seconds"), (int, float)) else "")
        where = f"platform {_platform_doc(a['platform'])}"
        if a.get("cuda"):
            c = a["cuda"]
            where = (f"sm_{a['cuda_sm']} and newer (PTX {c['ptx_isa']}, driver {c['driver']}+"
                     f"{', cubin' if c['cubin'] else ''})")
        lines.append(f"  [{a['index']}] {a['device']:<8} {a['target']:<10} {a['precision']:<5} "
                     f"{where}, {_accuracy_text(a['accuracy'])}"
                     f"{speed}, min runtime {a['min_runtime']}")
    if "host" in doc:
        lines.append(f"host:       {doc['host']} (selection by {doc['engine']})")
        lines += [f"  [{v['index']}] {v['reason']}" for v in doc["verdicts"]]
    return lines


def _platform_doc(p) -> str:
    return "/".join(p.get(k) for k in ("os", "architecture", "variant") if p.get(k)) if p else "any"


def _open(path: Path):
    from mlpack.spec.container import open_container

    return open_container(_existing(path, "container"))


@command("inspect")
def inspect_cmd(
    file: Path = typer.Argument(..., metavar="FILE.mlpack", help="the container (.mlpack)"),
    host: bool = typer.Option(False, "--host", help="say which artifact this host would run, and why"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Show what a container holds: signature, artifacts, sizes; with --host, the selection."""
    import json

    with _open(file) as container:
        doc = inspect_doc(container, host)
    if json_out:
        typer.echo(json.dumps(doc, indent=1, sort_keys=True))
        return
    for line in _inspect_lines(doc):
        typer.echo(line)


# ---- validate


class ValidationFailed(Error):
    """An artifact of the container misses its bundled test vectors."""


def _validate_rows(path: str) -> list[dict]:
    """One row per artifact: the vectors run where this host can, under qemu-user where only
    the architecture differs and qemu is installed (packager/emulate.py), the reason where not."""
    import warnings

    from mlpack.packager import emulate
    from mlpack.runtime import load
    from mlpack.spec.errors import PortableFallbackWarning, UnsignedContainerWarning

    # a first emulated run compiles libmlpack for qemu (seconds): say so to a person watching
    progress = _progress(False)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PortableFallbackWarning)
        warnings.simplefilter("ignore", UnsignedContainerWarning)  # inspect says it; MLPACK_TRUSTED_KEYS applies
        with load(path) as model:
            for v in model.verdicts:
                art = v.artifact
                row = {"index": art.index, "device": art.device, "precision": art.precision,
                       "target": art.config["artifact"]["target"], "cases": 0,
                       "max_err": None, "rel_l2": None, "allowed": None}
                # an artifact a partial pull left out is not here to run, emulated or not
                emu = None if v.runnable or not art.present else \
                    emulate.emulator_for(art, model.host.arch)
                missing = emulate.missing(emu) if emu else ""
                if v.runnable:
                    rows.append({**row, **_validate_one(model, art.index)})
                elif emu and not missing:
                    rows.append({**row, **_validate_emulated(path, v, emu, progress)})
                else:
                    why = f"; not run under emulation: {missing}" if missing else ""
                    rows.append({**row, "verdict": "skipped", "detail": v.reason + why})
    return rows


def _validate_emulated(path: str, verdict, emu, progress=None) -> dict:
    """An artifact of another architecture run under qemu-user: a row as _validate_one's, whose
    detail says where it ran; skipped where qemu could not run it after all."""
    from mlpack.packager import emulate

    where = f"under {emu.qemu}"
    try:
        result = emulate.validate(path, verdict.artifact, verdict.reason, emu, progress)
    except emulate.NotEmulated as e:
        return {"verdict": "skipped",
                "detail": f"{verdict.reason}; not run under emulation: {one_paragraph(e)}"}
    except Error as e:  # it ran and the engine failed, or the program crashed
        return {"verdict": "FAIL", "detail": f"cannot run {where}: {one_paragraph(e)}"}
    row = _result_row(result)
    if row["verdict"] == "ok":
        why = verdict.reason.removeprefix("passed over: ")
        return {**row, "detail": f"validated {where} ({why})"}
    return {**row, "detail": f"{where}: {row['detail']}"}


def _validate_one(model, index: int) -> dict:
    try:
        result = model.validate(index)
    except Error as e:  # this host should run it and cannot (code the engine cannot load)
        return {"verdict": "FAIL", "detail": f"cannot run: {one_paragraph(e)}"}
    return _result_row(result)


def _result_row(result) -> dict:
    """The table's columns, verdict and detail for one ValidationResult."""
    if result.cases == 0:  # another writer's container may carry none: nothing to hold it to
        return {"verdict": "no vectors", "detail": "the artifact carries no test vectors"}
    allowed = [o.allowed_max_error for o in result.outputs if o.allowed_max_error is not None]
    out = {"cases": result.cases,
           "max_err": max((o.max_error for o in result.outputs), default=0.0),
           "rel_l2": max((o.rel_l2 for o in result.outputs), default=0.0),
           "allowed": min(allowed) if allowed else None}
    bad = [o for o in result.outputs if not o.ok]
    if not bad:
        return {**out, "verdict": "ok", "detail": ""}
    return {**out, "verdict": "FAIL", "detail": "; ".join(o.detail() for o in bad)}


def _blind_spots(path: str) -> list[str]:
    import warnings

    from mlpack.runtime import load
    from mlpack.spec.errors import (NoRunnableArtifactError, PortableFallbackWarning,
                                    UnsignedContainerWarning)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PortableFallbackWarning)
        # the vectors are every artifact's: the portable one reads them without loading code
        try:
            model = load(path, device="portable")
        except NoRunnableArtifactError:   # a partial container (mlpack pull) may not hold it
            warnings.simplefilter("ignore", UnsignedContainerWarning)   # validate said it
            model = load(path)
        with model:
            return model.blind_spots()


def _accuracy_text(acc: dict) -> str:
    """A config's recorded accuracy in a few words: against float64 (format 1.1) or, in a 1.0
    container, the max abs error against what its vectors were computed by."""
    from mlpack.spec.accuracy import baseline_word

    if "max_error" in acc or "baseline" in acc:
        return (f"max err {_err(acc.get('max_error'))} vs float64 "
                f"({baseline_word(acc.get('baseline'))} {_err(acc.get('baseline_max_error'))})")
    return f"max abs err {_err(acc.get('max_abs_error'))} vs {acc.get('reference', '?')}"


def _table(rows: list[dict]) -> list[str]:
    head = ("artifact", "device", "target", "precision", "cases", "max err", "rel L2",
            "allowed", "verdict")
    body = [(str(r["index"]), r["device"], r["target"], r["precision"], str(r["cases"]),
             _err(r["max_err"]), _err(r["rel_l2"]), _err(r["allowed"]), r["verdict"])
            for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in (head, *body)]


@command("validate")
def validate_cmd(file: Path = typer.Argument(..., metavar="FILE.mlpack",
                                             help="the container (.mlpack)")) -> None:
    """Check structure and every digest, then run the bundled test vectors on every artifact this
    host can run, and under qemu-user on other architectures' where it is installed; exit 2 on
    any failure (usable as a CI step)."""
    file = _existing(file, "container")
    with _open(file):  # structure and every blob's digest, before running anything
        pass
    rows = _validate_rows(str(file))
    for line in _table(rows):
        typer.echo(line)
    for r in rows:
        if r["detail"]:
            typer.echo(f"  [{r['index']}] {r['verdict']}: {r['detail']}")
    for line in _blind_spots(str(file)):
        typer.echo(f"warning: {line}")
    failed = [r for r in rows if r["verdict"] == "FAIL"]
    if failed:
        names = ", ".join(f"{r['index']} ({r['target']} {r['precision']})" for r in failed)
        raise ValidationFailed(f"{file}: {len(failed)} of {len(rows)} artifacts fail their test "
                               f"vectors: {names}")


# ---- run


@command("run")
def run_cmd(
    file: Path = typer.Argument(..., metavar="FILE.mlpack", help="the container (.mlpack)"),
    inputs: list[str] = typer.Option([], "--input", "-i", metavar="NAME=FILE.npy",
                                     help="an input's array, once per input"),
    output: Path = typer.Option(..., "--output", "-o", metavar="DIR",
                                help="folder to write NAME.npy per output"),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEVICE",
                                         help="cpu, cuda or portable"),
    precision: Optional[str] = typer.Option(None, "--precision", metavar="PRECISION",
                                            help="fp32, fp16, bf16 or int8"),
) -> None:
    """Run a container on this host; write each output as NAME.npy."""
    import warnings

    import numpy as np

    from mlpack.runtime import load
    from mlpack.spec.errors import PortableFallbackWarning, UnsignedContainerWarning

    feeds = parse_inputs(inputs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PortableFallbackWarning)
        warnings.simplefilter("always", UnsignedContainerWarning)
        model = load(_existing(file, "container", device=device, precision=precision),
                     device=device, precision=precision)
    with model:
        results = model.run(feeds)
    # one line for a person (not Python's warning format), after the run so an error stays alone
    for w in caught:
        if isinstance(w.message, (PortableFallbackWarning, UnsignedContainerWarning)):
            typer.echo(f"note: {one_paragraph(w.message)}", err=True)
    output.mkdir(parents=True, exist_ok=True)
    for name, value in results.items():
        target = output / f"{name.replace('/', '_').replace(os.sep, '_')}.npy"
        np.save(target, value)
        typer.echo(f"{name}: {value.dtype}{list(value.shape)} -> {target}")


# ---- bench


def _thread_counts(text: str) -> list[int]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items or not all(x.isdigit() and int(x) >= 1 for x in items):
        raise InputError(f"--threads {text!r}: expected positive integers separated by commas, "
                         "e.g. 1,2")
    return list(dict.fromkeys(int(x) for x in items))


class OutputsDisagree(Error):
    """mlpack's and ONNX Runtime's outputs differ beyond the benchmark's tolerance."""

    exit_code = EXIT_INTERNAL


def _bench_build_seconds(onnx_path: Path, progress) -> float:
    """How long ``mlpack build`` takes on the model (every default target), into a scratch file."""
    import tempfile
    import time
    import warnings

    from mlpack.packager.build import SkippedTargetWarning, build

    if progress:
        progress(f"building {onnx_path.name} (timed)")
    with tempfile.TemporaryDirectory(prefix="mlpack-bench-") as tmp:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SkippedTargetWarning)
            t0 = time.perf_counter()
            build(onnx_path, os.path.join(tmp, "model.mlpack"))
            return time.perf_counter() - t0


@command("bench")
def bench_cmd(
    file: Path = typer.Argument(..., metavar="FILE.mlpack", help="the container (.mlpack)"),
    compare: Optional[Path] = typer.Option(
        None, "--compare", metavar="MODEL.onnx",
        help="time ONNX Runtime on this model too, count FLOPs, time a build"),
    threads: str = typer.Option("1,2", "--threads", metavar="N,N",
                                help="thread counts, comma-separated"),
    repeat: int = typer.Option(20, "--repeat", metavar="N",
                               help="timed runs per runtime and thread count"),
    min_seconds: float = typer.Option(2.0, "--min-seconds", metavar="S",
                                      help="time at least this long per thread count"),
    max_seconds: float = typer.Option(30.0, "--max-seconds", metavar="S",
                                      help="time budget per thread count (at least 3 runs each)"),
    dim: list[str] = typer.Option(
        [], "--dim", metavar="NAME=SIZE",
        help="seeded random inputs of this size instead of the test vectors"),
    seed: int = typer.Option(0, "--seed", metavar="N",
                             help="seed of the random inputs (with --dim)"),
    no_rss: bool = typer.Option(False, "--no-rss", help="skip measuring peak memory"),
    precision: list[str] = typer.Option(
        [], "--precision", "-p", metavar="PRECISION",
        help="time the artifact of this precision; several (or 'all': every precision the "
             "container has) side by side, a row each"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Time a container on this host (median latency per thread count, peak memory); with
    --compare MODEL.onnx, against ONNX Runtime on the same inputs (ratio, GFLOP/s, % of the
    measured matmul peak, outputs checked) and with the model's build time."""
    import json

    from mlpack.packager import bench

    counts = _thread_counts(threads)
    if repeat < 1:
        raise InputError(f"--repeat {repeat}: at least 1")
    with _open(file) as box:  # a broken or foreign file is a FormatError here, before any timing
        have = list(dict.fromkeys(a.precision for a in box.artifacts))
    wanted = _bench_precisions(precision, have, file)
    dims = _key_int(dim, "--dim")
    progress = _progress(json_out)
    build_seconds = None
    if compare is not None:
        from mlpack.codegen.onnx.importer import load_model

        load_model(_existing(compare, "ONNX model"))  # a clear error for a file that is not ONNX
        build_seconds = _bench_build_seconds(compare, progress)
    results = []
    for p in wanted:
        stem = file.stem if len(wanted) == 1 else f"{file.stem} {p}"
        results.append(bench.bench_model(
            file, onnx_path=compare, name=stem, threads=counts, repeat=repeat,
            min_seconds=min_seconds, max_seconds=max_seconds, dims=dims, seed=seed,
            rss=not no_rss, build_seconds=build_seconds, precision=p, progress=progress))
    words = ["mlpack bench", str(file)] + (["--compare", str(compare)] if compare else [])
    words += ["--threads", ",".join(map(str, counts)), "--repeat", str(repeat)]
    words += [f"--precision {p}" for p in precision]
    words += [f"--dim {d}" for d in dim] + (["--json"] if json_out else [])
    doc = bench.document(results, " ".join(words))
    if json_out:
        typer.echo(json.dumps(doc, indent=1))
    else:
        for result in results:
            a = result["artifact"]
            typer.echo(f"model:      {result['model']}: artifact {a['index']} ({a['target']} "
                       f"{a['precision']}, {a['device']})")
        result = results[0]
        shapes = ", ".join(f"{k}{v['shape']}" for k, v in result["inputs"].items())
        typer.echo(f"inputs:     {shapes} from {result['input_source']}")
        if result["flops"]:
            typer.echo(f"flops:      {bench.si(result['flops'])}FLOP per run (Conv, Gemm, "
                       "MatMul, Einsum)")
        for line in bench.table_lines(results) + [""] + bench.summary_lines(doc):
            typer.echo(line)
    bad = bench.mismatches(results)
    if bad:
        raise OutputsDisagree(f"mlpack and ONNX Runtime disagree beyond rtol {bench.RTOL:g}, "
                              f"atol {bench.ATOL:g}: {bad[0]}")


def _bench_precisions(asked: list[str], have: list[str], file) -> list:
    """The precisions ``mlpack bench`` times, each a row: [None] (load's choice) when none was
    asked for; ``all``: every precision of the container."""
    from mlpack.codegen import precisions

    if not asked:
        return [None]
    names = [n for item in asked for n in item.split(",") if n.strip()]
    if "all" in names:
        return have
    wanted = precisions.expand(names)
    for p in wanted:
        if p not in have:
            raise InputError(f"{file}: no artifact of precision {p} (it has {', '.join(have)})")
    return wanted


def _print_version(value: bool) -> None:
    if value:
        from mlpack import __version__

        typer.echo(f"mlpack {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Show the version and exit.")) -> None:
    """mlpack: one ONNX model in, one container out, runnable on every kind of hardware."""


# the signing and registry commands live in their own modules; importing them registers them
from mlpack.packager import registry_cli, trust_cli  # noqa: E402,F401


def _ignore_further_ctrl_c() -> None:
    """SIGINT ignored for the rest of an interrupted program: it already has its message out,
    its scratch files gone and its status (130) decided. The interpreter's shutdown puts
    SIGINT's default action back, so a Ctrl-C arriving during it would end the process by
    the signal instead of the status: the likeliest reading of the one CI run whose build
    printed the message and then ended by SIGINT (-2)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    """The console script ``mlpack``."""
    try:
        app(args=argv, prog_name="mlpack", standalone_mode=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if argv is None:
            if code == EXIT_INTERRUPTED:
                _ignore_further_ctrl_c()
            raise
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
