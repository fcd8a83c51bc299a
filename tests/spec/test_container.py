"""The container reader and writer (spec/container.py): round trip, determinism, atomicity,
versioning, zero-copy blobs, resident memory, and fuzzing (every byte sequence gives a verdict:
a Container or a FormatError, nothing else). Needs nothing but a CPU."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlpack.spec import container as c
from mlpack.spec import errors, media
from mlpack.spec.conformance import generate as corpus

SCHEMAS = os.path.join(os.path.dirname(c.__file__), "schemas")


def _write(tmp_path, artifacts=None, name="tiny", **kw):
    path = tmp_path / "model.mlpack"
    c.write_container(path, name, artifacts or corpus.multi(), **kw)
    return path


def _layout_bytes(artifacts=None, edit=None) -> bytes:
    return corpus.tar(corpus.layout(artifacts, edit))


def _open_bytes(data: bytes, verify: bool = True):
    """Open ``data`` as a container file; returns the Container (closed) or raises."""
    fd, path = tempfile.mkstemp(suffix=".mlpack")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        with c.open_container(path, verify) as k:
            return k
    finally:
        os.unlink(path)


# ---------------------------------------------------------------- round trip


def test_round_trip_multi(tmp_path):
    specs = corpus.multi()
    with c.open_container(_write(tmp_path, specs)) as k:
        assert k.format_version == media.FORMAT_VERSION and k.name == "tiny" and k.tag == "latest"
        assert [a.device for a in k.artifacts] == ["portable", "cpu", "cpu", "cpu", "cuda"]
        assert [a.precision for a in k.artifacts] == ["fp32", "fp32", "fp32", "fp16", "fp32"]
        assert k.artifacts[0].platform is None
        assert k.artifacts[1].platform == {"os": "linux", "architecture": "amd64", "variant": "v3"}
        assert k.artifacts[1].annotations[media.ANN_CPU_FEATURES] == "avx2,fma"
        assert k.artifacts[4].annotations[media.ANN_CUDA_SM] == "80"
        assert k.artifacts[3].annotations[media.ANN_MAX_ABS_ERROR] == "0.001"
        for art, spec in zip(k.artifacts, specs):
            assert art.config == json.loads(c.canonical_json(spec.config))
            assert [layer.media_type for layer in art.layers] == [x.media_type for x in spec.layers]
            for ref, layer in zip(art.layers, spec.layers):
                assert ref.offset % 512 == 0
                assert bytes(k.blob(ref.digest)) == layer.data
        weights = {a.layer(media.WEIGHTS).digest for a in k.artifacts}
        assert len(weights) == 2  # fp32 weights shared by four artifacts, fp16 its own
        assert k.artifacts[0].layer(media.CODE_ELF) is None


def test_deterministic_bytes_and_fixed_tar_metadata(tmp_path):
    a = _write(tmp_path).read_bytes()
    b = _layout_bytes(corpus.multi())
    assert a == b
    with tarfile.open(fileobj=io.BytesIO(a)) as t:
        infos = t.getmembers()
    assert [i.name for i in infos] == sorted(i.name for i in infos)
    for i in infos:
        assert (i.mtime, i.uid, i.gid, i.uname, i.gname) == (0, 0, 0, "", "")
        assert i.mode == (0o755 if i.isdir() else 0o644)
    index = tarfile.open(fileobj=io.BytesIO(a)).extractfile("index.json").read()
    assert index == c.canonical_json(json.loads(index))


def test_write_is_atomic_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "model.mlpack"
    target.write_bytes(b"old")

    def boom(f, members):
        f.write(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(c, "write_tar", boom)
    with pytest.raises(RuntimeError):
        c.write_container(target, "tiny", [corpus.portable()])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.mlpack"]
    assert target.read_bytes() == b"old"


def test_writer_refuses_bad_specs(tmp_path):
    with pytest.raises(ValueError, match="at least one artifact"):
        c.write_container(tmp_path / "x.mlpack", "tiny", [])
    with pytest.raises(ValueError, match="tag"):
        c.write_container(tmp_path / "x.mlpack", "tiny", [corpus.portable()], tag="no spaces")
    spec = corpus.portable()
    spec.annotations = {"k": 1}
    with pytest.raises(ValueError, match="str to str"):
        c.write_container(tmp_path / "x.mlpack", "tiny", [spec])
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- versions and unknowns


def test_newer_minor_with_unknown_fields_and_layer_is_read():
    spec = corpus.portable()
    spec.layers.append(c.Layer("application/x-unknown", b"?"))
    k = _open_bytes(_layout_bytes([spec], corpus._unknown_fields))
    assert k.format_version == (1, 9)
    assert k.artifacts[0].layers[-1].media_type == "application/x-unknown"
    assert k.artifacts[0].layer(media.PROGRAM_PORTABLE) is not None


@pytest.mark.parametrize("kind", ["index", "nested", "config"])
def test_newer_major_anywhere_is_refused(kind):
    def edit(k, doc, i):
        if k == kind == "config":
            doc["mlpack_format"] = "3.1"
        elif k == kind:
            doc["annotations"][media.ANN_FORMAT_VERSION] = "3.1"
        return doc

    with pytest.raises(errors.VersionError, match=r"format 3\.1 is newer than this runtime reads "
                                                  r"\(1\.x\); upgrade mlpack"):
        _open_bytes(_layout_bytes(edit=edit))


@pytest.mark.parametrize("kind, raw, match", [
    ("index", b'{"a":1,"a":2}', "duplicate key"),
    ("index", b"[" * 100000 + b"]" * 100000, "index.json"),
    ("config", b'{"mlpack_format":"1.0","x":NaN}', "not valid JSON"),
    ("config", b'{"mlpack_format":"1.0"}', "'model' is missing"),
    ("manifest", b'{"artifactType":"application/other","layers":[]}', "artifactType"),
])
def test_bad_documents(kind, raw, match):
    with pytest.raises(errors.FormatError, match=match):
        _open_bytes(_layout_bytes(edit=lambda k, doc, i: raw if k == kind else doc))


def test_annotation_disagreeing_with_config():
    spec = corpus.portable()
    spec.annotations = {media.ANN_DEVICE: "cuda"}
    with pytest.raises(errors.ManifestError, match="disagrees with its config"):
        _open_bytes(_layout_bytes([spec]))


# ---------------------------------------------------------------- verification and blobs


def test_verify_false_skips_layer_hashing():
    data = bytearray(_layout_bytes())
    members = corpus.layout()
    weights = corpus._member(bytes(data), corpus._layer_blob(members, 1))
    data[weights.offset] ^= 0xFF
    assert _open_bytes(bytes(data), verify=False).artifacts
    with pytest.raises(errors.DigestError, match="does not match its digest"):
        _open_bytes(bytes(data))


def test_blob_is_a_zero_copy_view(tmp_path):
    k = c.open_container(_write(tmp_path))
    ref = k.artifacts[0].layer(media.WEIGHTS)
    view = k.blob(ref.digest)
    assert view.readonly and len(view) == ref.size
    assert (tmp_path / "model.mlpack").read_bytes()[ref.offset:ref.offset + ref.size] == view
    with pytest.raises(errors.MissingBlobError):
        k.blob("sha256:" + "0" * 64)
    k.close()  # a live view must not make close fail
    with pytest.raises(ValueError, match="closed"):
        k.blob(ref.digest)
    del view


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(errors.FormatError, match="cannot open"):
        c.open_container(tmp_path / "nope.mlpack")
    with pytest.raises(errors.FormatError, match="cannot open"):
        c.open_container(tmp_path)


_RSS_PROBE = """
import sys
from mlpack.spec.container import open_container
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
before = rss()
k = open_container(sys.argv[1])
w = k.blob(k.artifacts[0].layer("application/vnd.mlpack.weights.v1").digest)
print(rss() - before, len(w))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc to read RSS")
def test_open_100mb_weights_stays_small_in_memory(tmp_path):
    spec = corpus.portable()
    spec.layers[1] = c.Layer(media.WEIGHTS, os.urandom(100 << 20))
    path = _write(tmp_path, [spec])
    del spec
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(path)], capture_output=True,
                         text=True, check=True).stdout.split()
    grown, size = int(out[0]), int(out[1])
    assert size == 100 << 20
    assert grown < 16 << 20, f"opening grew RSS by {grown >> 20} MiB"


# ---------------------------------------------------------------- the tar reader


def test_gnu_tar_repack_with_dot_prefix_is_read(tmp_path):
    if not shutil.which("tar"):
        pytest.skip("tar is not installed")
    src = _write(tmp_path)
    (tmp_path / "x").mkdir()
    subprocess.run(["tar", "-xf", str(src), "-C", str(tmp_path / "x")], check=True)
    repacked = tmp_path / "repacked.mlpack"
    subprocess.run(["tar", "-cf", str(repacked), "-C", str(tmp_path / "x"), "."], check=True)
    with c.open_container(repacked) as k:
        assert len(k.artifacts) == 5


def _with_extra_header(typeflag: bytes, payload: bytes) -> bytes:
    valid = _layout_bytes()
    pad = bytes(-len(payload) % 512)
    return (c.tar_header("PaxHeader", len(payload), typeflag) + payload + pad + valid)


def test_pax_headers_are_skipped_unless_they_change_the_next_member():
    assert _open_bytes(_with_extra_header(b"x", b"11 mtime=0\n")).artifacts
    assert _open_bytes(_with_extra_header(b"g", b"16 comment=hi!!\n")).artifacts
    with pytest.raises(errors.TarError, match="'size'"):
        _open_bytes(_with_extra_header(b"x", b"11 size=99\n"))
    with pytest.raises(errors.TarError, match="malformed pax"):
        _open_bytes(_with_extra_header(b"x", b"99 mtime=0\n"))


@pytest.mark.parametrize("typeflag, what", [(b"1", "hard link"), (b"3", "character device"),
                                            (b"6", "FIFO"), (b"L", "unsupported tar type")])
def test_links_devices_and_gnu_types_are_refused(typeflag, what):
    with pytest.raises(errors.TarError, match=what):
        _open_bytes(_with_extra_header(typeflag, b""))


def test_lone_zero_block_and_missing_marker():
    valid = _layout_bytes()
    with pytest.raises(errors.TarError, match="lone zero block"):
        _open_bytes(valid[:-1024] + bytes(512) + c.tar_header("x", 0) + bytes(1024))
    with pytest.raises(errors.TruncatedError):
        _open_bytes(valid[:-512])


# ---------------------------------------------------------------- fuzzing

_VALID = _layout_bytes(corpus.multi())
_HEADERS = [0] + [m.offset - 512 for m in c.scan_tar(io.BytesIO(_VALID), "v", len(_VALID)).values()]


def _verdict(data: bytes):
    try:
        return _open_bytes(data)
    except errors.FormatError as e:
        assert str(e), "an error must say what is wrong"
        return e


@given(st.binary(max_size=4096))
def test_random_bytes_give_a_format_error(data):
    assert isinstance(_verdict(data), errors.FormatError)


@given(st.binary(min_size=1, max_size=2048))
def test_random_bytes_after_a_ustar_header_give_a_format_error(data):
    assert isinstance(_verdict(c.tar_header("index.json", len(data)) + data), errors.FormatError)


@given(st.integers(0, len(_VALID) - 1))
def test_every_truncation_is_an_error(n):
    assert isinstance(_verdict(_VALID[:n]), errors.FormatError)


@given(st.lists(st.tuples(st.integers(0, len(_VALID) * 8 - 1)), min_size=1, max_size=8))
def test_bit_flips_give_a_verdict(flips):
    data = bytearray(_VALID)
    for (bit,) in flips:
        data[bit // 8] ^= 1 << (bit % 8)
    _verdict(bytes(data))  # a Container or a FormatError; anything else fails the test


@given(st.sampled_from(_HEADERS), st.integers(0, 511), st.binary(min_size=1, max_size=12))
def test_header_field_overwrites_give_a_verdict(header, at, value):
    data = bytearray(_VALID)
    value = value[:512 - at]
    data[header + at:header + at + len(value)] = value
    block = data[header:header + 512]  # fix the checksum, so the reader must judge the fields
    block[148:156] = b" " * 8
    data[header + 148:header + 156] = b"%06o\0 " % sum(block)
    _verdict(bytes(data))


# ---------------------------------------------------------------- schemas


def test_configs_match_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(SCHEMAS, "config.schema.json")) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    for spec in corpus.multi():
        jsonschema.validate(json.loads(c.canonical_json(spec.config)), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"mlpack_format": "1.0"}, schema)
