"""benchmarks/real_models.py's BENCH and ``python -m benchmarks.run --set real``: issue 20's
real-model benchmark set names its fourteen entries, each a model of MODELS at fixed sizes, and
the suite lists them, refuses a name outside the set and skips an entry whose library is missing.
Nothing here exports a model or needs torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import real_models as rm
from benchmarks import run as bench_run

ROOT = Path(__file__).resolve().parents[2]

TORCHVISION = ("mobilenet_v2", "mobilenet_v3_large", "mnasnet1_0", "shufflenet_v2_x1_0",
               "regnet_y_400mf", "resnext50_32x4d", "googlenet", "convnext_tiny", "swin_t",
               "vit_b_16")
ISSUE_SET = tuple(f"tv_{n}" for n in TORCHVISION) + (
    "distilbert@128", "whisper_tiny_encoder", "gpt2_small@128", "gpt2_small@512")


def test_the_set_is_the_issues_fourteen_entries():
    assert tuple(rm.BENCH) == ISSUE_SET
    assert all(name == e.name for name, e in rm.BENCH.items())


def test_every_entry_is_a_model_with_each_dynamic_dim_fixed():
    for e in rm.BENCH.values():
        assert e.model in rm.MODELS, e.name
        symbols = {d for i in rm.MODELS[e.model].inputs for d in i.dims if isinstance(d, str)}
        assert set(e.dims) == symbols, e.name  # every size symbol bound, no other
        assert e.dims["batch"] == 1, e.name
    assert {n: e.dims.get("sequence") for n, e in rm.BENCH.items() if "sequence" in e.dims} == {
        "distilbert@128": 128, "gpt2_small@128": 128, "gpt2_small@512": 512}
    assert rm.BENCH["gpt2_small@512"].model == rm.BENCH["gpt2_small@128"].model == "gpt2_small"
    assert all(rm.MODELS[e.model].library == "torchvision" for e in rm.BENCH.values()
               if e.name.startswith("tv_"))


def test_list_prints_the_real_set():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--set", "real", "--list"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(ISSUE_SET)
    assert "batch=1 sequence=512" in lines[ISSUE_SET.index("gpt2_small@512")]


def test_the_held_out_set_is_the_real_models_outside_the_issues_set():
    assert set(rm.HELD_OUT) == set(rm.MODELS) - {e.model for e in rm.BENCH.values()} - set(rm.SMALL)
    assert all(e.dims == {"batch": 1} for e in rm.HELD_OUT.values())
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--set", "heldout", "--list"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    assert [line.split()[0] for line in proc.stdout.splitlines()] == list(rm.HELD_OUT)


def test_default_list_is_unchanged(capsys):
    from benchmarks import models

    assert bench_run.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list(models.NAMES)


@pytest.mark.parametrize("name", ["mlp", "tv_resnet18", "gpt2_small@256"])
def test_a_name_outside_the_real_set_is_an_error(name, capsys):
    with pytest.raises(SystemExit) as e:
        bench_run.main(["--set", "real", "--models", name])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"unknown entry of the real set {name!r}" in err and "gpt2_small@512" in err


def test_an_entry_whose_library_is_missing_is_skipped(monkeypatch, tmp_path):
    monkeypatch.setattr(rm, "available", lambda name: False)
    skipped = []
    results, failures = bench_run.run(
        ["tv_googlenet", "gpt2_small@512"], [1], folder=tmp_path, seed=0, repeat=1,
        min_seconds=0, max_seconds=0, rss=False, real=rm.BENCH, skipped_models=skipped)
    assert results == [] and failures == []
    assert skipped == ["tv_googlenet: needs torch and torchvision, not installed",
                       "gpt2_small@512: needs torch and transformers, not installed"]
    assert not any(tmp_path.iterdir())  # nothing exported or built
