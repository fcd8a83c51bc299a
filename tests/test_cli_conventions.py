"""The ``mlpack`` command line behaves like other tools: ``-h``/``--help`` everywhere,
``--version``, flags without a value, help text shown as written, commands in the order a user
needs them, an input given twice refused, and Ctrl-C stopping a build at once with one line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
import typer

import mlpack
from mlpack.packager.cli import app
import support

invoke = support.cli

ORDER = ["build", "inspect", "validate", "run", "push", "pull", "keygen", "sign", "verify",
         "import", "run-reference", "conformance", "bench"]
OK_MINIMAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "spec", "conformance",
                          "ok_minimal.mlpack")


def _flags(name: str) -> list[str]:
    """The long names of command ``name``'s boolean flags."""
    command = typer.main.get_command(app).commands[name]
    return [opt for p in command.params if getattr(p, "is_flag", False)
            for opt in p.opts if opt.startswith("--")]


@pytest.mark.parametrize("name", ORDER)
@pytest.mark.parametrize("help_flag", ["--help", "-h"])
def test_every_command_has_help(name, help_flag):
    result = invoke(name, help_flag)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith(f"Usage: mlpack {name} "), out
    assert "<bool>" not in out
    assert re.search(r"-h, --help\s{2,}Show this message", out), out
    for flag in _flags(name):  # a flag takes no value: its help text follows it
        assert re.search(rf"{flag}\s{{2,}}\S", out), (flag, out)


def test_help_shows_bracketed_text_literally():
    out = invoke("conformance", "-h").stdout
    assert "write {case: [op, verdict, detail]}" in " ".join(out.split())


def test_app_help_lists_commands_in_order():
    for flag in ("--help", "-h"):
        result = invoke(flag)
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.stdout and "--version" in result.stdout
        commands = result.stdout.split("Commands:")[1].split("Environment")[0]
        listed = re.findall(r"^  (\S+)\s{2,}", commands, re.M)
        assert listed == ORDER, result.stdout


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"mlpack {mlpack.__version__}\n"


def test_repeated_input_refused(tiny_model_path, tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((1, 4), np.float32))
    np.save(tmp_path / "b.npy", np.ones((1, 4), np.float32))
    twice = ["-i", f"x={tmp_path / 'a.npy'}", "--input", f"x={tmp_path / 'b.npy'}"]
    for args in (["run-reference", tiny_model_path], ["run", OK_MINIMAL]):
        result = invoke(*args, *twice, "-o", tmp_path / "out")
        support.assert_user_error(result, "--input 'x' is given twice")
        assert not (tmp_path / "out").exists()


def test_repeated_dim_refused(tmp_path, tiny_model_path):
    result = invoke("build", tiny_model_path, "-o", tmp_path / "t.mlpack", "--dim", "batch=2",
                    "--dim", "batch=3")
    support.assert_user_error(result, "--dim 'batch' is given twice")
    assert os.listdir(tmp_path) == ["tiny.onnx"]


# ---------------------------------------------------------------- Ctrl-C


def test_ctrl_c_is_one_line_and_exit_130(tiny_model_path, tmp_path, monkeypatch):
    import mlpack.packager.build as build_mod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_mod, "validate_container", interrupted)
    result = invoke("build", tiny_model_path, "-o", tmp_path / "t.mlpack")
    assert result.exit_code == 130, result.output
    assert result.stderr == f"interrupted; nothing written to {tmp_path / 't.mlpack'}\n"
    assert os.listdir(tmp_path) == ["tiny.onnx"]
    monkeypatch.setattr("mlpack.packager.reference.run_reference", interrupted)
    result = invoke("run-reference", tiny_model_path, "-o", tmp_path / "out")
    assert (result.exit_code, result.stderr) == (130, "interrupted\n")


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # not a process, or gone
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry))
    return out


def _compile_workers(pid: int) -> list[int]:
    workers = []
    for child in _children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    workers.append(child)
        except OSError:
            continue
    return workers


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc") or (os.cpu_count() or 1) < 2,
                    reason="needs /proc and 2 cores (the parallel compile)")
@pytest.mark.parametrize("kill", [os.killpg, os.kill], ids=["terminal", "build-process"])
def test_ctrl_c_during_parallel_compile_stops_at_once(tmp_path, kill):
    from mlpack.packager.compiling import PARALLEL_MIN_OPS

    model = support.load_light().random_weight_model("shufflenet", 0)
    assert len(model.graph.node) >= PARALLEL_MIN_OPS  # so the cpu targets compile in workers
    onnx.save(model, str(tmp_path / "shufflenet.onnx"))
    out = tmp_path / "out"
    out.mkdir()
    # a session of its own: killpg sends SIGINT to the whole group, as a terminal's Ctrl-C does
    # (--no-cache: with a warm kernel cache, an earlier run's, the workers end within the
    # half second below and the build finishes before the interrupt). SIGINT as a terminal's
    # shell leaves it: a suite started in the background of a script runs with SIGINT
    # ignored, which its children inherit, and Python then installs no handler (the build
    # ignored the Ctrl-C and finished)
    proc = subprocess.Popen([sys.executable, "-m", "mlpack.packager.cli", "build",
                             str(tmp_path / "shufflenet.onnx"), "-o", str(out / "s.mlpack"),
                             "--no-cache"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300  # import, compile and the reference run come first
        while not _compile_workers(proc.pid):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the compile workers never started"
            time.sleep(0.05)
        time.sleep(0.5)  # into the compile (several seconds per target)
        workers = _compile_workers(proc.pid)
        t0 = time.monotonic()
        kill(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        seconds = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # (what tells a build that finished before the signal from one that ignored it)
    assert proc.returncode == 130, (
        f"stdout={stdout!r} stderr={stderr!r} seconds={seconds:.2f} workers={workers} "
        f"SIGINT here: {signal.getsignal(signal.SIGINT)!r}, blocked: "
        f"{signal.pthread_sigmask(signal.SIG_BLOCK, [])!r}")
    assert seconds < 2.0, seconds
    assert stdout == ""
    assert stderr == f"interrupted; nothing written to {out / 's.mlpack'}\n"
    assert os.listdir(out) == []  # neither the container nor the scratch file under validation
    time.sleep(0.2)
    assert not [w for w in workers if _alive(w)]
