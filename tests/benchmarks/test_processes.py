"""benchmarks/processes.py: one container timed in several fresh processes, on each one's main
thread and on a thread it starts."""

from __future__ import annotations

import os
import warnings

from benchmarks import processes
from mlpack.packager.build import build

MLP = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "mlp.onnx")


def test_each_process_times_its_main_thread_and_a_thread_of_its_own(tmp_path, capsys):
    path = str(tmp_path / "mlp.mlpack")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build(MLP, path, targets=["x86_64-v2"], cache=False)   # (every x86-64 host runs it)
    got = processes.main([path, "--processes", "2", "--runs", "3"])
    assert len(got) == 2 and all(set(g) == {"main", "thread"} for g in got)
    assert all(v > 0 for g in got for v in g.values())
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["main", "thread"]
    assert all(len(line.split(":")[1].split("(")[0].split()) == 2 for line in lines)
