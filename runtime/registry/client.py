"""The OCI distribution API (https://github.com/opencontainers/distribution-spec), the calls
push and pull make, over one registry's Transport:

    GET  /v2/<repo>/manifests/<tag|digest>   Accept: the media types asked for
    PUT  /v2/<repo>/manifests/<tag|digest>   Content-Type: the document's media type
    HEAD /v2/<repo>/blobs/<digest>            is it there? (nothing is uploaded twice)
    GET  /v2/<repo>/blobs/<digest>            streamed, hashed as it arrives
    POST /v2/<repo>/blobs/uploads/?mount=<digest>&from=<repo>   cross-repository mount
    POST /v2/<repo>/blobs/uploads/, PATCH <location> (chunks), PUT <location>?digest=<digest>
    GET  /v2/<repo>/referrers/<digest>?artifactType=T            OCI 1.1; 404 where unsupported

Every byte that comes back is checked before anyone uses it: a manifest asked for by digest must
hash to it, a blob must hash to its digest and have its descriptor's size (a longer answer is cut
off there), and a registry's ``Docker-Content-Digest`` must agree. A mismatch is a RegistryError
that names the registry, the repository and the full digest; nothing of it is kept.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlencode

import requests

from mlpack.spec.container import MAX_JSON, digest_of
from mlpack.spec.errors import RegistryError

from mlpack.runtime.registry.progress import Meter
from mlpack.runtime.registry.reference import Reference
from mlpack.runtime.registry.transport import ATTEMPTS, Retryable, Transport

CHUNK_SIZE = 16 << 20   # bytes per PATCH of a chunked upload; smaller blobs go in one PUT
READ_SIZE = 1 << 20     # bytes per read of a streamed download
OCTETS = "application/octet-stream"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"   # what the referrers API answers


@dataclass(frozen=True)
class Document:
    """A manifest or index as the registry served it: its exact bytes, media type and digest."""

    data: bytes
    media_type: str
    digest: str


def _kind(reference: str) -> str:
    return f"digest {reference}" if reference.startswith("sha256:") else f"tag {reference}"


class RegistryClient:
    """One registry's distribution API. ``report`` receives progress lines (progress.py)."""

    def __init__(self, registry: str, api_host: str | None = None, *, report=None,
                 chunk_size: int = CHUNK_SIZE, **transport_options):
        self.registry = registry
        self.transport = Transport(registry, api_host, **transport_options)
        self.report = report
        self.chunk_size = chunk_size
        # what came from the registry, verified: documents and blobs, and their bytes
        self.received, self.received_bytes = 0, 0

    @classmethod
    def for_reference(cls, ref: Reference, **options) -> RegistryClient:
        return cls(ref.registry, ref.api_host, **options)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- manifests

    def get_manifest(self, repo: str, reference: str, accept, *,
                     missing_ok: bool = False) -> Document | None:
        """The manifest or index ``reference`` (a tag or a digest) names, verified; None when
        ``missing_ok`` and the registry has no such reference."""
        what = f"repository {repo}, {_kind(reference)}"
        resp = self.transport.request("GET", f"/v2/{repo}/manifests/{reference}", what=what,
                                      headers={"Accept": ", ".join(accept)}, stream=True,
                                      allow=(404,) if missing_ok else ())
        with resp:
            if resp.status_code == 404:
                return None
            data = self._read_document(resp, what)
        digest = digest_of(data)
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(f"registry {self.registry}: {what}: the registry served a "
                                f"document whose sha256 is {digest}; refused")
        served = resp.headers.get("Docker-Content-Digest", "")
        if served.startswith("sha256:") and served != digest:
            raise RegistryError(f"registry {self.registry}: {what}: the registry says its digest "
                                f"is {served}, its bytes hash to {digest}; refused")
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        self.received += 1
        self.received_bytes += len(data)
        return Document(data, media_type, digest)

    def _read_document(self, resp: requests.Response, what: str) -> bytes:
        declared = resp.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > MAX_JSON:
            raise RegistryError(f"registry {self.registry}: {what}: a {declared}-byte document, "
                                f"larger than a manifest may be ({MAX_JSON})")
        parts, total = [], 0
        try:
            for chunk in resp.iter_content(READ_SIZE):
                total += len(chunk)
                if total > MAX_JSON:
                    raise RegistryError(f"registry {self.registry}: {what}: the document is "
                                        f"larger than a manifest may be ({MAX_JSON} bytes)")
                parts.append(chunk)
        except requests.RequestException as e:
            raise RegistryError(f"registry {self.registry}: {what}: the connection broke while "
                                f"reading ({type(e).__name__})") from None
        return b"".join(parts)

    def put_manifest(self, repo: str, reference: str, data: bytes,
                     media_type: str) -> requests.structures.CaseInsensitiveDict:
        """Store a manifest or index under ``reference`` (its digest, or a tag); the response
        headers (``OCI-Subject`` says the registry indexed its subject as a referrer)."""
        what = f"repository {repo}, {_kind(reference)} (putting a {media_type.rsplit('.', 2)[-2]})"
        resp = self.transport.request("PUT", f"/v2/{repo}/manifests/{reference}", what=what,
                                      headers={"Content-Type": media_type}, body=data,
                                      ok=(200, 201))
        resp.close()
        digest, served = digest_of(data), resp.headers.get("Docker-Content-Digest", "")
        if served.startswith("sha256:") and served != digest:
            raise RegistryError(f"registry {self.registry}: {what}: the registry stored it as "
                                f"{served}, not {digest} (it changed the bytes)")
        return resp.headers

    def referrers(self, repo: str, digest: str, artifact_type: str | None = None) -> list | None:
        """The descriptors of the manifests whose ``subject`` is ``digest`` (of
        ``artifact_type``, when given); None where the registry has no referrers API."""
        what = f"repository {repo}, referrers of {digest}"
        found, path = [], f"/v2/{repo}/referrers/{digest}"
        params = {"artifactType": artifact_type} if artifact_type else None
        for _ in range(100):   # pages
            resp = self.transport.request("GET", path, what=what, params=params, stream=True,
                                          headers={"Accept": OCI_INDEX}, allow=(400, 404, 405))
            with resp:
                if resp.status_code != 200:
                    return None if not found else found
                data = self._read_document(resp, what)
            try:
                manifests = json.loads(data).get("manifests") or []
            except (ValueError, AttributeError):
                raise RegistryError(f"registry {self.registry}: {what}: the answer is not an "
                                    "OCI index") from None
            found += [m for m in manifests if isinstance(m, dict) and (
                artifact_type is None or m.get("artifactType") == artifact_type)]
            nxt = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', resp.headers.get("Link", ""))
            if not nxt:
                break
            path, params = nxt.group(1), None
        return found

    # ---- blobs

    def has_blob(self, repo: str, digest: str) -> bool:
        resp = self.transport.request("HEAD", f"/v2/{repo}/blobs/{digest}", allow=(404,),
                                      what=f"repository {repo}, blob {digest}")
        resp.close()
        return resp.status_code == 200

    def fetch_blob(self, repo: str, digest: str, size: int, out) -> None:
        """Stream blob ``digest`` into the file ``out``, hashing as it arrives; exactly ``size``
        bytes whose sha256 is ``digest``, else RegistryError (``out`` is then left holding
        garbage: the caller throws it away). A broken connection starts over, as 5xx does."""
        what = f"repository {repo}, blob {digest}"
        meter = Meter(self.report, "pulling", digest, size)
        for attempt in range(1, ATTEMPTS + 1):
            out.seek(0)
            out.truncate()
            meter.restart()
            try:
                self._stream(repo, digest, size, out, meter, what)
                self.received += 1
                self.received_bytes += size
                break
            except Retryable:
                if attempt == ATTEMPTS:
                    raise
                self.transport.pause(attempt)
        meter.finish()

    def _stream(self, repo, digest, size, out, meter, what) -> None:
        resp = self.transport.request("GET", f"/v2/{repo}/blobs/{digest}", what=what, stream=True)
        h, total = hashlib.sha256(), 0
        with resp:
            try:
                for chunk in resp.iter_content(READ_SIZE):
                    if total + len(chunk) > size:   # never store more than was declared
                        chunk = chunk[:size - total]
                        total = size + 1
                    else:
                        total += len(chunk)
                    h.update(chunk)
                    out.write(chunk)
                    meter.add(len(chunk))
                    if total > size:
                        break
            except requests.RequestException as e:
                raise Retryable(f"registry {self.registry}: {what}: the connection broke after "
                                f"{total} of {size} bytes ({type(e).__name__})") from None
        got = "sha256:" + h.hexdigest()
        if total != size or got != digest:
            amount = f"more than {size}" if total > size else str(total)
            raise RegistryError(f"registry {self.registry}: {what} does not match its digest: "
                                f"the registry served {amount} bytes (the descriptor says {size}) "
                                f"whose sha256 is {got}; refused (the registry's copy is corrupt "
                                "or was replaced)")

    def push_blob(self, repo: str, digest: str, size: int, read: Callable[[int, int], bytes],
                  mount_from=()) -> str:
        """Make blob ``digest`` (``size`` bytes; ``read(offset, n)`` gives them) exist in
        ``repo``: ``"present"`` when it already did (HEAD), ``"mounted"`` when the registry
        linked it from one of the repositories ``mount_from``, ``"uploaded"`` otherwise (one PUT,
        or POST/PATCH chunks/PUT above ``chunk_size``). An upload that fails on something
        retryable starts over with a new session."""
        if self.has_blob(repo, digest):
            return "present"
        what = f"repository {repo}, blob {digest}"
        meter = Meter(self.report, "pushing", digest, size)
        for attempt in range(1, ATTEMPTS + 1):
            meter.restart()
            try:
                location = None
                for source in mount_from:
                    if source == repo:
                        continue
                    location = self._mount(repo, digest, source, what)
                    if location is None:
                        meter.finish()
                        return "mounted"
                if location is None:
                    location = self._location(self.transport.request(
                        "POST", f"/v2/{repo}/blobs/uploads/", what=what, ok=(202,), retry=False,
                        headers={"Content-Length": "0"}), what)
                self._upload(location, digest, size, read, meter, what)
                meter.finish()
                return "uploaded"
            except Retryable:
                if attempt == ATTEMPTS:
                    raise
                self.transport.pause(attempt)
        raise AssertionError("unreachable")

    def _mount(self, repo: str, digest: str, source: str, what: str) -> str | None:
        """POST ?mount=&from=: None when mounted (201), else the upload session the registry
        opened instead (202: it does not have the blob there, or does not mount)."""
        query = urlencode({"mount": digest, "from": source})
        resp = self.transport.request("POST", f"/v2/{repo}/blobs/uploads/?{query}", what=what,
                                      ok=(201, 202), retry=False, headers={"Content-Length": "0"})
        resp.close()
        return None if resp.status_code == 201 else self._location(resp, what)

    def _location(self, resp: requests.Response, what: str) -> str:
        resp.close()
        location = resp.headers.get("Location")
        if not location:
            raise RegistryError(f"registry {self.registry}: {what}: the registry opened an "
                                "upload without a Location")
        if location.startswith("/"):
            location = self.transport.base + location
        return location

    def _upload(self, location: str, digest: str, size: int, read, meter, what: str) -> None:
        offset = 0
        if size > self.chunk_size:   # PATCH the chunks, then PUT with nothing more
            while offset < size:
                chunk = read(offset, min(self.chunk_size, size - offset))
                resp = self.transport.request(
                    "PATCH", location, what=what, ok=(202,), retry=False, body=chunk,
                    headers={"Content-Type": OCTETS,
                             "Content-Range": f"{offset}-{offset + len(chunk) - 1}"})
                location = self._location(resp, what)
                offset += len(chunk)
                meter.add(len(chunk))
        body = read(offset, size - offset)
        sep = "&" if "?" in location else "?"
        resp = self.transport.request("PUT", f"{location}{sep}{urlencode({'digest': digest})}",
                                      what=what, ok=(201,), retry=False, body=body,
                                      headers={"Content-Type": OCTETS})
        resp.close()
        meter.add(len(body))
        served = resp.headers.get("Docker-Content-Digest", "")
        if served.startswith("sha256:") and served != digest:
            raise RegistryError(f"registry {self.registry}: {what}: the registry stored it as "
                                f"{served}")


__all__ = ["RegistryClient", "Document", "CHUNK_SIZE"]
