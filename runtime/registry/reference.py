"""Registry references: ``REGISTRY/REPOSITORY[:TAG][@DIGEST]``, as docker, skopeo and oras spell
them, and ``oci://`` before one, the form ``mlpack.load`` and the CLI's container arguments take.

    parse("ghcr.io/team/mlp:v1")             Reference("ghcr.io", "team/mlp", "v1", None)
    parse("oci://127.0.0.1:5000/mlp@sha256:...")

The registry is always written out (no implicit Docker Hub: a model name alone is more likely a
file someone mistyped than a Docker Hub repository); ``docker.io`` works and is reached at its API
host, with ``library/`` before one-word repositories, as docker does. The grammar is the
distribution spec's (repository path components, tags, sha256 digests); anything else is a
RegistryError that quotes the text.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from mlpack.spec.container import is_digest
from mlpack.spec.errors import RegistryError

OCI_SCHEME = "oci://"
DEFAULT_TAG = "latest"

# the OCI distribution spec's grammar
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
                   r"(?::[0-9]{1,5})?")

# docker.io's API lives elsewhere (what docker, skopeo and oras all do)
_API_HOSTS = {"docker.io": "registry-1.docker.io", "index.docker.io": "registry-1.docker.io"}


@dataclass(frozen=True)
class Reference:
    """One container in one registry: by tag, by digest, or both (the digest then wins)."""

    registry: str           # HOST[:PORT] as written: "ghcr.io", "127.0.0.1:5000"
    repository: str         # "team/mlp"
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What ``/v2/<repository>/manifests/<reference>`` takes: the digest, else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    @property
    def api_host(self) -> str:
        """The host the distribution API is reached at (docker.io's is elsewhere)."""
        return _API_HOSTS.get(self.registry, self.registry)

    @property
    def api_repository(self) -> str:
        """The repository as the API names it (docker.io's one-word ones are library/NAME)."""
        if self.registry in _API_HOSTS and "/" not in self.repository:
            return f"library/{self.repository}"
        return self.repository

    def with_tag(self, tag: str | None) -> Reference:
        return Reference(self.registry, self.repository, tag, None)

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.registry, self.repository, self.tag, digest)

    def __str__(self) -> str:
        return (f"{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "")
                + (f"@{self.digest}" if self.digest else ""))


def is_oci(path) -> bool:
    """Whether ``path`` (a str or path-like) is an ``oci://`` reference rather than a file."""
    return isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(OCI_SCHEME)


def parse(text: str, default_tag: str | None = DEFAULT_TAG) -> Reference:
    """``[oci://]REGISTRY/REPOSITORY[:TAG][@sha256:HEX]``; without tag or digest, the tag
    ``default_tag``. RegistryError quoting ``text`` when it is not one."""
    if not isinstance(text, str):
        raise RegistryError(f"a registry reference must be a string, got {type(text).__name__}")
    rest = text.removeprefix(OCI_SCHEME)
    digest = None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not is_digest(digest):
            raise RegistryError(f"{text!r}: {digest!r} is not a digest (sha256: and 64 lowercase "
                                "hex digits)")
    registry, slash, path = rest.partition("/")
    if not slash or not path:
        raise RegistryError(f"{text!r} is not a registry reference: write REGISTRY/REPOSITORY"
                            "[:TAG], e.g. ghcr.io/team/model:v1 or 127.0.0.1:5000/model:v1")
    if not _HOST.fullmatch(registry) or not ("." in registry or ":" in registry
                                             or registry == "localhost"):
        raise RegistryError(f"{text!r}: {registry!r} is not a registry host; write the registry "
                            "first (ghcr.io/..., docker.io/..., localhost:5000/...)")
    tag = None
    name, colon, maybe_tag = path.rpartition(":")
    if colon:
        path, tag = name, maybe_tag
        if not _TAG.fullmatch(tag):
            raise RegistryError(f"{text!r}: {tag!r} is not a tag (letters, digits, '_', '.', '-'; "
                                "at most 128)")
    if not _REPOSITORY.fullmatch(path):
        raise RegistryError(f"{text!r}: {path!r} is not a repository name (lowercase letters, "
                            "digits and separators, components joined by '/')")
    if tag is None and digest is None:
        tag = default_tag
    return Reference(registry, path, tag, digest)


__all__ = ["Reference", "parse", "is_oci", "OCI_SCHEME", "DEFAULT_TAG"]
