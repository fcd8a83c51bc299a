"""Signed containers and the trust policy (spec/signing.py, runtime/c/src/trust.c), and that
what the engine loads is what it hashed.

The attacker's container carries a kernel library whose ELF constructor creates a marker file:
the marker appearing is code from the container having run. A control test shows it appears
when such a file loads without a policy, so its absence under a policy proves nothing ran,
in Python (mlpack.load), in C (libmlpack through ctypes) and in the C example.

The two races of issue 21 run here, 10,000 attempts each: the path swapped between two files
while loading (the engine reads the descriptor the Python reader opened, never the path again),
and the code blob rewritten in place while the engine opens the file (it hashes its own copy and
loads exactly that). A success is the planted code running.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import mlpack
from mlpack.spec import container as c
from mlpack.spec import media, signing
from mlpack.spec.errors import DigestError, KeyFileError, SignatureError
from test_example_c import example  # noqa: F401 (the C example, built once: a fixture)

ROOT = Path(__file__).resolve().parents[2]
ATTEMPTS = 10_000

PLANT = textwrap.dedent("""\
    #include <fcntl.h>
    #include <stdlib.h>
    #include <unistd.h>
    /* runs when the library is mapped: the proof that code from the container ran */
    __attribute__((constructor)) static void plant(void) {
      const char *p = getenv("PLANTED_CODE_MARKER");
      if (p) close(open(p, O_CREAT | O_WRONLY, 0600));
    }
    """)


# ---------------------------------------------------------------- fixtures


def _cc(src: str, out: Path) -> bytes:
    if not shutil.which("cc"):
        pytest.skip("cc is needed to build the planted library")
    path = out.with_suffix(".c")
    path.write_text(src)
    subprocess.run(["cc", "-shared", "-fPIC", "-Os", "-s", str(path), "-o", str(out)], check=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def work(tmp_path_factory, native_lib):
    return tmp_path_factory.mktemp("trust")


@pytest.fixture(scope="module")
def built(work):
    """tests/models/mlp.onnx with its portable and x86-64 v2 artifacts (every x86 CI runs v2)."""
    from mlpack.packager.build import build

    if os.uname().machine not in ("x86_64", "amd64"):
        pytest.skip("the native artifact here is x86-64")
    path = work / "mlp.mlpack"
    build(str(ROOT / "tests" / "models" / "mlp.onnx"), path, targets=["portable", "x86_64-v2"])
    return path


@pytest.fixture(scope="module")
def keys(work):
    return {who: signing.keygen(work / who) for who in ("release", "attacker")}


@pytest.fixture(scope="module")
def planted_elf(work) -> bytes:
    return _cc(PLANT, work / "plant.so")


@pytest.fixture
def marker(tmp_path, monkeypatch):
    path = tmp_path / "planted-code-ran"
    monkeypatch.setenv("PLANTED_CODE_MARKER", str(path))
    return path


def _code_layer(art) -> c.LayerRef:
    return art.layer(media.CODE_ELF)


def rewrite(src: Path, dst: Path, code: bytes | None = None) -> Path:
    """``src`` written again with every native artifact's code blob replaced by ``code``
    (digests recomputed: a well-formed container, as an attacker would make one)."""
    with c.open_container(src) as box:
        specs = []
        for art in box.artifacts:
            layers = [c.Layer(lr.media_type, code if code is not None and lr.media_type ==
                              media.CODE_ELF else bytes(box.blob(lr.digest)), dict(lr.annotations))
                      for lr in art.layers]
            specs.append(c.ArtifactSpec(art.config, layers, art.platform,
                                        dict(art.descriptor.get("annotations", {}))))
        ann = {k: v for k, v in box.annotations.items()
               if k not in (media.ANN_FORMAT_VERSION, media.ANN_MODEL_NAME)}
        c.write_container(dst, box.name, specs, ann, tag=box.tag)
    return dst


def _x(batch=2, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((batch, 784)).astype(np.float32)}


@pytest.fixture(scope="module")
def signed(built, keys, work):
    path = shutil.copy(built, work / "signed.mlpack")
    signing.sign(path, keys["release"][0])
    return Path(path)


@pytest.fixture(scope="module")
def forged(built, keys, work, planted_elf):
    """The attacker's container: planted code, digests recomputed, signed with their key."""
    path = rewrite(built, work / "forged.mlpack", planted_elf)
    signing.sign(path, keys["attacker"][0])
    return path


# ---------------------------------------------------------------- signing


def test_sign_verify_round_trip_and_what_the_file_holds(signed, keys, built):
    kid = signing.key_id(signing.load_signing_key(keys["release"][0]).public_key())
    assert signing.verify_file(signed, keys["release"][1]) == kid
    with c.open_container(signed) as box, c.open_container(built) as orig:
        assert box.nested_digest == orig.nested_digest   # signing changes index.json only
        assert box.format_version == (1, 2) and box.tag == orig.tag
        [s] = box.signatures
        claim = json.loads(s.payload)["critical"]
        assert claim["image"]["docker-manifest-digest"] == box.nested_digest
        assert claim["type"] == "cosign container image signature" and s.key == kid
        sig_entry = [e for e in box.index["manifests"] if e.get("artifactType")][0]
        assert sig_entry["annotations"][media.REF_NAME] == \
            box.nested_digest.replace(":", "-") + ".sig"   # where cosign looks in a registry
    with pytest.raises(SignatureError, match="1 by keys not trusted"):
        signing.verify_file(signed, keys["attacker"][1])


def test_signing_is_deterministic_and_resigning_replaces(built, keys, tmp_path):
    a, b = shutil.copy(built, tmp_path / "a.mlpack"), shutil.copy(built, tmp_path / "b.mlpack")
    for p in (a, b):
        signing.sign(p, keys["release"][0])
    assert Path(a).read_bytes() == Path(b).read_bytes()
    signing.sign(a, keys["attacker"][0])
    signing.sign(a, keys["release"][0])     # again: replaces its own, keeps the other
    with c.open_container(a) as box:
        assert len(box.signatures) == 2
    for who in ("release", "attacker"):
        signing.verify_file(a, keys[who][1])


def test_a_signature_moved_to_a_tampered_container_names_another(built, signed, keys, tmp_path,
                                                                 planted_elf):
    """Recomputed digests with the release signature carried over: the signature still verifies
    over its payload, but the payload names the original nested index."""
    tampered = rewrite(built, tmp_path / "t.mlpack", planted_elf)
    with c.open_container(signed) as box:
        layer = [e for e in box.index["manifests"] if e.get("artifactType")][0]
        manifest = box.json_blob(layer["digest"])
        payload = bytes(box.signatures[0].payload)
    with c.open_container(tampered) as box:
        nested = next(e for e in box.index["manifests"])
        members = {n: box.member_bytes(n) for n in box.member_names() if n != "index.json"}
        manifest["subject"] = {k: nested[k] for k in ("mediaType", "digest", "size")}
        blob = c.canonical_json(manifest)
        members[c.BLOB_DIR + c.digest_of(blob)[7:]] = blob
        members[c.BLOB_DIR + c.digest_of(payload)[7:]] = payload
        members[c.BLOB_DIR + c.digest_of(signing.EMPTY_CONFIG)[7:]] = signing.EMPTY_CONFIG
        entry = {"mediaType": media.OCI_MANIFEST, "artifactType": media.SIGNATURE_ARTIFACT_TYPE,
                 "digest": c.digest_of(blob), "size": len(blob)}
        members["index.json"] = c.canonical_json(dict(box.index, manifests=[nested, entry]))
        c.write_file_atomic(tmp_path / "moved.mlpack", sorted(members.items()))
    for check in (lambda p: signing.verify_file(p, keys["release"][1]),
                  lambda p: mlpack.load(p, trusted_keys=keys["release"][1])):
        with pytest.raises(SignatureError, match="1 signing another container"):
            check(tmp_path / "moved.mlpack")


def test_key_files_are_checked(keys, signed, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ecpub, empty = tmp_path / "p256.pub", tmp_path / "empty"
    empty.mkdir()
    ecpub.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    for spec, why in ((keys["release"][0], "private key"), (ecpub, "not Ed25519"),
                      (tmp_path / "none.pub", "no such file"), (empty, "no .pub or .pem")):
        with pytest.raises(KeyFileError, match=why):
            mlpack.load(signed, trusted_keys=spec)
    with pytest.raises(KeyFileError, match="exists"):
        signing.keygen(keys["release"][0].with_suffix(""))


def test_encrypted_signing_key(built, tmp_path, monkeypatch):
    monkeypatch.setenv("MLPACK_KEY_PASSWORD", "s3cret")
    private, public = signing.keygen(tmp_path / "enc")
    assert b"ENCRYPTED" in private.read_bytes()
    path = shutil.copy(built, tmp_path / "m.mlpack")
    signing.sign(path, private)
    monkeypatch.delenv("MLPACK_KEY_PASSWORD")
    with pytest.raises(KeyFileError, match="MLPACK_KEY_PASSWORD"):
        signing.sign(path, private)
    assert signing.verify_file(path, public)


# ---------------------------------------------------------------- the policy


def test_signed_container_loads_under_the_policy_in_python_and_c(signed, keys, monkeypatch):
    from mlpack.runtime import native

    kid = signing.verify_file(signed, keys["release"][1])
    with mlpack.load(signed, trusted_keys=keys["release"][1]) as m:
        assert m.signer == kid and m.artifact.device == "cpu"
        want = m.run(_x())["y"]
    monkeypatch.setenv("MLPACK_TRUSTED_KEYS", str(keys["release"][1].parent))  # a folder
    with mlpack.load(signed) as m:
        np.testing.assert_array_equal(m.run(_x())["y"], want)
    with native.open_model(signed, trusted_keys=str(keys["release"][1])) as m:
        assert m.signer == kid
        np.testing.assert_array_equal(m.run(_x())["y"], want)


def test_planted_code_runs_without_a_policy(forged, marker, monkeypatch):
    """The control: loading the attacker's file with no policy does run its code (the engine
    then fails to find a kernel table and falls back), so the marker proves what it claims."""
    monkeypatch.delenv("MLPACK_TRUSTED_KEYS", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mlpack.load(forged):
            pass
    assert marker.exists()


def test_forged_container_refused_before_any_code_runs(forged, keys, marker, example):
    from mlpack.runtime import native

    pub = str(keys["release"][1])
    with pytest.raises(SignatureError, match="1 by keys not trusted"):
        mlpack.load(forged, trusted_keys=pub)
    with pytest.raises(SignatureError, match="no signature by a trusted key"):
        native.open_model(forged, trusted_keys=pub)          # the engine on its own
    proc = subprocess.run([*example, "-k", pub, str(forged)], capture_output=True, text=True)
    assert proc.returncode != 0 and "status 12" in proc.stderr, proc.stderr
    env = dict(os.environ, MLPACK_TRUSTED_KEYS=pub)
    proc = subprocess.run([*example, str(forged)], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "no signature by a trusted key" in proc.stderr
    assert not marker.exists()


def test_unsigned_container_refused_under_a_policy_and_warned_without(built, keys, marker):
    with pytest.raises(SignatureError, match="is not signed"):
        mlpack.load(built, trusted_keys=keys["release"][1])
    with pytest.warns(mlpack.UnsignedContainerWarning, match="unsigned"):
        mlpack.load(built).close()


def test_inspect_host_never_loads_code(forged, marker, built):
    from support import cli

    result = cli("inspect", forged, "--host")
    assert result.exit_code == 0, result.output
    assert "signature:  signed by sha256:" in result.stdout and "chosen" in result.stdout
    assert not marker.exists()
    assert "signature:  unsigned" in cli("inspect", built).stdout


def test_cli_sign_verify_and_validate_under_a_policy(built, keys, tmp_path, forged, marker,
                                                    monkeypatch):
    from support import cli

    path = shutil.copy(built, tmp_path / "m.mlpack")
    assert cli("sign", path, "--key", keys["release"][0]).exit_code == 0
    ok = cli("verify", path, "--key", keys["attacker"][1], "--key", keys["release"][1])
    assert ok.exit_code == 0 and "verified" in ok.stdout
    bad = cli("verify", forged, "--key", keys["release"][1])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error:")
    monkeypatch.setenv("MLPACK_TRUSTED_KEYS", str(keys["release"][1]))
    assert cli("validate", path).exit_code == 0
    refused = cli("validate", forged)
    assert refused.exit_code == 2 and "no signature by a trusted key" in refused.stderr
    assert not marker.exists()


# ---------------------------------------------------------------- hash what you load


def _padded(code: bytes, size: int) -> bytes:
    assert len(code) <= size
    return code + bytes(size - len(code))   # the loader ignores bytes past the ELF's last part


@pytest.fixture(scope="module")
def pair(built, work, planted_elf):
    """A: the real container with its code blob padded; B: A's bytes with the planted library
    in the same place and A's digests (a corrupt file; same size, same layout)."""
    with c.open_container(built) as box:
        art = next(a for a in box.artifacts if a.device == "cpu")
        real = bytes(box.blob(_code_layer(art).digest))
    size = max(len(real), len(planted_elf)) + 512
    a = rewrite(built, work / "a.mlpack", _padded(real, size))
    data = bytearray(a.read_bytes())
    with c.open_container(a) as box:
        offset = next(lr.offset for x in box.artifacts for lr in x.layers
                      if lr.media_type == media.CODE_ELF)
    b = work / "b.mlpack"
    data[offset:offset + size] = _padded(planted_elf, size)
    b.write_bytes(bytes(data))
    return a, b, offset, size


def test_corrupt_code_blob_is_refused_by_both_runtimes(pair, marker):
    from mlpack.runtime import native

    _, b, _, _ = pair
    with pytest.raises(DigestError, match="does not match its digest"):
        native.open_model(b, verify=False)        # verify=False cannot load unverified code
    with pytest.raises(DigestError):
        mlpack.load(b, device="cpu")
    assert not marker.exists()


def _racer(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)])


def test_path_swapped_while_loading(pair, marker, tmp_path):
    """Race 1: the path flips between A and B (rename) while mlpack.load runs: whatever file the
    Python reader opened is the file the engine reads and hashes."""
    a, b, _, _ = pair
    path, stop = tmp_path / "m.mlpack", tmp_path / "stop"
    shutil.copy(a, path)
    racer = _racer("""
        import os, sys
        a, b, path, stop = sys.argv[1:]
        tmp = path + ".swap"
        while not os.path.exists(stop):
            for src in (a, b):
                os.link(src, tmp)
                os.replace(tmp, path)
        """, a, b, path, stop)
    loaded = refused = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(ATTEMPTS):
                try:
                    mlpack.load(path, device="cpu").close()
                    loaded += 1
                except (DigestError, mlpack.FormatError):
                    refused += 1
    finally:
        stop.touch()
        racer.wait()
    print(f"path swap: {ATTEMPTS} loads, {loaded} of A, {refused} refused, planted code ran: "
          f"{marker.exists()}")
    assert not marker.exists(), "the planted code ran"
    assert loaded > 0 and refused > 0, (loaded, refused)   # both files were really met


def test_code_rewritten_in_place_while_opening(pair, marker, tmp_path):
    """Race 2: the code blob's bytes flip between A's and B's in the same file while the engine
    opens it: it loads its own hashed copy, so B's code never runs."""
    from mlpack.runtime import native

    a, b, offset, size = pair
    path, stop = tmp_path / "m.mlpack", tmp_path / "stop"
    shutil.copy(a, path)
    racer = _racer("""
        import os, sys
        a, b, path, stop, offset, size = sys.argv[1:]
        offset, size = int(offset), int(size)
        blobs = [open(p, "rb").read()[offset:offset + size] for p in (a, b)]
        fd = os.open(path, os.O_WRONLY)
        while not os.path.exists(stop):
            for blob in blobs:
                os.pwrite(fd, blob, offset)
        """, a, b, path, stop, offset, size)
    loaded = refused = 0
    try:
        for _ in range(ATTEMPTS):
            try:
                native.open_model(path, device="cpu", verify=False).close()
                loaded += 1
            except DigestError:
                refused += 1
    finally:
        stop.touch()
        racer.wait()
    print(f"in-place rewrite: {ATTEMPTS} opens, {loaded} loaded, {refused} refused, planted code "
          f"ran: {marker.exists()}")
    assert not marker.exists(), "the planted code ran"
    assert loaded > 0 and refused > 0, (loaded, refused)


def test_a_build_checks_its_own_file_under_a_host_policy(keys, tmp_path, monkeypatch,
                                                         patient_emulation):
    """MLPACK_TRUSTED_KEYS on a build host does not stop `mlpack build` validating the file it
    just wrote (there is nothing to sign yet; under qemu too), while `validate` of that unsigned
    file under the same policy is refused."""
    from mlpack.packager.build import build
    from support import cli, emulated

    monkeypatch.setenv("MLPACK_TRUSTED_KEYS", str(keys["release"][1]))
    targets = ["portable", "x86_64-v2"] + (["aarch64"] if emulated("aarch64") else [])
    report = build(str(ROOT / "tests" / "models" / "mlp.onnx"), tmp_path / "m.mlpack",
                   targets=targets)
    assert all(a.validated for a in report.artifacts), report   # a failure would raise
    refused = cli("validate", tmp_path / "m.mlpack")
    assert refused.exit_code == 2 and "is not signed" in refused.stderr
