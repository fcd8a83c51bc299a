"""Fixtures of the registry tests: a real registry on loopback (skipped, with the reason, where
Debian's docker-registry is not installed: apt-get install -y docker-registry, as .ci/run does),
a counting proxy in front of it, an empty cache per test, and containers built once."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from oci_registry import CountingProxy, RegistryServer, registry_binary

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """No credentials or docker config of the machine's, and a fresh cache, for every test."""
    for name in ("MLPACK_REGISTRY_USERNAME", "MLPACK_REGISTRY_PASSWORD",
                 "MLPACK_REGISTRY_INSECURE", "MLPACK_TRUSTED_KEYS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.setenv("MLPACK_OCI_CACHE", str(tmp_path / "oci-cache"))


@pytest.fixture(scope="session")
def registry_server(tmp_path_factory):
    if registry_binary() is None:
        pytest.skip("docker-registry is not installed (apt-get install -y docker-registry; "
                    ".ci/run installs it)")
    server = RegistryServer(tmp_path_factory.mktemp("registry")).start()
    yield server
    server.stop()


@pytest.fixture
def proxy(registry_server):
    p = CountingProxy(registry_server.host).start()
    yield p
    p.stop()


@pytest.fixture
def repo(request) -> str:
    """A repository name of this test's own (tests share one registry)."""
    return "t/" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:60].strip("-")


@pytest.fixture(scope="session")
def mlp_container(tmp_path_factory) -> Path:
    """tests/models/mlp.onnx built with the default targets: portable and five CPU targets."""
    from mlpack.packager.build import build

    path = tmp_path_factory.mktemp("built") / "mlp.mlpack"
    build(MODELS / "mlp.onnx", path)
    return path


@pytest.fixture(scope="session")
def signing_keys(tmp_path_factory):
    from mlpack.spec import signing

    folder = tmp_path_factory.mktemp("keys")
    return signing.keygen(folder / "release")   # (private, public)


@pytest.fixture(scope="session")
def signed_container(mlp_container, signing_keys, tmp_path_factory) -> Path:
    from mlpack.spec import signing

    path = tmp_path_factory.mktemp("signed") / "mlp-signed.mlpack"
    shutil.copy(mlp_container, path)
    signing.sign(path, signing_keys[0])
    return path
