"""mlpack push and pull against a real registry (Debian's docker-registry on loopback, behind a
counting proxy): push then pull --all gives the file's exact bytes, signed or not; nothing is
uploaded twice and blobs another repository holds are mounted; a blob corrupted in the
registry's storage is refused with its digest; a pull for one host transfers exactly the blobs
of the artifact it chose and the index documents it read, and writes a partial container that
loads; --platform, --device and --precision choose as load does."""

from __future__ import annotations

import json

import pytest
from support import cli

from mlpack.runtime.registry import pull, push
from mlpack.runtime.registry.choose import platform_host
from mlpack.spec import media
from mlpack.spec.container import digest_of, open_container
from mlpack.spec.errors import NoRunnableArtifactError, RegistryError


def _descriptors(path) -> list[dict]:
    with open_container(path) as c:
        return [a.descriptor for a in c.artifacts]


def _artifact_bytes(path, index: int) -> tuple[int, set[str]]:
    """Bytes of artifact ``index``'s manifest, config and layers, and the blob digests."""
    with open_container(path) as c:
        a = c.artifacts[index]
        blobs = {d["digest"]: d["size"] for d in [a.manifest["config"], *a.manifest["layers"]]}
        return a.descriptor["size"] + sum(blobs.values()), set(blobs)


def _signature_bytes(path) -> int:
    with open_container(path) as c:
        total = 0
        for e in c.index["manifests"][1:]:
            m = c.json_blob(e["digest"])
            total += e["size"] + sum(d["size"] for d in [m["config"], *m["layers"]])
        return total


def _blob_count(path) -> int:
    """Distinct configs and layers of every artifact (what a first push uploads)."""
    with open_container(path) as c:
        return len({d["digest"] for a in c.artifacts
                    for d in [a.manifest["config"], *a.manifest["layers"]]})


def _nested_size(path) -> int:
    with open_container(path) as c:
        return c.index["manifests"][0]["size"]


@pytest.mark.parametrize("which", ["unsigned", "signed"])
def test_push_then_pull_all_is_byte_identical(which, mlp_container, signed_container, proxy,
                                              repo, tmp_path):
    source = mlp_container if which == "unsigned" else signed_container
    result = push(source, f"{proxy.host}/{repo}")   # no tag: the file's own ("latest")
    assert result.ref.tag == "latest" and result.signatures == (which == "signed")
    out = tmp_path / "pulled.mlpack"
    r = cli("pull", f"{proxy.host}/{repo}:latest", "-o", str(out), "--all")
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == source.read_bytes()
    assert "artifacts:  all 6" in r.stdout


def test_a_second_push_uploads_nothing_and_another_repository_mounts(mlp_container, proxy, repo):
    first = push(mlp_container, f"{proxy.host}/{repo}:v1")
    assert first.uploaded == _blob_count(mlp_container) and first.present == 0
    proxy.reset()
    again = push(mlp_container, f"{proxy.host}/{repo}:v1")
    assert (again.uploaded, again.mounted, again.present) == (0, 0, first.uploaded)
    assert not proxy.requested("uploads")   # HEADs only: nothing sent twice
    proxy.reset()
    other = push(mlp_container, f"{proxy.host}/{repo}-copy:v1")   # the cache saw them in repo
    assert (other.uploaded, other.mounted) == (0, first.uploaded)
    assert all(f"from={repo}" in p.replace("%2F", "/") for p in proxy.requested("uploads"))
    explicit = push(mlp_container, f"{proxy.host}/{repo}-third:v1", mount_from=[repo],
                    cache=None)
    assert explicit.mounted == first.uploaded


def test_chunked_upload_and_progress_lines(mlp_container, proxy, repo, tmp_path):
    lines = []
    push(mlp_container, f"{proxy.host}/{repo}", chunk_size=256 << 10, report=lines.append)
    patches = [p for m, p, s in proxy.requests if m == "PATCH"]
    assert len(patches) >= 4, proxy.requests   # the ~920 KiB weights (once) in 256 KiB chunks
    assert all(s == 202 for m, p, s in proxy.requests if m == "PATCH")
    out = tmp_path / "back.mlpack"
    pull(f"{proxy.host}/{repo}", out, everything=True)
    assert out.read_bytes() == mlp_container.read_bytes()
    assert lines == []   # below progress.LARGE (4 MiB) nothing is reported


def test_a_corrupted_blob_in_the_registry_is_refused_naming_its_digest(
        mlp_container, registry_server, proxy, repo, tmp_path):
    push(mlp_container, f"{proxy.host}/{repo}:v1")
    with open_container(mlp_container) as c:
        weights = c.artifacts[0].layer(media.WEIGHTS).digest
    data = registry_server.blob_file(weights)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    try:
        out = tmp_path / "bad.mlpack"
        r = cli("pull", f"{proxy.host}/{repo}:v1", "-o", str(out), "--all")
        assert r.exit_code == 2, r.output
        assert weights in r.stderr and "does not match its digest" in r.stderr, r.stderr
        assert f"registry {proxy.host}" in r.stderr and f"repository {repo}" in r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.output
        assert not out.exists()
        cached = tmp_path / "oci-cache" / "blobs" / "sha256" / weights.split(":")[1]
        assert not cached.exists()   # nothing of it is kept
    finally:
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))


@pytest.mark.parametrize("which", ["unsigned", "signed"])
def test_a_partial_pull_transfers_exactly_the_chosen_artifact(which, mlp_container,
                                                              signed_container, proxy, repo,
                                                              tmp_path):
    source = mlp_container if which == "unsigned" else signed_container
    push(source, f"{proxy.host}/{repo}:v1")
    proxy.reset()
    out = tmp_path / "host.mlpack"
    r = pull(f"{proxy.host}/{repo}:v1", out)
    [chosen] = r.artifacts
    artifact, blobs = _artifact_bytes(source, chosen)
    signature = _signature_bytes(source) if which == "signed" else 0
    expected = _nested_size(source) + artifact + signature
    assert proxy.served_bytes() == expected == r.fetched_bytes
    with open_container(source) as c:
        others = {d["digest"] for a in c.artifacts if a.index != chosen
                  for d in a.manifest["layers"]} - blobs
    fetched = {p.rsplit("/", 1)[1] for p in proxy.requested("blobs", "GET")}
    assert fetched & others == set()
    # what is left behind: every other artifact's own layers (the weights archive is shared)
    with open_container(source) as c:
        left = sum(d["size"] for a in c.artifacts if a.index != chosen
                   for d in a.manifest["layers"] if d["digest"] in others)
    assert left > 0 and out.stat().st_size <= source.stat().st_size - left
    with open_container(out) as c:   # a valid container, partial, with the same nested index
        assert c.partial and [a.index for a in c.artifacts if a.present] == [chosen]
        assert len(c.signatures) == (which == "signed")
        assert c.index["annotations"][media.ANN_PARTIAL] == "true"
        assert c.index["annotations"][media.ANN_FORMAT_VERSION] == "1.2"   # a 1.2 feature
    with open_container(source) as c:
        assert c.nested_digest == r.ref.digest


def test_the_partial_file_loads_and_validates(mlp_container, proxy, repo, tmp_path):
    import mlpack

    push(mlp_container, f"{proxy.host}/{repo}:v1")
    out = tmp_path / "host.mlpack"
    r = cli("pull", f"{proxy.host}/{repo}:v1", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "artifact:" in r.stdout and "of 6" in r.stdout
    with pytest.warns(UserWarning):   # unsigned native code (or the portable fallback)
        m = mlpack.load(out)
    with m:
        assert m.validate().ok
        assert m.artifact.index == pull(f"{proxy.host}/{repo}:v1", tmp_path / "again.mlpack"
                                        ).artifacts[0]


def test_platform_device_and_precision_choose_as_load_does(mlp_container, proxy, repo, tmp_path):
    push(mlp_container, f"{proxy.host}/{repo}:v1")
    targets = [d["platform"] if "platform" in d else None for d in _descriptors(mlp_container)]
    ref = f"{proxy.host}/{repo}:v1"
    arm = pull(ref, tmp_path / "arm.mlpack", host=platform_host("linux/arm64"))
    assert targets[arm.artifacts[0]]["architecture"] == "arm64"
    v2 = pull(ref, tmp_path / "v2.mlpack", host=platform_host("linux/amd64/v2"))
    assert targets[v2.artifacts[0]]["variant"] == "v2"
    r = cli("pull", ref, "-o", str(tmp_path / "p.mlpack"), "--platform", "linux/riscv64",
            "--device", "portable")
    assert r.exit_code == 0, r.output
    assert "artifact:   0 of 6" in r.stdout and "the portable artifact was requested" in r.stdout
    r = cli("pull", ref, "-o", str(tmp_path / "b.mlpack"), "--accuracy-budget", "1e-3")
    assert r.exit_code == 0 and "within the accuracy budget 0.001" in r.stdout, r.output
    r = cli("pull", ref, "-o", str(tmp_path), "--device", "portable")   # a folder: named
    assert r.exit_code == 2 and "cannot write the container" in r.stderr, r.output
    with pytest.raises(NoRunnableArtifactError, match="precision 'int8' was requested"):
        pull(ref, tmp_path / "x.mlpack", precision="int8")
    r = cli("pull", ref, "-o", str(tmp_path / "y.mlpack"), "--platform", "linux/s390x")
    assert r.exit_code == 0 and "artifact:   0 of 6" in r.stdout   # the portable one runs anywhere
    r = cli("pull", ref, "-o", str(tmp_path / "y.mlpack"), "--platform", "linux/s390x",
            "--device", "cpu")
    assert r.exit_code == 2 and "no artifact runs" in r.stderr and repo in r.stderr
    r = cli("pull", ref, "-o", str(tmp_path / "y.mlpack"), "--platform", "amd64")
    assert r.exit_code == 2 and "is not OS/ARCH[/VARIANT]" in r.stderr


def test_what_is_missing_or_not_a_container_is_named(mlp_container, proxy, repo, tmp_path):
    r = cli("pull", f"{proxy.host}/{repo}:nope", "-o", str(tmp_path / "x.mlpack"))
    assert r.exit_code == 2
    assert f"registry {proxy.host}: repository {repo}, tag nope: HTTP 404" in r.stderr
    assert "MANIFEST_UNKNOWN" in r.stderr or "NAME_UNKNOWN" in r.stderr
    # an image manifest under a tag: refused as not an mlpack container
    from mlpack.runtime.registry.client import RegistryClient

    config = b"{}"
    empty = digest_of(config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": media.OCI_MANIFEST,
                           "config": {"mediaType": media.OCI_EMPTY, "size": 2, "digest": empty},
                           "layers": []}).encode()
    with RegistryClient(proxy.host) as client:
        client.push_blob(repo, empty, 2, lambda o, n: config[o:o + n])
        client.put_manifest(repo, "image", manifest, media.OCI_MANIFEST)
    with pytest.raises(RegistryError, match="manifest.v1.json, not an mlpack container"):
        pull(f"{proxy.host}/{repo}:image", tmp_path / "y.mlpack")
    for bad in ("mlp:v1", "127.0.0.1:5000", "127.0.0.1:5000/Upper:v1", "localhost/x:bad tag"):
        r = cli("pull", bad, "-o", str(tmp_path / "z.mlpack"))
        assert r.exit_code == 2 and repr(bad) in r.stderr, (bad, r.output)


def test_push_refuses_a_partial_container_and_a_digest(mlp_container, proxy, repo, tmp_path):
    push(mlp_container, f"{proxy.host}/{repo}:v1")
    part = tmp_path / "part.mlpack"
    pull(f"{proxy.host}/{repo}:v1", part)
    r = cli("push", str(part), f"{proxy.host}/{repo}:v2")
    assert r.exit_code == 2 and "is a partial container" in r.stderr
    with pytest.raises(RegistryError, match="push to a tag, not a digest"):
        push(mlp_container, f"{proxy.host}/{repo}@sha256:" + "0" * 64)


def test_cli_push_prints_what_moved(mlp_container, signed_container, proxy, repo):
    r = cli("push", str(mlp_container), f"{proxy.host}/{repo}:v1")
    assert r.exit_code == 0, r.output
    assert f"pushed {mlp_container} to {proxy.host}/{repo}:v1@sha256:" in r.stdout
    n = _blob_count(mlp_container)
    assert f"{n} uploaded" in r.stdout and "6 artifact manifests" in r.stdout
    assert "unsigned" in r.stdout
    r = cli("push", str(signed_container), f"{proxy.host}/{repo}:v1")
    assert r.exit_code == 0, r.output
    assert "2 uploaded" in r.stdout and f"{n} already there" in r.stdout   # payload and {}
    assert ".sig (this registry has no referrers API: under the tag only)" in r.stdout


def test_signatures_travel_as_referrers_where_the_registry_has_the_api(signed_container, proxy,
                                                                       repo, tmp_path):
    proxy.referrers = True   # the proxy plays the OCI 1.1 referrers API
    r = push(signed_container, f"{proxy.host}/{repo}")
    assert r.referrers   # the registry answered OCI-Subject: indexed as a referrer
    proxy.fail_next(100, 404, ".sig", "GET")   # and cosign's tag is gone: referrers only
    out = tmp_path / "pulled.mlpack"
    got = pull(f"{proxy.host}/{repo}", out, everything=True)
    assert got.signatures == 1 and proxy.requested("referrers")
    assert out.read_bytes() == signed_container.read_bytes()
