"""The ``mlpack`` command line (typer).

    mlpack import MODEL.onnx [--ir FILE] [--print-ir]
    mlpack run-reference MODEL.onnx --input NAME=FILE.npy ... --output DIR
    mlpack conformance [--filter REGEX] [--jobs N] [-v]

Every command body runs under ``_errors``: an ``mlpack.Error`` (a user's mistake or an
unsupported model) prints as one paragraph ``error: ...`` on stderr and exits 2, never with a
traceback; anything else is an mlpack bug and prints ``internal error: ...`` with a hint to
rerun with ``MLPACK_DEBUG=1`` (which shows the traceback), exit 1. The compiler is imported
inside the commands, so ``mlpack --help`` stays quick. A later command (build, inspect,
validate, run) is one more ``@command`` function here.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from pathlib import Path
from typing import Callable, Optional

import typer

from ..spec.errors import Error, InputError

app = typer.Typer(
    name="mlpack",
    help="Compile one ONNX model into one file that runs on every kind of hardware.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_USER = 2
EXIT_INTERNAL = 1


# ---------------------------------------------------------------- error reporting


def _debug_level() -> int:
    from ..codegen import debug  # the one registry of flags; imports nothing heavy

    return debug.level()


def one_paragraph(text: str) -> str:
    """``text`` with its whitespace runs (newlines included) folded to single spaces."""
    return " ".join(str(text).split())


def report_error(exc: BaseException) -> int:
    """Print ``exc`` for a person and give the exit code."""
    from ..codegen.onnx.builder import NeedsValue

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
        except (typer.Exit, typer.Abort, SystemExit, KeyboardInterrupt):
            raise
        except Exception as e:
            if type(e).__module__.startswith("click"):
                raise
            raise typer.Exit(report_error(e)) from None

    return wrapper


def command(name: str | None = None, **kwargs) -> Callable:
    """``app.command`` with mlpack's error handling around the body."""

    def register(fn: Callable) -> Callable:
        app.command(name, **kwargs)(_errors(fn))
        return fn

    return register


# ---------------------------------------------------------------- summaries


def _existing(path: Path, what: str = "model") -> Path:
    if not path.exists():
        raise InputError(f"{path}: no such file ({what})")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a {what} file")
    return path


def format_port(graph, port) -> str:
    """``x: f32[batch=$batch, d1=784]``: a graph input/output with its dims in layout order."""
    from ..spec.ir.printer import format_expr

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
    from ..spec.ir.graph import Comprehension, Procedure

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


@command("import")
def import_(
    model: Path = typer.Argument(..., help="the ONNX model file"),
    ir: Optional[Path] = typer.Option(None, "--ir", help="write the IR text form to this file"),
    print_ir: bool = typer.Option(False, "--print-ir", help="print the IR text form"),
) -> None:
    """Import and compile an ONNX model; print a summary of its IR."""
    from ..codegen.compile import compile_onnx
    from ..spec.ir.printer import format_graph
    from ..codegen.onnx.importer import load_model

    proto = load_model(_existing(model))
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
        path = _existing(Path(file), f"input {name!r}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except Exception as e:
            raise InputError(f"{path}: not a readable .npy file for input {name!r} ({e})") from None
    return feeds


@command("run-reference")
def run_reference_cmd(
    model: Path = typer.Argument(..., help="the ONNX model file"),
    inputs: list[str] = typer.Option([], "--input", "-i", help="NAME=FILE.npy, once per input"),
    output: Path = typer.Option(..., "--output", "-o", help="folder to write NAME.npy per output"),
) -> None:
    """Run a model on the NumPy reference interpreter; write each output as NAME.npy."""
    import numpy as np

    from .reference import run_reference

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
    filter: Optional[str] = typer.Option(None, "--filter", help="regular expression on case names"),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="worker processes"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="print each failure"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write {case: [op, verdict, detail]}"),
    update_floor: Optional[Path] = typer.Option(
        None, "--update-floor", help="add the cases that now pass to this floor file (it only rises)"),
) -> None:
    """Run ONNX's backend node suite through mlpack: pass/fail per operator and in total."""
    import json
    import re
    import time

    from .. import conformance

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


@app.callback()
def _root() -> None:
    """mlpack: one ONNX model in, one container out, runnable on every kind of hardware."""


def main(argv: list[str] | None = None) -> int:
    """The console script ``mlpack``."""
    try:
        app(args=argv, prog_name="mlpack", standalone_mode=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if argv is None:
            raise
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
