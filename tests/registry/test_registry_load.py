"""``mlpack.load("oci://...")`` and ``mlpack run/inspect/validate oci://...``: this host's artifact
pulled into the content-addressed cache and loaded the normal way. A cold cache fetches the
artifact's blobs once; a warm one asks the registry only what the tag names now (a tag moves)
and makes no blob request; two processes filling one cache at once are safe; a trust policy
refuses an unsigned or foreign-signed container before any artifact blob is fetched, and the
loaded file is verified by both runtimes before any code loads."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from support import cli

import mlpack
from mlpack.runtime.registry import push
from mlpack.spec.container import open_container
from mlpack.spec.errors import SignatureError, UnsignedContainerWarning


def _x(batch=3) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((batch, 784)).astype(np.float32)


def _load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsignedContainerWarning)
        return mlpack.load(path, **kw)


def test_load_from_a_cold_then_a_warm_cache(mlp_container, proxy, repo, tmp_path):
    push(mlp_container, f"{proxy.host}/{repo}:v1")
    proxy.reset()
    with _load(f"oci://{proxy.host}/{repo}:v1") as cold:
        got = cold.run({"x": _x()})["y"]
        chosen = cold.artifact.index
        assert Path(cold.path).is_relative_to(tmp_path / "oci-cache")
    assert proxy.requested("blobs", "GET")   # config and layers, once
    with _load(mlp_container) as local:
        np.testing.assert_array_equal(local.run({"x": _x()})["y"], got)
        assert local.artifact.index == chosen
    proxy.reset()
    with _load(f"oci://{proxy.host}/{repo}:v1") as warm:
        np.testing.assert_array_equal(warm.run({"x": _x()})["y"], got)
    assert proxy.requested("blobs") == []   # not one blob request, GET or HEAD
    assert [p.rsplit("/", 1)[1] for p in proxy.requested("manifests")][0] == "v1"   # the tag: asked
    # the policy is part of what is pulled: the portable artifact is fetched when asked for
    proxy.reset()
    with _load(f"oci://{proxy.host}/{repo}:v1", device="portable") as portable:
        assert portable.artifact.device == "portable"
        np.testing.assert_allclose(portable.run({"x": _x()})["y"], got, rtol=1e-4, atol=1e-5)
    assert proxy.requested("blobs", "GET")


def test_a_moved_tag_is_followed(mlp_container, signed_container, proxy, repo):
    push(mlp_container, f"{proxy.host}/{repo}:v1")
    with _load(f"oci://{proxy.host}/{repo}:v1") as m:
        assert not m._container.signatures
    push(signed_container, f"{proxy.host}/{repo}:v1")   # same artifacts, now signed
    with _load(f"oci://{proxy.host}/{repo}:v1") as m:
        assert len(m._container.signatures) == 1


def test_signed_container_loads_under_a_trust_policy(signed_container, signing_keys, proxy, repo,
                                                     tmp_path):
    push(signed_container, f"{proxy.host}/{repo}:v1")
    with mlpack.load(f"oci://{proxy.host}/{repo}:v1", trusted_keys=signing_keys[1]) as m:
        assert m.signer and m.signer.startswith("sha256:")
        assert m.validate().ok
    # MLPACK_TRUSTED_KEYS is the same policy
    os.environ["MLPACK_TRUSTED_KEYS"] = str(signing_keys[1])
    try:
        r = cli("run", f"oci://{proxy.host}/{repo}:v1", "-i", f"x={_npy(tmp_path)}",
                "-o", str(tmp_path / "out"))
    finally:
        del os.environ["MLPACK_TRUSTED_KEYS"]
    assert r.exit_code == 0, r.output
    assert "unsigned" not in r.output


def _npy(tmp_path) -> Path:
    path = tmp_path / "x.npy"
    np.save(path, _x())
    return path


def test_a_trust_policy_refuses_before_any_artifact_is_fetched(mlp_container, signed_container,
                                                               tmp_path, proxy, repo):
    from mlpack.spec import signing

    other = signing.keygen(tmp_path / "other")[1]
    # two repositories: a signature is the nested index's (cosign's tag is by digest), so in one
    # repository the unsigned file's index would be signed too, as soon as the signed one is there
    push(mlp_container, f"{proxy.host}/{repo}-unsigned:v1")
    push(signed_container, f"{proxy.host}/{repo}:v1")
    proxy.reset()
    with pytest.raises(SignatureError, match="is not signed"):
        mlpack.load(f"oci://{proxy.host}/{repo}-unsigned:v1", trusted_keys=other)
    assert proxy.requested("blobs") == []
    proxy.reset()
    with pytest.raises(SignatureError, match="1 by keys not trusted"):
        mlpack.load(f"oci://{proxy.host}/{repo}:v1", trusted_keys=other)
    with open_container(signed_container) as c:
        artifact_blobs = {d["digest"] for a in c.artifacts for d in a.manifest["layers"]}
    fetched = {p.rsplit("/", 1)[1] for p in proxy.requested("blobs", "GET")}
    assert fetched and not fetched & artifact_blobs   # the signature's payload only


def test_cli_inspect_validate_and_run_take_oci_references(mlp_container, proxy, repo, tmp_path):
    push(mlp_container, f"{proxy.host}/{repo}:v1")
    ref = f"oci://{proxy.host}/{repo}:v1"
    r = cli("inspect", ref)
    assert r.exit_code == 0, r.output
    assert "model:      mlp (tag v1)" in r.stdout and "not in this partial container" in r.stdout
    r = cli("validate", ref)
    assert r.exit_code == 0, r.output
    assert " ok" in r.stdout and "not in this partial container" in r.stdout
    r = cli("run", ref, "--device", "portable", "-i", f"x={_npy(tmp_path)}",
            "-o", str(tmp_path / "out"))
    assert r.exit_code == 0, r.output
    assert np.load(tmp_path / "out" / "y.npy").shape == (3, 10)
    r = cli("run", f"oci://{proxy.host}/{repo}:missing", "-i", f"x={_npy(tmp_path)}",
            "-o", str(tmp_path / "out"))
    assert r.exit_code == 2 and f"repository {repo}, tag missing: HTTP 404" in r.stderr


PULL_SCRIPT = """
import sys, warnings
from mlpack.runtime.registry import pull
warnings.simplefilter("ignore")
r = pull(sys.argv[1], sys.argv[2], everything=True)
print(r.fetched_blobs)
"""


def test_two_processes_filling_one_cache_at_once(mlp_container, proxy, repo, tmp_path):
    push(mlp_container, f"{proxy.host}/{repo}:latest")
    env = {**os.environ, "MLPACK_OCI_CACHE": str(tmp_path / "shared")}
    procs = [subprocess.Popen([sys.executable, "-c", PULL_SCRIPT, f"{proxy.host}/{repo}",
                               str(tmp_path / f"out{i}.mlpack")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    for i in range(2):
        assert (tmp_path / f"out{i}.mlpack").read_bytes() == mlp_container.read_bytes()
    blobs = tmp_path / "shared" / "blobs" / "sha256"
    names = os.listdir(blobs)
    assert not [n for n in names if n.endswith(".tmp")]   # no temporary file left behind
    with open_container(mlp_container) as c:
        assert len(names) == len([m for m in c.member_names() if m.startswith("blobs/sha256/")
                                  and not m.endswith("/")])
