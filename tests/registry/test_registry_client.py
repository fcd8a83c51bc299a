"""The registry client's parts: references, plain http only for loopback, credentials and
challenges, retries with backoff (429, 5xx, dropped connections; an upload starts over), token
and basic authentication (the counting proxy plays a registry that requires them), progress
lines, and every failure one RegistryError naming the registry and what was asked."""

from __future__ import annotations

import base64
import json

import pytest

from mlpack.runtime.registry import parse, pull, push
from mlpack.runtime.registry.auth import credentials_for, parse_challenge
from mlpack.runtime.registry.progress import Meter
from mlpack.runtime.registry.transport import plain_http
from mlpack.spec.errors import RegistryError

FAST = {"backoff": 0.001}   # retries without the real backoff's seconds


# ---------------------------------------------------------------- references

@pytest.mark.parametrize("text, want", [
    ("ghcr.io/team/mlp:v1", ("ghcr.io", "team/mlp", "v1", None)),
    ("oci://127.0.0.1:5000/mlp", ("127.0.0.1:5000", "mlp", "latest", None)),
    ("localhost/a/b/c:1.0-rc_2", ("localhost", "a/b/c", "1.0-rc_2", None)),
    ("[::1]:5000/m@sha256:" + "a" * 64, ("[::1]:5000", "m", None, "sha256:" + "a" * 64)),
    ("docker.io/mlp:v1", ("docker.io", "mlp", "v1", None)),
])
def test_references_parse(text, want):
    ref = parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == want
    assert parse(str(ref)) == ref


def test_docker_hub_is_reached_at_its_api_host():
    ref = parse("docker.io/mlp:v1")
    assert (ref.api_host, ref.api_repository) == ("registry-1.docker.io", "library/mlp")
    assert parse("ghcr.io/team/mlp").api_repository == "team/mlp"


@pytest.mark.parametrize("text, says", [
    ("mlp:v1", "is not a registry reference"),
    ("team/mlp:v1", "is not a registry host"),
    ("ghcr.io/Team/mlp", "is not a repository name"),
    ("ghcr.io/team/mlp:-bad", "is not a tag"),
    ("ghcr.io/team/mlp@sha256:abc", "is not a digest"),
])
def test_bad_references_are_named(text, says):
    with pytest.raises(RegistryError, match=says) as e:
        parse(text)
    assert repr(text) in str(e.value)


def test_plain_http_only_for_loopback_and_what_the_user_lists(monkeypatch):
    assert plain_http("localhost:5000") and plain_http("127.0.0.1:5000")
    assert plain_http("127.1.2.3") and plain_http("[::1]:5000")
    assert not plain_http("ghcr.io") and not plain_http("10.0.0.5:5000")
    monkeypatch.setenv("MLPACK_REGISTRY_INSECURE", "10.0.0.5:5000, registry.lan")
    assert plain_http("10.0.0.5:5000") and plain_http("registry.lan:443")
    assert not plain_http("10.0.0.5:5001")


# ---------------------------------------------------------------- credentials and challenges

def test_challenges_parse():
    c = parse_challenge('Bearer realm="https://auth.example/token",service="reg",'
                        'scope="repository:a/b:pull,push repository:c:pull"')
    assert c.scheme == "bearer" and c.params["realm"] == "https://auth.example/token"
    assert c.scopes == ["repository:a/b:pull,push", "repository:c:pull"]
    assert parse_challenge('Basic realm="x"').scheme == "basic"
    assert parse_challenge(None) is None


def test_credentials_from_the_environment_then_docker_config(tmp_path, monkeypatch):
    assert credentials_for("127.0.0.1:5000") is None
    config = tmp_path / "docker-config" / "config.json"
    config.parent.mkdir(exist_ok=True)
    config.write_text(json.dumps({"auths": {
        "127.0.0.1:5000": {"auth": base64.b64encode(b"bob:pa:ss").decode()},
        "https://ghcr.io": {"username": "carol", "password": "x"}}}))
    bob = credentials_for("127.0.0.1:5000")
    assert (bob.username, bob.password) == ("bob", "pa:ss") and "config.json" in bob.source
    assert credentials_for("ghcr.io").username == "carol"
    assert "pa:ss" not in repr(bob)
    monkeypatch.setenv("MLPACK_REGISTRY_USERNAME", "alice")
    with pytest.raises(RegistryError, match="MLPACK_REGISTRY_PASSWORD is not set"):
        credentials_for("127.0.0.1:5000")
    monkeypatch.setenv("MLPACK_REGISTRY_PASSWORD", "secret")
    assert credentials_for("127.0.0.1:5000").username == "alice"
    config.write_text('{"auths": {"127.0.0.1:5000": {"auth": "not base64!"}}}')
    monkeypatch.delenv("MLPACK_REGISTRY_USERNAME")
    monkeypatch.delenv("MLPACK_REGISTRY_PASSWORD")
    with pytest.raises(RegistryError, match="'auth' is not base64 of USER:PASSWORD"):
        credentials_for("127.0.0.1:5000")


def test_bearer_tokens_cover_every_scope_asked(mlp_container, proxy, repo, tmp_path,
                                               monkeypatch):
    proxy.require("bearer", {"alice": "s3cret"})
    with pytest.raises(RegistryError, match="refused an anonymous request") as e:
        push(mlp_container, f"{proxy.host}/{repo}:v1", **FAST)
    assert f"registry {proxy.host}" in str(e.value) and "/token" in str(e.value)
    monkeypatch.setenv("MLPACK_REGISTRY_USERNAME", "alice")
    monkeypatch.setenv("MLPACK_REGISTRY_PASSWORD", "s3cret")
    push(mlp_container, f"{proxy.host}/{repo}:v1", **FAST)
    # a second repository: blobs are mounted, which takes pull on the source as well
    other = push(mlp_container, f"{proxy.host}/{repo}-b:v1", **FAST)
    assert other.mounted > 0 and other.uploaded == 0
    scopes = {s for q in proxy.token_requests for s in q.get("scope", [])}
    assert f"repository:{repo}:pull" in scopes and f"repository:{repo}-b:pull,push" in scopes
    r = pull(f"{proxy.host}/{repo}:v1", tmp_path / "x.mlpack", **FAST)
    assert r.fetched_blobs > 0
    monkeypatch.setenv("MLPACK_REGISTRY_PASSWORD", "wrong")
    with pytest.raises(RegistryError, match="refused the credentials from "
                                            "MLPACK_REGISTRY_USERNAME/PASSWORD"):
        pull(f"{proxy.host}/{repo}:v1", tmp_path / "y.mlpack", **FAST)


def test_basic_auth_with_docker_config_credentials(mlp_container, proxy, repo, tmp_path):
    proxy.require("basic", {"bob": "hunter2"})
    with pytest.raises(RegistryError, match="asks for a user name and password"):
        push(mlp_container, f"{proxy.host}/{repo}:v1", **FAST)
    config = tmp_path / "docker-config" / "config.json"
    config.parent.mkdir(exist_ok=True)
    config.write_text(json.dumps({"auths": {proxy.host: {
        "auth": base64.b64encode(b"bob:hunter2").decode()}}}))
    push(mlp_container, f"{proxy.host}/{repo}:v1", **FAST)
    assert pull(f"{proxy.host}/{repo}:v1", tmp_path / "x.mlpack", everything=True,
                **FAST).fetched_blobs > 0
    config.write_text(json.dumps({"auths": {proxy.host: {"username": "bob", "password": "no"}}}))
    with pytest.raises(RegistryError, match=r"HTTP 401.*refused the credentials from .*json"):
        pull(f"{proxy.host}/{repo}:v1", tmp_path / "y.mlpack", **FAST)


# ---------------------------------------------------------------- retries and failures

@pytest.mark.parametrize("fault", [503, 429, 502, "drop"])
def test_transient_failures_are_retried(fault, mlp_container, proxy, repo, tmp_path):
    push(mlp_container, f"{proxy.host}/{repo}", **FAST)
    proxy.fail_next(2, fault, "/blobs/sha256")
    proxy.fail_next(1, fault, "/manifests/latest")
    out = tmp_path / "x.mlpack"
    pull(f"{proxy.host}/{repo}", out, everything=True, **FAST)
    assert out.read_bytes() == mlp_container.read_bytes()
    failed = [s for _, _, s in proxy.requests if s in (fault, 0)]
    assert len(failed) == 3


def test_an_upload_that_fails_midway_starts_over(mlp_container, proxy, repo, tmp_path):
    proxy.fail_next(1, 503, "/blobs/uploads/", "PATCH")   # a chunk of the first chunked blob
    proxy.fail_next(1, "drop", "/blobs/uploads/", "PUT")   # and a closing PUT
    r = push(mlp_container, f"{proxy.host}/{repo}", chunk_size=256 << 10, **FAST)
    assert r.uploaded > 0
    assert sorted(m for m, _, s in proxy.requests if s in (503, 0)) == ["PATCH", "PUT"]
    # each failure opened a new upload session: one POST per blob, plus one per failure
    posts = [p for m, p, _ in proxy.requests if m == "POST"]
    assert len(posts) == r.uploaded + 2
    out = tmp_path / "x.mlpack"
    pull(f"{proxy.host}/{repo}", out, everything=True)
    assert out.read_bytes() == mlp_container.read_bytes()


def test_persistent_failures_and_unreachable_registries_are_named(mlp_container, proxy, repo,
                                                                   tmp_path):
    proxy.fail_next(100, 503, "/manifests/")
    with pytest.raises(RegistryError) as e:
        pull(f"{proxy.host}/{repo}:v1", tmp_path / "x.mlpack", **FAST)
    assert str(e.value).startswith(f"registry {proxy.host}: repository {repo}, tag v1: HTTP 503")
    assert "after 5 attempts" in str(e.value) and "UNAVAILABLE" in str(e.value)
    from oci_registry import free_port

    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(RegistryError, match=rf"cannot reach registry {dead} \(http://{dead}\) for "
                                            r"repository m, tag v1: connection refused \(after 2"):
        pull(f"{dead}/m:v1", tmp_path / "y.mlpack", attempts=2, **FAST)


def test_progress_lines_for_large_blobs():
    lines = []
    meter = Meter(lines.append, "pulling", "sha256:" + "ab" * 32, 8 << 20)
    for _ in range(8):
        meter.add(1 << 20)
    meter.finish()
    assert lines[0] == "pulling sha256:abababababab... 0 B of 8.0 MiB (0%)"
    assert [line.rsplit("(", 1)[1] for line in lines] == ["0%)", "25%)", "50%)", "75%)", "100%)"]
    whole = []   # one PUT of the whole blob: its start and its end
    meter = Meter(whole.append, "pushing", "sha256:" + "ab" * 32, 8 << 20)
    meter.add(8 << 20)
    meter.finish()
    assert [line.rsplit("(", 1)[1] for line in whole] == ["0%)", "100%)"]
    quiet = []
    Meter(quiet.append, "pulling", "sha256:" + "ab" * 32, 1 << 20).finish()
    assert quiet == []
