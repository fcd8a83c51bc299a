"""The container file a pull writes, from blobs by digest: the same bytes ``mlpack build`` and
``mlpack sign`` wrote, when every blob is there.

index.json is the one member no digest covers, so a pull writes it anew, exactly as
spec/container.py (``_layout``) and spec/signing.py (``signed_members``) write it:

    {"schemaVersion": 2, "mediaType": <OCI index>,
     "manifests": [<the nested index's descriptor, annotated org.opencontainers.image.ref.name:
                    the tag>,
                   <each signature manifest's descriptor, artifactType cosign's, tagged
                    sha256-<hex of the nested index>.sig>],
     "annotations": {"org.mlpack.format.version": <the nested index's; "1.2" once signed or
                                                    partial>,
                     "org.mlpack.partial": "true" (only when some artifact was left out)}}

serialized as every document of the format is (canonical JSON), and the members as the writer
lays them out (sorted, ustar, write_file_atomic). So ``mlpack pull --all`` of what ``mlpack
push`` sent (or ``skopeo copy --all`` copied) gives the file's exact bytes back.
"""

from __future__ import annotations

from mlpack.spec import media
from mlpack.spec.container import BLOB_DIR, canonical_json
from mlpack.spec.signing import SIGNED_FORMAT_VERSION, signature_entry


def index_json(nested_digest: str, nested_size: int, tag: str, format_version: str,
               signatures: list[tuple[str, int]], partial: bool) -> bytes:
    """index.json for a container whose nested index is (``nested_digest``, ``nested_size``),
    tagged ``tag``, with these signature manifests (digest, size), partial or whole."""
    entries = [{"mediaType": media.OCI_INDEX, "digest": nested_digest, "size": nested_size,
                "annotations": {media.REF_NAME: tag}}]
    entries += [signature_entry(digest, size, nested_digest) for digest, size in signatures]
    # signatures and partial containers are format 1.2 (spec/SPEC.md section 3); "1.2" is also
    # what spec/signing.py writes into a signed file's index.json
    annotations = {media.ANN_FORMAT_VERSION: SIGNED_FORMAT_VERSION if signatures or partial
                   else format_version}
    if partial:
        annotations[media.ANN_PARTIAL] = "true"
    return canonical_json({"schemaVersion": 2, "mediaType": media.OCI_INDEX,
                           "manifests": entries, "annotations": annotations})


def members(index: bytes, blobs: dict) -> list[tuple[str, object]]:
    """The tar members, sorted as the writer sorts them: ``blobs`` maps each digest to its
    bytes (or anything with ``len`` and the buffer protocol: an mmap of the cached file)."""
    out = {"blobs/": None, BLOB_DIR: None, "index.json": index,
           "oci-layout": canonical_json({"imageLayoutVersion": media.OCI_LAYOUT_VERSION})}
    out.update({BLOB_DIR + d.split(":", 1)[1]: data for d, data in blobs.items()})
    return sorted(out.items())


__all__ = ["index_json", "members"]
