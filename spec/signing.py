"""Signed containers: Ed25519 keys, cosign's signature format inside the file, and the check a
trust policy makes (spec/SPEC.md section 9; the C engine's trust.c makes the same check).

    keygen("release")                         # release.key (private, 0600) and release.pub
    sign("model.mlpack", "release.key")       # the file now carries the signature
    check(open_container("model.mlpack"), load_trusted_keys("release.pub"))  # -> the key id

A signature is cosign's: the "simple signing" payload

    {"critical":{"identity":{"docker-reference":NAME},"image":{"docker-manifest-digest":D},
     "type":"cosign container image signature"},"optional":null}

where D is the digest of the container's nested index (which covers every manifest, config and
layer), signed with Ed25519 over the payload's exact bytes. It lives in a manifest whose
``subject`` is the nested index (an OCI 1.1 referrer, as cosign writes in referrers mode), one
payload layer per signing key, each annotated with the base64 signature
(``dev.cosignproject.cosign/signature``) and the key's id (``org.mlpack.signature.key``: the
sha256 of its DER SubjectPublicKeyInfo). index.json lists that manifest beside the nested index,
tagged ``sha256-<hex>.sig`` as cosign tags signatures, so the signature travels with the file and
with registry copies, and a registry copy is laid out where ``cosign verify --key`` looks.

Keys are PEM files: PKCS#8 private keys (encrypted when MLPACK_KEY_PASSWORD is set) and
SubjectPublicKeyInfo public keys, as openssl and cosign read them. The cryptography is the
``cryptography`` package's, imported only when a key is used: reading a container needs none.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from mlpack.spec import environment, media
from mlpack.spec.container import (BLOB_DIR, Container, canonical_json, digest_of,
                                   open_container, write_file_atomic)
from mlpack.spec.errors import KeyFileError, SignatureError

SIGNED_FORMAT_VERSION = "1.2"  # index.json's version once it lists a signature
EMPTY_CONFIG = b"{}"  # the signature manifest's config (OCI's empty descriptor)


def _crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise KeyFileError("signing and trust policies need the cryptography package "
                           "(pip install cryptography)") from None
    return serialization, ed25519


# ---------------------------------------------------------------- keys


def key_id(public_key) -> str:
    """``sha256:<hex>`` of the key's DER SubjectPublicKeyInfo (the same in trust.c)."""
    serialization, _ = _crypto()
    der = public_key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def _password() -> bytes | None:
    value = environment.get("MLPACK_KEY_PASSWORD")
    return value.encode() if value else None


def keygen(prefix) -> tuple[Path, Path]:
    """A new Ed25519 key pair: PREFIX.key (PKCS#8 PEM, mode 0600, encrypted with
    MLPACK_KEY_PASSWORD when set) and PREFIX.pub (public, PEM). Never overwrites a file."""
    serialization, ed25519 = _crypto()
    prefix = Path(prefix)
    private, public = prefix.with_name(prefix.name + ".key"), prefix.with_name(prefix.name + ".pub")
    for p in (private, public):
        if p.exists():
            raise KeyFileError(f"{p} exists; mlpack keygen does not overwrite keys")
    key = ed25519.Ed25519PrivateKey.generate()
    password = _password()
    encryption = (serialization.BestAvailableEncryption(password) if password
                  else serialization.NoEncryption())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            encryption)
    try:
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise KeyFileError(f"cannot write {private}: {e.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def load_signing_key(path):
    """The Ed25519 private key in PEM file ``path`` (MLPACK_KEY_PASSWORD if it is encrypted)."""
    serialization, ed25519 = _crypto()
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise KeyFileError(f"signing key {path}: {e.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, _password())
    except TypeError:
        raise KeyFileError(f"signing key {path} is encrypted: set MLPACK_KEY_PASSWORD") from None
    except ValueError as e:
        raise KeyFileError(f"signing key {path} is not a PEM private key, or the password is "
                           f"wrong ({e})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise KeyFileError(f"signing key {path} is not an Ed25519 key (mlpack keygen makes one)")
    return key


def _pem_public_keys(path: Path) -> list:
    serialization, ed25519 = _crypto()
    try:
        text = path.read_bytes()
    except OSError as e:
        raise KeyFileError(f"trusted key {path}: {e.strerror}") from None
    if b"PRIVATE KEY-----" in text:
        raise KeyFileError(f"{path} holds a private key; a trust policy takes public keys only "
                           "(mlpack keygen writes NAME.pub)")
    keys, begin = [], b"-----BEGIN PUBLIC KEY-----"
    for block in text.split(begin)[1:]:
        end = block.find(b"-----END PUBLIC KEY-----")
        if end < 0:
            raise KeyFileError(f"{path}: a PEM block has no END line")
        pem = begin + block[:end] + b"-----END PUBLIC KEY-----\n"
        try:
            key = serialization.load_pem_public_key(pem)
        except ValueError:
            key = None
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise KeyFileError(f"{path}: a public key that is not Ed25519 (mlpack signs with "
                               "Ed25519 keys: mlpack keygen)")
        keys.append(key)
    if not keys:
        raise KeyFileError(f"trusted key {path} holds no PEM public key")
    return keys


def _key_files(entry: Path) -> list[Path]:
    if not entry.is_dir():
        return [entry]
    files = sorted(p for p in entry.iterdir()
                   if p.suffix in (".pub", ".pem") and not p.name.startswith("."))
    if not files:
        raise KeyFileError(f"trusted keys {entry}: the directory has no .pub or .pem file")
    return files


class TrustedKeys:
    """A trust policy's keys: ``source`` says where they came from (for messages)."""

    def __init__(self, keys: list, source: str):
        self.keys = {key_id(k): k for k in keys}
        self.source = source

    def __repr__(self) -> str:
        return f"<TrustedKeys {len(self.keys)} key(s) from {self.source}>"


def load_trusted_keys(spec) -> TrustedKeys:
    """Keys from ``spec``: a path (a PEM file, or a directory of .pub/.pem files), a string of
    such paths separated by ':', or a list of paths, as MLPACK_TRUSTED_KEYS and the engine's
    ``trusted_keys`` option take them."""
    if isinstance(spec, TrustedKeys):
        return spec
    entries = spec.split(os.pathsep) if isinstance(spec, str) else \
        [spec] if isinstance(spec, os.PathLike) else list(spec)
    entries = [Path(e) for e in entries if str(e)]
    if not entries:
        raise KeyFileError("the trust policy names no key")
    keys = []
    for entry in entries:
        if not entry.exists():
            raise KeyFileError(f"trusted key {entry}: no such file or directory")
        for f in _key_files(entry):
            keys += _pem_public_keys(f)
    return TrustedKeys(keys, os.pathsep.join(map(str, entries)))


def policy_spec(trusted_keys) -> str | None:
    """The ':'-separated path list the engine takes for ``trusted_keys`` (None: the environment's
    MLPACK_TRUSTED_KEYS, "" or unset meaning no policy)."""
    if trusted_keys is None:
        return environment.get("MLPACK_TRUSTED_KEYS") or None
    if isinstance(trusted_keys, TrustedKeys):
        return trusted_keys.source
    if isinstance(trusted_keys, (str, os.PathLike)):
        return os.fspath(trusted_keys)
    return os.pathsep.join(os.fspath(p) for p in trusted_keys)


# ---------------------------------------------------------------- signing


def payload(nested_digest: str, identity: str) -> bytes:
    """cosign's simple-signing payload for ``nested_digest`` (keys sorted: cosign's own order)."""
    return canonical_json({"critical": {"identity": {"docker-reference": identity},
                                        "image": {"docker-manifest-digest": nested_digest},
                                        "type": media.SIGNATURE_PAYLOAD_TYPE},
                           "optional": None})


def _descriptor(data: bytes, media_type: str, **extra) -> dict:
    return {"mediaType": media_type, "digest": digest_of(data), "size": len(data), **extra}


def signature_tag(nested_digest: str) -> str:
    """cosign's tag for an image's signatures: ``sha256-<hex of the nested index>.sig``."""
    return nested_digest.replace(":", "-") + ".sig"


def signature_entry(manifest_digest: str, size: int, nested_digest: str) -> dict:
    """index.json's entry for the signature manifest of the container whose nested index is
    ``nested_digest`` (what signing writes and a registry pull writes back)."""
    return {"mediaType": media.OCI_MANIFEST, "digest": manifest_digest, "size": size,
            "artifactType": media.SIGNATURE_ARTIFACT_TYPE,
            "annotations": {media.REF_NAME: signature_tag(nested_digest)}}


def sign(path, key_path, identity: str | None = None) -> str:
    """Sign the container at ``path`` with the private key at ``key_path``, in place (atomic:
    the file is either as it was or signed). The container is fully verified first: only
    intact bytes get a signature. A signature by the same key is replaced; others are kept.
    ``identity`` is the payload's docker-reference (default: the model's name). Returns the key
    id."""
    key = load_signing_key(key_path)
    with open_container(path) as c:
        members = signed_members(c, key, identity)
        write_file_atomic(path, members)
    return key_id(key.public_key())


def signed_members(c: Container, key, identity: str | None = None) -> list[tuple[str, object]]:
    """The tar members (sorted) of container ``c`` signed with private key ``key`` (see
    ``sign``): its members as they are, plus the signature's blobs and a new index.json."""
    kid = key_id(key.public_key())
    body = payload(c.nested_digest, identity or c.name)
    layer = _descriptor(body, media.SIGNATURE_PAYLOAD, annotations={
        media.ANN_SIGNATURE: base64.b64encode(key.sign(body)).decode(),
        media.ANN_SIGNATURE_KEY: kid})
    kept, dropped = _kept_signatures(c, kid)
    layers = sorted(kept + [layer], key=lambda d: d["annotations"][media.ANN_SIGNATURE_KEY])
    nested = next(e for e in c.index["manifests"] if e.get("digest") == c.nested_digest)
    manifest = canonical_json({
        "schemaVersion": 2, "mediaType": media.OCI_MANIFEST,
        "artifactType": media.SIGNATURE_ARTIFACT_TYPE,
        "config": _descriptor(EMPTY_CONFIG, media.OCI_EMPTY),
        "layers": layers,
        "subject": {k: nested[k] for k in ("mediaType", "digest", "size")}})
    entry = signature_entry(digest_of(manifest), len(manifest), c.nested_digest)
    index = dict(c.index, manifests=[nested, entry],
                 annotations={**c.index.get("annotations", {}),
                              media.ANN_FORMAT_VERSION: SIGNED_FORMAT_VERSION})
    new = {BLOB_DIR + digest_of(d).split(":", 1)[1]: d for d in (body, manifest, EMPTY_CONFIG)}
    members = {name: c.member_bytes(name) for name in c.member_names()
               if name != "index.json" and name not in dropped}
    members.update(new)
    members["index.json"] = canonical_json(index)
    return sorted(members.items())


def _kept_signatures(c: Container, kid: str) -> tuple[list[dict], set[str]]:
    """The signature layers to keep (those by other keys) and the members signing drops: the old
    signature manifest and the payload of the key being re-signed."""
    kept, dropped = [], set()
    for entry in c.index["manifests"]:
        if entry.get("artifactType") != media.SIGNATURE_ARTIFACT_TYPE:
            continue
        dropped.add(BLOB_DIR + entry["digest"].split(":", 1)[1])
        manifest = c.json_blob(entry["digest"])
        for layer in manifest["layers"]:
            if layer.get("annotations", {}).get(media.ANN_SIGNATURE_KEY) == kid \
                    or media.ANN_SIGNATURE_KEY not in layer.get("annotations", {}):
                dropped.add(BLOB_DIR + layer["digest"].split(":", 1)[1])
            else:
                kept.append(layer)
    return kept, dropped


# ---------------------------------------------------------------- checking


def _claims(body: bytes, digest: str) -> bool:
    import json

    try:
        critical = json.loads(body).get("critical") or {}
        return (critical.get("type") == media.SIGNATURE_PAYLOAD_TYPE
                and (critical.get("image") or {}).get("docker-manifest-digest") == digest)
    except (ValueError, AttributeError):
        return False


def check(c: Container, trusted: TrustedKeys) -> str:
    """The id of the trusted key whose signature of ``c`` verifies and names its nested index;
    SignatureError saying why not (the same cases, in the same words, as the C engine)."""
    _crypto()
    from cryptography.exceptions import InvalidSignature

    if not c.signatures:
        raise SignatureError(f"{c.path} is not signed, and the trust policy (keys from "
                             f"{trusted.source}) requires a signature by a trusted key "
                             "(mlpack sign)")
    unknown = bad = other = 0
    for s in c.signatures:
        try:
            sig = base64.b64decode(s.signature, validate=True)
        except ValueError:
            sig = b""
        verified = False
        for kid, key in trusted.keys.items():
            try:
                key.verify(sig, s.payload)
            except InvalidSignature:
                continue
            verified = True
            if _claims(s.payload, c.nested_digest):
                return kid
            other += 1
            break
        if not verified:
            if s.key in trusted.keys:
                bad += 1
            else:
                unknown += 1
    raise SignatureError(f"{c.path}: no signature by a trusted key (keys from {trusted.source}): "
                         f"{len(c.signatures)} signature(s), {unknown} by keys not trusted, {bad} "
                         "that do not verify (the signed bytes were changed), "
                         f"{other} signing another container")


def verify_file(path, trusted) -> str:
    """``mlpack verify``: every blob of the file checked against its digest, then ``check``."""
    with open_container(path) as c:
        return check(c, load_trusted_keys(trusted))


__all__ = ["keygen", "sign", "check", "verify_file", "load_trusted_keys", "load_signing_key",
           "key_id", "payload", "policy_spec", "TrustedKeys", "SIGNED_FORMAT_VERSION",
           "signature_tag", "signature_entry", "signed_members"]
