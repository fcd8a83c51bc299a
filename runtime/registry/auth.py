"""Who we are to a registry: credentials, and the challenges registries answer 401 with.

Credentials come from, in order:

1. MLPACK_REGISTRY_USERNAME and MLPACK_REGISTRY_PASSWORD (spec/environment.py), for every
   registry; one without the other is an error rather than a silent anonymous request;
2. the registry's entry in docker's ``config.json`` (``$DOCKER_CONFIG/config.json``, default
   ``~/.docker/config.json``), under ``auths``: ``{"auth": base64("user:password")}`` or
   ``{"username": ..., "password": ...}``, as ``docker login``, ``skopeo login`` and
   ``oras login`` write it. Credential helpers (``credsStore``) are not run: where one holds the
   secret, set the variables above.

None of them: requests go anonymously, which public repositories allow.

A 401's ``WWW-Authenticate`` header says how to authenticate (RFC 7235): ``Basic realm=...``
(send the credentials on every request) or ``Bearer realm=URL,service=S,scope=S`` (trade the
credentials, or nothing, at URL for a token covering the scope: the distribution token spec that
Docker Hub, ghcr.io, quay.io and the CNCF registry speak).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from mlpack.spec import environment
from mlpack.spec.errors import RegistryError


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = ""
    source: str = ""   # where they came from, for messages ("MLPACK_REGISTRY_USERNAME")

    def __repr__(self) -> str:  # never the password
        return f"<Credentials {self.username!r} from {self.source}>"


def docker_config_path() -> Path:
    """docker's config.json: $DOCKER_CONFIG/config.json, else ~/.docker/config.json (docker's
    own variable, so it is read as docker reads it, not through spec/environment.py)."""
    folder = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    return Path(folder) / "config.json"


def _auth_keys(registry: str) -> list[str]:
    """The spellings docker config.json's ``auths`` may file a registry under."""
    keys = [registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v2/",
            f"https://{registry}/v1/"]
    if registry in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        keys.append("https://index.docker.io/v1/")
    return keys


def _from_docker_config(registry: str) -> Credentials | None:
    path = docker_config_path()
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise RegistryError(f"{path}: cannot read docker's credentials ({e})") from None
    auths = config.get("auths") if isinstance(config, dict) else None
    if not isinstance(auths, dict):
        return None
    for key in _auth_keys(registry):
        entry = auths.get(key)
        if not isinstance(entry, dict):
            continue
        where = f"{path} auths[{key!r}]"
        if isinstance(entry.get("auth"), str) and entry["auth"]:
            try:
                user, sep, password = base64.b64decode(entry["auth"], validate=True).decode() \
                    .partition(":")
            except (binascii.Error, UnicodeDecodeError):
                sep = ""
            if not sep:
                raise RegistryError(f"{where}: 'auth' is not base64 of USER:PASSWORD")
            return Credentials(user, password, where)
        if isinstance(entry.get("username"), str):
            return Credentials(entry["username"], str(entry.get("password") or ""), where)
    return None


def credentials_for(registry: str) -> Credentials | None:
    """The credentials to give ``registry`` (HOST[:PORT]), or None to go anonymously."""
    user = environment.get("MLPACK_REGISTRY_USERNAME")
    password = environment.get("MLPACK_REGISTRY_PASSWORD")
    if user or password:
        if not (user and password):
            missing = "MLPACK_REGISTRY_PASSWORD" if user else "MLPACK_REGISTRY_USERNAME"
            raise RegistryError(f"registry {registry}: {missing} is not set (set both "
                                "MLPACK_REGISTRY_USERNAME and MLPACK_REGISTRY_PASSWORD, or "
                                "neither)")
        return Credentials(user, password, "MLPACK_REGISTRY_USERNAME/PASSWORD")
    return _from_docker_config(registry)


# ---------------------------------------------------------------- challenges

_PARAM = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?')


@dataclass(frozen=True)
class Challenge:
    """One ``WWW-Authenticate`` challenge: ``scheme`` (lowercase: basic, bearer) and its
    parameters (realm, service, scope)."""

    scheme: str
    params: dict

    @property
    def scopes(self) -> list[str]:
        return self.params.get("scope", "").split()


def parse_challenge(header: str | None) -> Challenge | None:
    """The challenge in a ``WWW-Authenticate`` header (the first, where a registry sends
    several); None for an absent or unreadable header."""
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    params, pos = {}, 0
    while pos < len(rest):
        m = _PARAM.match(rest, pos)
        if not m or m.end() == pos:
            break
        value = m.group(2) if m.group(2) is not None else m.group(3)
        params[m.group(1).lower()] = re.sub(r"\\(.)", r"\1", value)
        pos = m.end()
    return Challenge(scheme.lower(), params) if scheme else None


__all__ = ["Credentials", "credentials_for", "docker_config_path", "Challenge", "parse_challenge"]
