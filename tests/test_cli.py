"""The ``mlpack`` command line: summaries, reference runs and one-paragraph errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from mlpack.packager.cli import main
import support

invoke = support.cli

_assert_one_paragraph_error = support.assert_user_error


def test_import_prints_summary_with_symbolic_dims(tiny_model_path):
    result = invoke("import", tiny_model_path)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "model:      tiny" in out
    assert "ai.onnx 17" in out
    assert "x: f32[batch=$batch, d1=4]" in out
    assert "y: f32[batch=$batch, d1=4]" in out
    assert "comprehension" in out and "constants:  1 (16 B)" in out
    assert "graph " not in out  # no IR unless asked


def test_import_print_ir_and_ir_file(tiny_model_path, tmp_path):
    from mlpack.spec.ir import parse_graph

    ir_file = tmp_path / "tiny.ir"
    result = invoke("import", tiny_model_path, "--print-ir", "--ir", ir_file)
    assert result.exit_code == 0, result.output
    text = ir_file.read_text()
    assert 'graph "tiny" {' in result.stdout and text in result.stdout
    assert parse_graph(text).name == "tiny"


def test_unsupported_op_is_one_paragraph_exit_2(tmp_path, onnx_model):
    import onnx

    node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="com.example")
    model = onnx_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])],
                       opsets=[("", 17), ("com.example", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    _assert_one_paragraph_error(invoke("import", path), "Frobnicate", "com.example", "frob")


def test_missing_file_exit_2(tmp_path):
    _assert_one_paragraph_error(invoke("import", tmp_path / "absent.onnx"), "absent.onnx", "no such file")


def test_truncated_file_exit_2(tmp_path, tiny_model_path):
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(tiny_model_path.read_bytes()[:40])
    _assert_one_paragraph_error(invoke("import", cut), "cut.onnx")


def test_run_reference_writes_outputs(tiny_model_path, tmp_path):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = invoke("run-reference", tiny_model_path, "--input", f"x={tmp_path / 'x.npy'}",
                    "--output", tmp_path / "out")
    assert result.exit_code == 0, result.output
    y = np.load(tmp_path / "out" / "y.npy")
    np.testing.assert_allclose(y, np.maximum(x + np.arange(4, dtype=np.float32), 0))


@pytest.mark.parametrize("arg, fragment", [
    ("z={x}", "no input 'z'"),
    ("x", "NAME=FILE.npy"),
    ("x={missing}", "no such file"),
    ("x={x64}", "float64"),
])
def test_run_reference_bad_inputs_exit_2(tiny_model_path, tmp_path, arg, fragment):
    np.save(tmp_path / "x.npy", np.zeros((3, 4), np.float32))
    np.save(tmp_path / "x64.npy", np.zeros((3, 4), np.float64))
    arg = arg.format(x=tmp_path / "x.npy", x64=tmp_path / "x64.npy", missing=tmp_path / "nope.npy")
    result = invoke("run-reference", tiny_model_path, "--input", arg, "--output", tmp_path / "out")
    _assert_one_paragraph_error(result, fragment.replace("float64", "f64"))


def test_run_reference_missing_input_exit_2(tiny_model_path, tmp_path):
    result = invoke("run-reference", tiny_model_path, "--output", tmp_path / "out")
    _assert_one_paragraph_error(result, "missing input 'x'")


def test_internal_error_hint_and_debug_traceback(tiny_model_path, monkeypatch):
    import mlpack.codegen.compile as compile_mod

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(compile_mod, "compile_onnx", boom)
    monkeypatch.delenv("MLPACK_DEBUG", raising=False)
    result = invoke("import", tiny_model_path)
    assert result.exit_code == 1
    assert "internal error: RuntimeError: kaboom" in result.stderr
    assert "MLPACK_DEBUG=1" in result.stderr and "Traceback" not in result.stderr
    monkeypatch.setenv("MLPACK_DEBUG", "1")
    result = invoke("import", tiny_model_path)
    assert result.exit_code == 1 and "Traceback" in result.stderr


def test_conformance_command_reports_per_operator(monkeypatch):
    import mlpack.conformance as conf

    seen = {}

    def fake_suite(pattern, jobs):  # the real suite loads ~1500 models: tests/conformance runs it
        seen.update(pattern=pattern, jobs=jobs)
        return {"test_relu": ("Relu", "pass", ""), "test_tree": ("Tree", "error", "unsupported")}

    monkeypatch.setattr(conf, "run_suite", fake_suite)
    result = invoke("conformance", "--filter", "^test_", "--jobs", "1", "-v")
    assert result.exit_code == 0, result.output
    assert seen == {"pattern": "^test_", "jobs": 1}
    assert "Relu" in result.stdout and "test_tree: unsupported" in result.stdout
    assert "1 of 2 node cases pass" in result.stdout


def test_conformance_update_floor_only_rises(monkeypatch, tmp_path):
    import mlpack.conformance as conf

    floor = tmp_path / "floor.txt"
    floor.write_text("test_a\n")
    results = {"test_a": ("A", "pass", ""), "test_b": ("B", "pass", ""), "test_c": ("C", "fail", "x")}
    monkeypatch.setattr(conf, "run_suite", lambda pattern, jobs: results)
    assert invoke("conformance", "--update-floor", floor).exit_code == 0
    assert conf.read_floor(str(floor)) == {"test_a", "test_b"}
    results["test_a"] = ("A", "fail", "regressed")
    result = invoke("conformance", "--update-floor", floor)
    assert result.exit_code == 1 and "test_a" in result.stderr
    assert conf.read_floor(str(floor)) == {"test_a", "test_b"}


def test_conformance_bad_filter_exit_2():
    _assert_one_paragraph_error(invoke("conformance", "--filter", "(("), "--filter")


def test_main_returns_exit_code(tmp_path, capsys):
    assert main(["import", str(tmp_path / "absent.onnx")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_console_script_runs_as_a_process(tiny_model_path):
    proc = subprocess.run([sys.executable, "-m", "mlpack.packager.cli", "import", str(tiny_model_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "$batch" in proc.stdout
