"""codegen/cores.py: a compile's share of the cores, from the build's count of compiles not yet
finished, and the parts a target's library is cut into from it (codegen/targets/cpu/module.py)."""

from __future__ import annotations

import multiprocessing

import pytest

from mlpack.codegen import cores
from mlpack.codegen.targets.cpu import module


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(cores, "machine", lambda: 4)
    yield
    cores.set_unfinished(None)


def test_a_compile_alone_has_every_core(four_cores):
    cores.set_unfinished(None)
    assert cores.share() == 4


@pytest.mark.parametrize("unfinished, share", [(6, 1), (4, 1), (3, 1), (2, 2), (1, 4), (0, 4)])
def test_the_cores_are_shared_among_the_compiles_left(four_cores, unfinished, share):
    counter = multiprocessing.get_context("spawn").Value("i", unfinished)
    cores.set_unfinished(counter)
    assert cores.share() == share
    with counter.get_lock():   # another compile finished: the share is read again
        counter.value = max(0, unfinished - 1)
    assert cores.share() == max(1, 4 // max(1, unfinished - 1))


def test_a_library_is_cut_into_a_part_per_spare_core(four_cores):
    counter = multiprocessing.get_context("spawn").Value("i", 2)
    cores.set_unfinished(counter)
    big = 10 * module.PART_BYTES
    assert module._part_count(big) == 2            # two compiles left: two cores each
    assert module._part_count(module.PART_BYTES + 1) == 1   # too little for two parts
    assert module._part_count(0) == 1
    counter.value = 1                              # the last one: the whole machine
    assert module._part_count(big) == 4
    assert module._part_count(2 * module.PART_BYTES) == 2
    counter.value = 5                              # more compiles than cores: no parts
    assert module._part_count(big) == 1
