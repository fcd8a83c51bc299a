"""``mlpack push``: a container file into a registry, as the distribution API stores images.

    push("mlp.mlpack", "ghcr.io/team/mlp:v1")

The file is opened and every blob verified first (only intact bytes leave). Then, in the order
registries require (what a manifest references must be there before it):

1. every config and layer of every artifact, and the signature manifests' configs and payloads:
   a HEAD first, so nothing is uploaded twice; a cross-repository mount where the blob is known
   to be in another repository of the same registry (``mount_from``, and the repositories the
   cache has seen it in); else an upload (one PUT, or POST, PATCH chunks, PUT for large blobs);
2. every artifact manifest, by digest;
3. the nested index, under the tag (default: the tag inside the file);
4. each signature manifest, under cosign's tag ``sha256-<hex of the nested index>.sig``, where
   ``cosign verify`` and ``mlpack pull`` look for it. It has a ``subject`` (the nested index), so
   a registry with the OCI 1.1 referrers API also lists it as a referrer; the registry says so
   with an ``OCI-Subject`` header, which is reported (``referrers``).

What is pushed is the file's own bytes, documents included, so ``mlpack pull --all`` (or
``skopeo copy --all``) gives the file back byte for byte. A partial container (mlpack pull without
--all) is refused: its nested index names manifests it does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlpack.spec import media
from mlpack.spec.container import BLOB_DIR, open_container
from mlpack.spec.errors import RegistryError
from mlpack.spec.signing import signature_tag

from mlpack.runtime.registry.cache import Cache
from mlpack.runtime.registry.client import RegistryClient
from mlpack.runtime.registry.reference import Reference, parse


@dataclass
class PushResult:
    ref: Reference              # tag and the nested index's digest
    uploaded: int = 0           # blobs sent
    uploaded_bytes: int = 0
    present: int = 0            # blobs the repository had
    mounted: int = 0            # blobs linked from another repository
    manifests: int = 0          # artifact manifests put
    signatures: int = 0
    referrers: bool = False     # the registry indexed the signature as a referrer


def push(path, ref, *, mount_from=(), cache: Cache | None = None, report=None,
         **client_options) -> PushResult:
    """Push the container at ``path`` to ``ref`` (REGISTRY/REPO[:TAG]; without a tag, the
    file's own). See the module docstring."""
    ref = parse(ref, default_tag=None) if isinstance(ref, str) else ref
    if ref.digest:
        raise RegistryError(f"{ref}: push to a tag, not a digest (the registry computes the "
                            "digest; it is the nested index's)")
    cache = cache or Cache()
    with open_container(path) as box:
        if getattr(box, "partial", False):
            raise RegistryError(f"{box.path} is a partial container (mlpack pull without --all): "
                                "it lacks artifacts its index names; push the whole file "
                                "(mlpack pull --all)")
        ref = ref.with_tag(ref.tag or box.tag).with_digest(box.nested_digest)
        with RegistryClient.for_reference(ref, report=report, **client_options) as client:
            result = PushResult(ref)
            _push_all(box, client, ref, list(mount_from), cache, result)
    return result


def _blob_reader(box, digest: str):
    view = box.member_bytes(BLOB_DIR + digest.split(":", 1)[1])
    return lambda offset, n: bytes(view[offset:offset + n])


def _push_all(box, client: RegistryClient, ref: Reference, mount_from: list[str], cache: Cache,
              result: PushResult) -> None:
    repo = ref.api_repository
    signatures = [e for e in box.index["manifests"]
                  if e.get("artifactType") == media.SIGNATURE_ARTIFACT_TYPE]
    blobs: dict[str, int] = {}
    for art in box.artifacts:
        for d in [art.manifest["config"], *art.manifest["layers"]]:
            blobs[d["digest"]] = d["size"]
    signature_docs = []
    for entry in signatures:
        manifest = box.json_blob(entry["digest"])
        signature_docs.append((entry, manifest))
        for d in [manifest["config"], *manifest["layers"]]:
            blobs[d["digest"]] = d["size"]
    for digest, size in blobs.items():
        sources = [r for r in dict.fromkeys(mount_from + cache.sources(client.registry, digest))
                   if r != repo]
        how = client.push_blob(repo, digest, size, _blob_reader(box, digest), sources)
        cache.note_source(client.registry, repo, digest)
        if how == "uploaded":
            result.uploaded += 1
            result.uploaded_bytes += size
        elif how == "mounted":
            result.mounted += 1
        else:
            result.present += 1
    for art in box.artifacts:
        digest = art.descriptor["digest"]
        client.put_manifest(repo, digest, box.read_verified(digest), media.OCI_MANIFEST)
        result.manifests += 1
    client.put_manifest(repo, ref.tag, box.read_verified(box.nested_digest), media.OCI_INDEX)
    for i, (entry, _) in enumerate(signature_docs):
        where = signature_tag(box.nested_digest) if i == 0 else entry["digest"]
        headers = client.put_manifest(repo, where, box.read_verified(entry["digest"]),
                                      media.OCI_MANIFEST)
        result.signatures += 1
        result.referrers = result.referrers or "OCI-Subject" in headers


__all__ = ["push", "PushResult"]
