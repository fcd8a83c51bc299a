"""The local registry cache: content-addressed, shared by every process of the user.

    <root>/blobs/sha256/<hex>          every blob and document pulled, stored once by digest
    <root>/containers/<name>.mlpack    containers load("oci://...") assembled from them
    <root>/sources/<registry>/<hex>    repositories of that registry known to hold the blob
                                       (one per line): where a push may mount it from

``<root>`` is MLPACK_OCI_CACHE, else $XDG_CACHE_HOME/mlpack/oci, else ~/.cache/mlpack/oci.

A blob is written to a temporary file beside its final name, checked against its digest by the
client as it arrives (client.py), flushed to disk and renamed into place: a reader sees a whole,
verified blob or none, and two processes filling the cache at once each write their own
temporary file and rename the same bytes over the same name. A blob in the cache makes no
request: digests name content, so it cannot be stale. Tags are never cached (a tag moves).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from mlpack.spec import environment
from mlpack.spec.container import digest_of, is_digest
from mlpack.spec.errors import RegistryError



def default_root() -> Path:
    """MLPACK_OCI_CACHE, else $XDG_CACHE_HOME/mlpack/oci, else ~/.cache/mlpack/oci."""
    root = environment.get("MLPACK_OCI_CACHE")
    if root:
        return Path(root)
    # XDG's variable, read as every XDG program reads it (not an MLPACK_ setting)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "mlpack" / "oci"


class Cache:
    """One cache folder (``root``; default ``default_root()``)."""

    def __init__(self, root=None):
        self.root = Path(root) if root is not None else default_root()

    def __repr__(self) -> str:
        return f"<Cache {self.root}>"

    # ---- blobs

    def blob_path(self, digest: str) -> Path:
        if not is_digest(digest):
            raise RegistryError(f"{digest!r} is not a sha256 digest")
        return self.root / "blobs" / "sha256" / digest.split(":", 1)[1]

    def has(self, digest: str, size: int | None = None) -> bool:
        """Whether the blob is here (with ``size`` bytes, when given)."""
        try:
            st = self.blob_path(digest).stat()
        except FileNotFoundError:
            return False
        return size is None or st.st_size == size

    def read(self, digest: str) -> bytes:
        return self.blob_path(digest).read_bytes()

    @contextlib.contextmanager
    def writer(self, digest: str):
        """A file to write blob ``digest`` into; renamed into place when the block ends without
        an exception (whoever writes it has checked the digest), removed otherwise."""
        final = self.blob_path(digest)
        self._mkdir(final.parent)
        try:
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name[:16]}.",
                                       suffix=".tmp")
        except OSError as e:
            raise RegistryError(f"cache {self.root}: cannot store {digest}: {e.strerror}") from None
        try:
            with os.fdopen(fd, "w+b") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())   # whole on disk before it has its name
            os.replace(tmp, final)
        except BaseException as e:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if isinstance(e, OSError) and e.errno is not None:   # a full disk: named
                raise RegistryError(f"cache {self.root}: cannot store {digest}: "
                                    f"{e.strerror or e}") from None
            raise

    def put(self, digest: str, data: bytes) -> Path:
        """Store a document already in memory (a manifest), after checking its digest."""
        if digest_of(data) != digest:
            raise RegistryError(f"cache {self.root}: the bytes given for {digest} hash to "
                                f"{digest_of(data)}")
        if not self.has(digest, len(data)):
            with self.writer(digest) as f:
                f.write(data)
        return self.blob_path(digest)

    # ---- assembled containers

    def container_path(self, name: str) -> Path:
        path = self.root / "containers" / f"{name}.mlpack"
        self._mkdir(path.parent)
        return path

    # ---- where blobs are known to be (for cross-repository mounts)

    def _source_file(self, registry: str, digest: str) -> Path:
        return self.root / "sources" / registry.replace("/", "_") / digest.split(":", 1)[1]

    def note_source(self, registry: str, repository: str, digest: str) -> None:
        """Remember that ``repository`` of ``registry`` holds ``digest``."""
        path = self._source_file(registry, digest)
        if repository in self.sources(registry, digest):
            return
        self._mkdir(path.parent)
        # one short O_APPEND write per line: lines from several processes never interleave
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{repository}\n".encode())
        finally:
            os.close(fd)

    def sources(self, registry: str, digest: str) -> list[str]:
        """Repositories of ``registry`` known to hold ``digest`` (most recent last)."""
        try:
            lines = self._source_file(registry, digest).read_text().splitlines()
        except (FileNotFoundError, UnicodeDecodeError):
            return []
        return list(dict.fromkeys(line for line in lines if line))

    def _mkdir(self, path: Path) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RegistryError(f"cache {self.root}: cannot create {path}: {e.strerror} (set "
                                "MLPACK_OCI_CACHE to a writable folder)") from None


__all__ = ["Cache", "default_root"]
