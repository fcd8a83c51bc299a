"""mlpack.runtime.registry: containers in OCI registries (push, pull, ``load("oci://...")``).

    push("mlp.mlpack", "ghcr.io/team/mlp:v1")                  # every blob, manifest, signature
    pull("ghcr.io/team/mlp:v1", "mlp.mlpack")                  # only what this host runs
    mlpack.load("oci://ghcr.io/team/mlp:v1", precision="fp16") # pulled into the cache, loaded

A container is already an OCI image layout, so a registry stores it as it stores any image
index: the nested index under the tag, each artifact a manifest, each config and layer a blob,
and a signature under cosign's tag. A host resolves the tag, chooses its artifact from the nested
index's annotations with load's selection, and fetches that artifact alone: a partial container
(spec/SPEC.md section 4), whose nested index, unchanged, still verifies against the signature.

One module per job:

    reference.py  REGISTRY/REPOSITORY[:TAG][@DIGEST] and oci://
    auth.py       credentials (environment, docker's config.json) and 401 challenges
    transport.py  HTTP: http only for loopback, retries with backoff, token and basic auth
    client.py     the distribution API: manifests, blobs, chunked uploads, mounts, referrers
    progress.py   progress lines for large blobs
    cache.py      the content-addressed local cache (MLPACK_OCI_CACHE)
    remote.py     what a tag names: the nested index and its signatures
    choose.py     which artifact a host pulls (runtime/select.py on the descriptors)
    layout.py     the container file a pull writes (the pushed bytes, when whole)
    puller.py     registry -> file (pull);  pusher.py  file -> registry (push)

Importing this package imports none of them (nor ``requests``): ``load`` calls ``local_file``,
which does only for an ``oci://`` path.
"""

from __future__ import annotations

import os

from mlpack.spec import media

from mlpack.runtime.registry.reference import OCI_SCHEME, Reference, is_oci, parse


def local_file(path, *, device=None, precision=None, accuracy_budget=None, host=None,
               trusted_keys=None, cache=None):
    """``path`` as it is, unless it is an ``oci://REGISTRY/REPOSITORY[:TAG]`` reference: then
    the local file of the container it names, pulled for this host (or ``host``) under the
    policy into the cache (puller.py), with its signatures. ``trusted_keys`` (None:
    MLPACK_TRUSTED_KEYS) is checked before any artifact is fetched; load checks the file again."""
    if not is_oci(path):
        return path
    from mlpack.runtime import engine
    from mlpack.runtime.registry.puller import pull
    from mlpack.spec import signing

    # what load will run: the engine's code where it selects, else the portable program only
    code_types = None if host is None and engine.available() else {media.PROGRAM_PORTABLE}
    return pull(os.fspath(path), None, host=host, device=device, precision=precision,
                accuracy_budget=accuracy_budget, code_types=code_types,
                trusted_keys=signing.policy_spec(trusted_keys), cache=cache, verify=None).path


def pull(ref, out=None, **options):
    """puller.py's ``pull`` (imported when first used)."""
    from mlpack.runtime.registry.puller import pull as _pull

    return _pull(ref, out, **options)


def push(path, ref, **options):
    """pusher.py's ``push`` (imported when first used)."""
    from mlpack.runtime.registry.pusher import push as _push

    return _push(path, ref, **options)


__all__ = ["local_file", "pull", "push", "parse", "is_oci", "Reference", "OCI_SCHEME"]
