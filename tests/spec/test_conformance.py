"""The container conformance corpus (spec/conformance/): every file gets the verdict that
expected.json states, and the generator reproduces the committed files byte for byte. The C
engine runs the same corpus against the same expected.json."""

from __future__ import annotations

import json
import os

import pytest

from mlpack.spec import container as c
from mlpack.spec import errors
from mlpack.spec.conformance import generate

CORPUS = os.path.dirname(generate.__file__)
with open(os.path.join(CORPUS, "expected.json")) as _f:
    EXPECTED = json.load(_f)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_verdict(name):
    want = EXPECTED[name]
    path = os.path.join(CORPUS, name)
    if want["verdict"] == "ok":
        with c.open_container(path) as k:
            assert k.artifacts and k.format_version[0] == 1
        return
    with pytest.raises(errors.FormatError) as info:
        c.open_container(path)
    assert type(info.value).__name__ == want["error"], str(info.value)
    assert want["message_contains"] in str(info.value)
    assert os.path.basename(path) in str(info.value), "the message must name the file"


def test_error_names_are_format_error_classes():
    for want in EXPECTED.values():
        if want["verdict"] == "error":
            assert issubclass(getattr(errors, want["error"]), errors.FormatError)


def test_corpus_covers_the_required_cases():
    required = {"ok_minimal", "ok_multi", "ok_minor_unknown_fields", "err_truncated",
                "err_wrong_digest", "err_missing_blob", "err_major_2", "err_index_json_malformed",
                "err_config_json_malformed", "err_index_media_type", "err_duplicate_member",
                "err_dotdot_member", "err_absolute_member", "err_oversized_size", "err_not_a_tar",
                "err_empty", "err_tar_checksum", "err_zero_artifacts"}
    assert required <= {n.removesuffix(".mlpack") for n in EXPECTED}


def test_generator_reproduces_the_committed_corpus(tmp_path):
    written = generate.generate(str(tmp_path))
    committed = {n for n in os.listdir(CORPUS) if n.endswith(".mlpack")} | {"expected.json"}
    assert set(written) == committed
    for name in written:
        with open(os.path.join(CORPUS, name), "rb") as a, open(tmp_path / name, "rb") as b:
            assert a.read() == b.read(), f"{name} differs from a fresh run of generate.py"
