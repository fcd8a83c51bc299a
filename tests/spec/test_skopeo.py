"""Interoperability: a container is an OCI layout that standard tools read. `tar` lists it,
`skopeo inspect --raw` shows the nested index, `skopeo copy --all` copies every blob. Skipped
where the tools are missing (CI installs skopeo with apt-get)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from mlpack.spec import container as c
from mlpack.spec import media
from mlpack.spec.conformance import generate as corpus

needs_tar = pytest.mark.skipif(not shutil.which("tar"), reason="tar is not installed")
needs_skopeo = pytest.mark.skipif(not shutil.which("skopeo"),
                                  reason="skopeo is not installed (apt-get install -y skopeo)")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("skopeo") / "model.mlpack"
    c.write_container(path, "tiny", corpus.multi(), tag="v1")
    return path


def _skopeo(*args, tmp):
    # no policy.json on the host is required, and no registry is contacted
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run(["skopeo", "--insecure-policy", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _blobs(path) -> set[str]:
    with c.open_container(path) as k:
        return {n.removeprefix(c.BLOB_DIR) for n in k._members if n.startswith(c.BLOB_DIR)}


@needs_tar
def test_tar_lists_the_layout(model):
    out = subprocess.run(["tar", "tf", str(model)], capture_output=True, text=True, check=True)
    names = out.stdout.split()
    assert {"oci-layout", "index.json", "blobs/sha256/"} <= set(names)
    assert len([n for n in names if n.startswith("blobs/sha256/") and len(n) == 77]) == len(_blobs(model))


@needs_skopeo
def test_skopeo_inspect_raw_shows_the_nested_index(model, tmp_path):
    r = _skopeo("inspect", "--raw", f"oci-archive:{model}", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    nested = json.loads(r.stdout)
    assert nested["mediaType"] == media.OCI_INDEX
    assert nested["annotations"][media.ANN_MODEL_NAME] == "tiny"
    assert len(nested["manifests"]) == 5
    assert nested["manifests"][1]["platform"]["variant"] == "v3"
    r = _skopeo("inspect", "--raw", f"oci-archive:{model}:v1", tmp=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout) == nested, r.stderr


@needs_skopeo
def test_skopeo_copy_all_copies_every_blob(model, tmp_path):
    dest = tmp_path / "layout"
    r = _skopeo("copy", "--all", f"oci-archive:{model}", f"oci:{dest}:v1", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    copied = set(os.listdir(dest / "blobs" / "sha256"))
    assert _blobs(model) <= copied
