"""What a reference names in a registry: the container's nested index, and its signatures.

``resolve`` asks the registry for the tag (always: a tag moves) and checks that what it names is
an mlpack container: an OCI image index with the format version and model name annotations (a
newer major format is the reader's VersionError). Then the signature manifests that refer to
that index, from the two places a signature may be: cosign's tag ``sha256-<hex>.sig`` (where
``mlpack push`` and ``skopeo copy`` put the one inside a signed file) and the OCI 1.1 referrers
API, where the registry has it. Only manifests the container format can hold are kept
(artifactType cosign's signature, ``subject`` this index: spec/SPEC.md section 9); others (cosign's
older tag-only layout, say) are skipped with a line to ``report``.

Nothing here fetches a layer, so a host decides what to pull, and whether it trusts the
signatures, from a few kilobytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlpack.spec import media
from mlpack.spec.container import Signature, parse_json, parse_version
from mlpack.spec.errors import RegistryError
from mlpack.spec.signing import signature_tag

from mlpack.runtime.registry.cache import Cache
from mlpack.runtime.registry.client import Document, RegistryClient
from mlpack.runtime.registry.reference import Reference

DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
# asked for by tag: every kind, so that an image gets "not an mlpack container", not a 404
ANY_MANIFEST = (media.OCI_INDEX, media.OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST)


@dataclass
class SignatureManifest:
    """A signature manifest as served (``document``) and parsed (``manifest``)."""

    document: Document
    manifest: dict

    def blob_descriptors(self) -> list[dict]:
        return [self.manifest["config"], *self.manifest["layers"]]


@dataclass
class Remote:
    """A container in a registry, resolved: ``nested`` is its nested index as served."""

    ref: Reference               # with the digest of the nested index filled in
    nested: Document
    index: dict                  # the nested index, parsed
    signatures: list[SignatureManifest] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.index["annotations"][media.ANN_MODEL_NAME]

    @property
    def format_version(self) -> str:
        return self.index["annotations"][media.ANN_FORMAT_VERSION]

    @property
    def descriptors(self) -> list[dict]:
        return self.index["manifests"]


def resolve(client: RegistryClient, ref: Reference, cache: Cache, report=None) -> Remote:
    """The container ``ref`` names, its nested index stored in ``cache``, and its signatures
    (their manifests; their payloads are blobs the pull fetches)."""
    repo = ref.api_repository
    doc = client.get_manifest(repo, ref.reference, ANY_MANIFEST)
    where = f"{ref}"
    index = parse_json(doc.data, f"{where} (nested index {doc.digest})")
    kind = index.get("mediaType") or doc.media_type
    if kind != media.OCI_INDEX:
        raise RegistryError(f"{where} is a {kind or 'document of unknown media type'}, not an "
                            "mlpack container (an OCI image index of mlpack artifacts)")
    annotations = index.get("annotations")
    if not isinstance(annotations, dict) or media.ANN_FORMAT_VERSION not in annotations \
            or not isinstance(annotations.get(media.ANN_MODEL_NAME), str):
        raise RegistryError(f"{where} is an OCI image index without the annotations "
                            f"{media.ANN_MODEL_NAME} and {media.ANN_FORMAT_VERSION}: not an "
                            "mlpack container")
    parse_version(annotations[media.ANN_FORMAT_VERSION], f"{where} {media.ANN_FORMAT_VERSION}")
    if not isinstance(index.get("manifests"), list) or not index["manifests"]:
        raise RegistryError(f"{where}: the nested index lists no artifact")
    cache.put(doc.digest, doc.data)
    remote = Remote(ref.with_digest(doc.digest), doc, index)
    remote.signatures = _signatures(client, remote, cache, report)
    return remote


def _signatures(client: RegistryClient, remote: Remote, cache: Cache,
                report) -> list[SignatureManifest]:
    repo, nested = remote.ref.api_repository, remote.nested.digest
    found: dict[str, SignatureManifest] = {}
    tagged = client.get_manifest(repo, signature_tag(nested), (media.OCI_MANIFEST,),
                                 missing_ok=True)
    if tagged is not None:
        _keep(found, tagged, nested, f"{remote.ref.with_tag(signature_tag(nested))}", report)
    for desc in client.referrers(repo, nested, media.SIGNATURE_ARTIFACT_TYPE) or []:
        digest = desc.get("digest")
        if not isinstance(digest, str) or digest in found:
            continue
        doc = (Document(cache.read(digest), media.OCI_MANIFEST, digest) if cache.has(digest)
               else client.get_manifest(repo, digest, (media.OCI_MANIFEST,)))
        _keep(found, doc, nested, f"{remote.ref.with_digest(digest)}", report)
    for sig in found.values():
        cache.put(sig.document.digest, sig.document.data)
    return list(found.values())


def _keep(found: dict, doc: Document, nested: str, where: str, report) -> None:
    """Add ``doc`` to ``found`` if it is a signature manifest the container format holds."""
    manifest = parse_json(doc.data, f"{where} (signature manifest)")
    subject = manifest.get("subject")
    layers = manifest.get("layers")
    ok = (manifest.get("mediaType", media.OCI_MANIFEST) == media.OCI_MANIFEST
          and manifest.get("artifactType") == media.SIGNATURE_ARTIFACT_TYPE
          and isinstance(subject, dict) and subject.get("digest") == nested
          and isinstance(manifest.get("config"), dict) and isinstance(layers, list)
          and all(isinstance(d, dict) for d in layers))
    if ok:
        found[doc.digest] = SignatureManifest(doc, manifest)
    elif report:
        report(f"skipping {where}: not a signature manifest whose subject is this container "
               "(spec/SPEC.md section 9)")


def signatures_for_check(remote: Remote, cache: Cache) -> list[Signature]:
    """The signatures as spec/signing.check reads them (each payload layer, read from the
    cache, where the pull has put it)."""
    out = []
    for sig in remote.signatures:
        for layer in sig.manifest["layers"]:
            ann = layer.get("annotations") or {}
            if layer.get("mediaType") == media.SIGNATURE_PAYLOAD and media.ANN_SIGNATURE in ann:
                out.append(Signature(sig.document.digest, ann[media.ANN_SIGNATURE],
                                     ann.get(media.ANN_SIGNATURE_KEY),
                                     cache.read(layer["digest"])))
    return out


__all__ = ["Remote", "SignatureManifest", "resolve", "signatures_for_check"]
