"""HTTP to one registry: the scheme, retries, authentication, and failures as RegistryError.

* **Scheme.** https, except for loopback hosts (localhost, 127.0.0.0/8, [::1]) and the hosts
  listed in MLPACK_REGISTRY_INSECURE, which are reached over plain http (as docker treats
  "insecure registries"): credentials never travel unencrypted to a host nobody named.
* **Retries.** A connection error, a timeout, 429 or 5xx is retried with exponential backoff
  (0.5 s, 1 s, 2 s, ... capped at 8 s; a ``Retry-After`` of seconds is honoured up to 30 s), 5
  attempts in all. A request that is part of an upload session is not retried on its own (the
  registry may have taken part of it); ``retry=False`` raises ``Retryable`` instead, and the
  caller starts the upload again.
* **Authentication.** A 401 carries a ``WWW-Authenticate`` challenge (auth.py): Basic sends the
  credentials, Bearer trades them (or nothing) at the challenge's realm for a token covering
  every scope this transport has been challenged for (so one token serves a push that mounts from
  another repository), then the request is sent again, once.
* **Failures.** Every one is a RegistryError that names the registry and what was being done
  (``what``: the repository and the reference or digest), with the registry's own error codes
  (``MANIFEST_UNKNOWN``, ``BLOB_UPLOAD_INVALID``, ...), never a traceback.

``requests`` is imported here, and this module only where a registry is used, so a host that
never loads ``oci://`` never imports it.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import time

import requests

from mlpack import __version__
from mlpack.spec import environment
from mlpack.spec.errors import RegistryError

from mlpack.runtime.registry.auth import Challenge, Credentials, credentials_for, parse_challenge

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
ATTEMPTS = 5
BACKOFF = 0.5        # seconds before the first retry, doubling after each
MAX_BACKOFF = 8.0
MAX_RETRY_AFTER = 30.0
TIMEOUT = (15, 120)  # (connect, read) seconds


class Retryable(RegistryError):
    """A failure that another attempt may not meet (connection error, 429, 5xx), raised instead of
    retrying by requests sent with ``retry=False``."""


def _host_name(host: str) -> str:
    """``HOST`` of ``HOST[:PORT]`` (IPv6 in brackets kept bare)."""
    if host.startswith("["):
        return host[1:host.index("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def plain_http(host: str) -> bool:
    """Whether ``host`` (HOST[:PORT]) is reached over http: loopback, or listed in
    MLPACK_REGISTRY_INSECURE (HOST or HOST:PORT entries)."""
    name = _host_name(host)
    if name == "localhost":
        return True
    try:
        if ipaddress.ip_address(name).is_loopback:
            return True
    except ValueError:
        pass
    listed = {h.strip() for h in environment.get("MLPACK_REGISTRY_INSECURE").split(",")
              if h.strip()}
    return host in listed or name in listed


def _registry_errors(resp: requests.Response) -> str:
    """The registry's error codes and messages ({"errors": [{"code", "message"}]}), if any."""
    try:
        errors = json.loads(resp.content[:65536]).get("errors") or []
        parts = [f"{e.get('code', '?')}: {e.get('message', '')}".rstrip(": ") for e in errors
                 if isinstance(e, dict)]
    except (ValueError, AttributeError):
        return ""
    return "; ".join(parts)


def _retry_after(resp: requests.Response) -> float | None:
    value = resp.headers.get("Retry-After", "")
    return min(float(value), MAX_RETRY_AFTER) if value.strip().isdigit() else None


def _reason(exc: Exception) -> str:
    """A connection failure in a few words (requests nests the cause several levels deep)."""
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out",
                   "Connection reset", "Remote end closed", "No route to host"):
        if marker in text:
            return marker.lower()
    return text[:200]


class Transport:
    """Requests to one registry (``api_host``: where its API is; ``registry``: its name as the
    user wrote it, for messages and credentials)."""

    def __init__(self, registry: str, api_host: str | None = None, *, attempts: int = ATTEMPTS,
                 backoff: float = BACKOFF, timeout=TIMEOUT, sleep=time.sleep):
        self.registry = registry
        host = api_host or registry
        self.base = f"{'http' if plain_http(host) else 'https'}://{host}"
        self.attempts, self.backoff, self.timeout, self._sleep = attempts, backoff, timeout, sleep
        self.session = requests.Session()
        # digests are of the bytes as stored: no transfer compression to undo (and none to count)
        self.session.headers.update({"User-Agent": f"mlpack/{__version__}",
                                     "Accept-Encoding": "identity"})
        self._authorization: str | None = None
        self._scopes: set[str] = set()
        self._credentials: Credentials | None = None
        self._credentials_read = False

    # ---- requests

    def url(self, path: str) -> str:
        """An absolute URL for an API path, or ``path`` itself when a registry gave a full one
        (an upload's Location)."""
        return path if path.startswith(("http://", "https://")) else self.base + path

    def request(self, method: str, path: str, *, what: str, headers=None, body=None,
                stream: bool = False, ok=(200,), allow=(), retry: bool = True,
                params=None) -> requests.Response:
        """Send one request; the response when its status is in ``ok`` or ``allow``, else a
        RegistryError naming ``what``. ``body`` is bytes, or a function giving them anew for each
        attempt."""
        attempt, authenticated = 0, False
        while True:
            sent = dict(headers or {})
            if self._authorization and "Authorization" not in sent:
                sent["Authorization"] = self._authorization
            try:
                resp = self.session.request(method, self.url(path), headers=sent, params=params,
                                            data=body() if callable(body) else body,
                                            stream=stream, timeout=self.timeout)
            except requests.exceptions.SSLError as e:
                raise RegistryError(
                    f"registry {self.registry}: {what}: TLS failed ({_reason(e)}); a registry "
                    "that serves plain http must be listed in MLPACK_REGISTRY_INSECURE") from None
            except (requests.ConnectionError, requests.Timeout) as e:
                why = (f"cannot reach registry {self.registry} ({self.base}) for {what}: "
                       f"{_reason(e)}")
                if not retry:
                    raise Retryable(why) from None
                attempt += 1
                if attempt >= self.attempts:
                    raise RegistryError(f"{why} (after {attempt} attempts)") from None
                self._sleep(self._delay(attempt))
                continue
            if resp.status_code == 401 and not authenticated:
                resp.close()
                self._authenticate(resp, what)
                authenticated = True
                continue
            if resp.status_code in RETRY_STATUS:
                if not retry:
                    why = self._message(resp, what)
                    resp.close()
                    raise Retryable(why)
                attempt += 1
                if attempt < self.attempts:
                    resp.close()
                    self._sleep(_retry_after(resp) or self._delay(attempt))
                    continue
            if resp.status_code in ok or resp.status_code in allow:
                return resp
            why = self._message(resp, what, attempt)
            resp.close()
            raise RegistryError(why)

    def _delay(self, attempt: int) -> float:
        return min(self.backoff * 2 ** (attempt - 1), MAX_BACKOFF)

    def pause(self, attempt: int) -> None:
        """Wait before attempt ``attempt + 1`` of something retried above one request."""
        self._sleep(self._delay(attempt))

    def _message(self, resp: requests.Response, what: str, attempts: int = 0) -> str:
        status = f"HTTP {resp.status_code} {resp.reason or ''}".rstrip()
        codes = _registry_errors(resp)
        msg = f"registry {self.registry}: {what}: {status}" + (f" ({codes})" if codes else "")
        if resp.status_code == 401:
            who = self.credentials()
            msg += (f"; the registry refused the credentials from {who.source}" if who else
                    "; log in: set MLPACK_REGISTRY_USERNAME and MLPACK_REGISTRY_PASSWORD, or "
                    "docker login")
        elif resp.status_code == 403:
            msg += "; these credentials may not do this here"
        if attempts > 1:
            msg += f" (after {attempts} attempts)"
        return msg

    # ---- authentication

    def credentials(self) -> Credentials | None:
        """The credentials for this registry, read once, when a registry first asks."""
        if not self._credentials_read:
            self._credentials = credentials_for(self.registry)
            self._credentials_read = True
        return self._credentials

    def _authenticate(self, resp: requests.Response, what: str) -> None:
        challenge = parse_challenge(resp.headers.get("WWW-Authenticate"))
        if challenge is None:
            raise RegistryError(f"registry {self.registry}: {what}: HTTP 401 without a "
                                "WWW-Authenticate challenge; cannot authenticate")
        who = self.credentials()
        if challenge.scheme == "basic":
            if who is None:
                raise RegistryError(f"registry {self.registry}: {what}: the registry asks for a "
                                    "user name and password: set MLPACK_REGISTRY_USERNAME and "
                                    "MLPACK_REGISTRY_PASSWORD, or docker login")
            pair = f"{who.username}:{who.password}".encode()
            self._authorization = "Basic " + base64.b64encode(pair).decode()
        elif challenge.scheme == "bearer":
            self._scopes.update(challenge.scopes)
            self._authorization = "Bearer " + self._token(challenge, who, what)
        else:
            raise RegistryError(f"registry {self.registry}: {what}: authentication scheme "
                                f"{challenge.scheme!r} is not supported (Basic and Bearer are)")

    def _token(self, challenge: Challenge, who: Credentials | None, what: str) -> str:
        """A bearer token from the challenge's realm (the distribution token spec)."""
        realm = challenge.params.get("realm")
        if not realm:
            raise RegistryError(f"registry {self.registry}: {what}: a Bearer challenge without "
                                "a realm")
        params = [("scope", s) for s in sorted(self._scopes)]
        if challenge.params.get("service"):
            params.insert(0, ("service", challenge.params["service"]))
        try:
            resp = self.session.get(realm, params=params, timeout=self.timeout,
                                    auth=(who.username, who.password) if who else None)
        except requests.RequestException as e:
            raise RegistryError(f"registry {self.registry}: {what}: cannot reach the token "
                                f"server {realm}: {_reason(e)}") from None
        if resp.status_code != 200:
            whose = f"the credentials from {who.source}" if who else "an anonymous request"
            raise RegistryError(f"registry {self.registry}: {what}: the token server {realm} "
                                f"refused {whose} (HTTP {resp.status_code}) for "
                                f"{' '.join(sorted(self._scopes)) or 'no scope'}")
        try:
            doc = resp.json()
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"registry {self.registry}: {what}: the token server {realm} "
                                "answered without a token")
        return token

    def close(self) -> None:
        self.session.close()


__all__ = ["Transport", "Retryable", "plain_http", "RETRY_STATUS"]
