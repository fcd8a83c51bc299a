"""What mlpack pushes, other OCI tools read, and what they push, mlpack pulls back byte for byte:
skopeo (``skopeo copy --all`` of the file into the registry, then ``mlpack pull --all``; and
``skopeo inspect --raw``/``copy --all`` of what ``mlpack push`` sent) and oras (the oras Python
package, a test dependency: its client uploads every blob and document of a file, and reads back
what mlpack pushed). Skipped where skopeo or oras is missing (.ci/run installs both)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import pytest
from support import cli

from mlpack.runtime.registry import push
from mlpack.spec import media
from mlpack.spec.container import BLOB_DIR, open_container

needs_skopeo = pytest.mark.skipif(not shutil.which("skopeo"),
                                  reason="skopeo is not installed (apt-get install -y skopeo)")


def _skopeo(*args, tmp):
    env = {**os.environ, "TMPDIR": str(tmp)}
    r = subprocess.run(["skopeo", "--insecure-policy", *args], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _tag(path, i: int) -> str:
    with open_container(path) as c:
        return c.index["manifests"][i]["annotations"][media.REF_NAME]


@needs_skopeo
@pytest.mark.parametrize("which", ["unsigned", "signed"])
def test_skopeo_copy_all_then_mlpack_pull_gives_the_same_bytes(which, mlp_container,
                                                               signed_container, registry_server,
                                                               repo, tmp_path):
    source = mlp_container if which == "unsigned" else signed_container
    dest = f"docker://{registry_server.host}/{repo}"
    _skopeo("copy", "--all", f"oci-archive:{source}:latest", f"{dest}:latest",
            "--dest-tls-verify=false", tmp=tmp_path)
    if which == "signed":   # the signature is index.json's second entry, under cosign's tag
        sig = _tag(source, 1)
        _skopeo("copy", f"oci-archive:{source}:{sig}", f"{dest}:{sig}", "--dest-tls-verify=false",
                tmp=tmp_path)
    out = tmp_path / "pulled.mlpack"
    r = cli("pull", f"{registry_server.host}/{repo}:latest", "-o", str(out), "--all")
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == source.read_bytes()


@needs_skopeo
def test_what_mlpack_pushes_skopeo_reads(signed_container, registry_server, repo, tmp_path):
    result = push(signed_container, f"{registry_server.host}/{repo}:v1")
    ref = f"docker://{registry_server.host}/{repo}:v1"
    raw = _skopeo("inspect", "--raw", "--tls-verify=false", ref, tmp=tmp_path).encode()
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == result.ref.digest
    assert json.loads(raw)["annotations"][media.ANN_MODEL_NAME] == "mlp"
    layout = tmp_path / "layout"
    _skopeo("copy", "--all", "--src-tls-verify=false", ref, f"oci:{layout}:v1", tmp=tmp_path)
    copied = set(os.listdir(layout / "blobs" / "sha256"))
    with open_container(signed_container) as c:
        artifact_blobs = {n.removeprefix(BLOB_DIR) for n in c.member_names()
                          if n.startswith(BLOB_DIR) and not n.endswith("/")}
        signature = {e["digest"].split(":")[1] for e in c.index["manifests"][1:]}
    sig_tag = _tag(signed_container, 1)
    sig_raw = _skopeo("inspect", "--raw", "--tls-verify=false",
                      f"docker://{registry_server.host}/{repo}:{sig_tag}", tmp=tmp_path).encode()
    assert hashlib.sha256(sig_raw).hexdigest() in signature
    # every blob but the signature's (a separate tag, which skopeo copies on its own)
    sig_blobs = {d["digest"].split(":")[1] for d in [json.loads(sig_raw)["config"],
                                                     *json.loads(sig_raw)["layers"]]}
    assert artifact_blobs - signature - sig_blobs <= copied


def _oras():
    oras = pytest.importorskip("oras.provider", reason="the oras package is not installed "
                                                       "(pip install oras)")
    import oras.container

    return oras


def test_oras_reads_what_mlpack_pushes(mlp_container, registry_server, repo):
    oras = _oras()
    result = push(mlp_container, f"{registry_server.host}/{repo}:v1")
    client = oras.provider.Registry(registry_server.host, insecure=True)
    target = oras.container.Container(f"{registry_server.host}/{repo}:v1")
    nested = client.get_manifest(target, allowed_media_type=[media.OCI_INDEX])
    assert nested["annotations"][media.ANN_MODEL_NAME] == "mlp"
    for desc in nested["manifests"]:
        by_digest = oras.container.Container(f"{registry_server.host}/{repo}@{desc['digest']}")
        manifest = client.get_manifest(by_digest, allowed_media_type=[media.OCI_MANIFEST])
        assert manifest["artifactType"] == media.ARTIFACT_TYPE
        for d in [manifest["config"], *manifest["layers"]]:
            data = client.get_blob(target, d["digest"]).content
            assert "sha256:" + hashlib.sha256(data).hexdigest() == d["digest"]
    assert result.manifests == len(nested["manifests"])


def test_what_oras_pushes_mlpack_pulls_back_byte_for_byte(signed_container, registry_server,
                                                          repo, tmp_path):
    oras = _oras()
    client = oras.provider.Registry(registry_server.host, insecure=True)
    target = oras.container.Container(f"{registry_server.host}/{repo}:latest")
    with open_container(signed_container) as c:
        manifests = {e["digest"] for a in c.artifacts for e in [a.descriptor]}
        manifests |= {e["digest"] for e in c.index["manifests"]}
        for name in c.member_names():
            if not name.startswith(BLOB_DIR) or name.endswith("/"):
                continue
            digest = "sha256:" + name.removeprefix(BLOB_DIR)
            if digest in manifests:
                continue
            blob = tmp_path / name.removeprefix(BLOB_DIR)
            blob.write_bytes(bytes(c.member_bytes(name)))
            layer = {"digest": digest, "size": blob.stat().st_size,
                     "mediaType": "application/octet-stream"}
            r = client.upload_blob(str(blob), target, layer)
            assert r.status_code in (200, 201), r.text
        # documents as their exact bytes (oras's upload_manifest would re-serialize them)
        puts = [(a.descriptor["digest"], a.descriptor["digest"], media.OCI_MANIFEST)
                for a in c.artifacts]
        puts.append(("latest", c.nested_digest, media.OCI_INDEX))
        puts.append((_tag(signed_container, 1), c.index["manifests"][1]["digest"],
                     media.OCI_MANIFEST))
        for ref, digest, media_type in puts:
            r = client.do_request(f"http://{target.manifest_url(ref)}", "PUT",
                                  data=c.read_verified(digest),
                                  headers={"Content-Type": media_type})
            assert r.status_code == 201, r.text
    out = tmp_path / "pulled.mlpack"
    r = cli("pull", f"{registry_server.host}/{repo}", "-o", str(out), "--all")
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == signed_container.read_bytes()
