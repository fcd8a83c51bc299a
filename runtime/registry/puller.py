"""``mlpack pull`` and the pull behind ``load("oci://...")``: a registry's container to a file.

    pull("ghcr.io/team/mlp:v1", "mlp.mlpack")                  # this host's artifact only
    pull("ghcr.io/team/mlp:v1", "mlp.mlpack", everything=True) # every artifact: the pushed bytes
    pull(ref, out, host=platform_host("linux/arm64"))          # another host's artifact

In order: resolve the tag to the nested index and find its signatures (remote.py); fetch the
signatures' blobs and, under a trust policy, check them (spec/signing.py's check, the words
``load`` uses) before any artifact is fetched; choose the artifact (choose.py: load's selection
and the caller's policy) unless ``everything``; fetch that artifact's manifest, config and
layers; write the container (layout.py). Every document and blob goes through the cache
(cache.py) and is verified on arrival; one already there makes no request.

The file is partial (index.json annotated ``org.mlpack.partial``, spec/SPEC.md section 4) when
an artifact was left out: its nested index is the registry's, unchanged, so the signatures still
verify and readers know what was left out and why; ``everything`` (or a container of one
artifact) gives a whole file, the exact bytes that were pushed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass, field
from types import SimpleNamespace

from mlpack.spec import media, signing
from mlpack.spec.container import digest_of, open_container, parse_json, write_file_atomic
from mlpack.spec.errors import Error, RegistryError

from mlpack.runtime.host import Host, detect_host
from mlpack.runtime.registry import layout
from mlpack.runtime.registry.cache import Cache
from mlpack.runtime.registry.choose import choose
from mlpack.runtime.registry.client import RegistryClient
from mlpack.runtime.registry.reference import Reference, parse
from mlpack.runtime.registry.remote import Remote, resolve, signatures_for_check


@dataclass
class PullResult:
    """What a pull did: where the file is, what it holds, what moved."""

    path: str
    ref: Reference                   # with the nested index's digest
    name: str                        # the model's
    artifacts: list[int]             # indices (in the nested index) of the artifacts pulled
    total_artifacts: int
    reason: str = ""                 # why this artifact (selection's words); "" with everything
    signatures: int = 0
    fetched_blobs: int = 0           # documents and blobs that came from the registry
    fetched_bytes: int = 0
    cached_blobs: int = 0            # ... and those the cache already had
    digests: list[str] = field(default_factory=list)   # every blob in the file

    @property
    def partial(self) -> bool:
        return len(self.artifacts) < self.total_artifacts


class _Fetcher:
    """Gets blobs and documents into the cache, counting what came over the network."""

    def __init__(self, client: RegistryClient, cache: Cache, ref: Reference):
        self.client, self.cache, self.ref = client, cache, ref
        self.repo = ref.api_repository
        self.cached: set[str] = set()   # digests the cache had before this pull
        self.seen: set[str] = set()     # digests this pull has in the cache (artifacts share)

    def blob(self, desc: dict, where: str) -> None:
        digest, size = _descriptor(desc, where)
        if digest in self.seen:
            return
        self.seen.add(digest)
        if self.cache.has(digest, size):
            self.cached.add(digest)
            return
        with self.cache.writer(digest) as f:
            self.client.fetch_blob(self.repo, digest, size, f)
        self.cache.note_source(self.client.registry, self.repo, digest)

    def manifest(self, desc: dict, where: str) -> dict:
        digest, size = _descriptor(desc, where)
        if self.cache.has(digest, size):
            self.cached.add(digest)
            data = self.cache.read(digest)
        else:
            data = self.client.get_manifest(self.repo, digest, (media.OCI_MANIFEST,)).data
            if len(data) != size:
                raise RegistryError(f"{where}: the manifest {digest} is {len(data)} bytes, its "
                                    f"descriptor says {size}")
            self.cache.put(digest, data)
        return parse_json(data, f"{where} (manifest {digest})")


def _descriptor(desc, where: str) -> tuple[str, int]:
    if not isinstance(desc, dict) or not isinstance(desc.get("digest"), str) \
            or not isinstance(desc.get("size"), int) or desc["size"] < 0:
        raise RegistryError(f"{where}: a descriptor without a digest and size")
    return desc["digest"], desc["size"]


def pull(ref, out=None, *, everything: bool = False, host: Host | None = None, device=None,
         precision=None, accuracy_budget=None, code_types=None, trusted_keys=None,
         cache: Cache | None = None, report=None, verify: bool = True,
         **client_options) -> PullResult:
    """Pull the container ``ref`` names into ``out`` (None: into the cache, under a name made
    of what it holds, reused when it is there). See the module docstring; ``trusted_keys`` is a
    trust policy (spec/signing.py) checked before any artifact is fetched; ``verify`` opens the
    written file to check it, every blob hashed (None: documents only)."""
    ref = parse(ref) if isinstance(ref, str) else ref
    cache = cache or Cache()
    with RegistryClient.for_reference(ref, report=report, **client_options) as client:
        remote = resolve(client, ref, cache, report)
        fetch = _Fetcher(client, cache, ref)
        where = str(remote.ref)
        blobs = [remote.nested.digest]
        for sig in remote.signatures:
            for desc in sig.blob_descriptors():
                fetch.blob(desc, f"{where} signature {sig.document.digest}")
                blobs.append(desc["digest"])
            blobs.append(sig.document.digest)
        if trusted_keys:
            _check_trust(remote, cache, trusted_keys)
        if everything:
            chosen, reason = list(range(len(remote.descriptors))), ""
        else:
            art, verdicts = choose(remote.index, where, host or detect_host(), device=device,
                                   precision=precision, accuracy_budget=accuracy_budget,
                                   code_types=code_types)
            chosen, reason = [art.index], next(v.reason for v in verdicts if v.chosen)
        for i in chosen:
            desc = remote.descriptors[i]
            w = f"{where} artifact {i}"
            manifest = fetch.manifest(desc, w)
            for d in [manifest.get("config"), *(manifest.get("layers") or [])]:
                fetch.blob(d, w)
                blobs.append(d["digest"])
            blobs.append(desc["digest"])
    partial = len(chosen) < len(remote.descriptors)
    tag = ref.tag or "latest"
    signatures = [(s.document.digest, len(s.document.data)) for s in remote.signatures]
    index = layout.index_json(remote.nested.digest, len(remote.nested.data), tag,
                              remote.format_version, signatures, partial)
    path = _write(cache, out, remote, chosen, index, blobs, verify)
    return PullResult(path, remote.ref, remote.name, chosen, len(remote.descriptors), reason,
                      len(remote.signatures), client.received, client.received_bytes,
                      len(fetch.cached), sorted(set(blobs)))


def _check_trust(remote: Remote, cache: Cache, trusted_keys) -> None:
    """The trust policy's verdict on the signatures found, before any artifact is fetched (the
    loaded file is checked again, by both runtimes, before any code loads)."""
    box = SimpleNamespace(path=str(remote.ref), nested_digest=remote.nested.digest,
                          signatures=signatures_for_check(remote, cache))
    signing.check(box, signing.load_trusted_keys(trusted_keys))


def _write(cache: Cache, out, remote: Remote, chosen: list[int], index: bytes, blobs: list[str],
           verify: bool | None) -> str:
    if out is None:   # in the cache, named by what it holds (and reused: the name says it all)
        which = "all" if len(chosen) == len(remote.descriptors) else \
            "-".join(remote.descriptors[i]["digest"][7:19] for i in chosen)
        name = f"{remote.nested.digest[7:23]}-{which}-{digest_of(index)[7:19]}"
        path = cache.container_path(name)
        if path.is_file():
            return str(path)
    else:
        path = os.fspath(out)
    with contextlib.ExitStack() as stack:
        data = {}
        for digest in dict.fromkeys(blobs):
            with open(cache.blob_path(digest), "rb") as f:   # mapped: a big blob is not copied
                size = os.fstat(f.fileno()).st_size
                data[digest] = b"" if not size else stack.enter_context(
                    mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        try:
            write_file_atomic(path, layout.members(index, data))
        except OSError as e:
            raise Error(f"{path}: cannot write the container: {e.strerror or e}") from None
    if verify is not None:
        open_container(path, verify=verify).close()
    return str(path)


__all__ = ["pull", "PullResult"]
