"""The mlpack container: one uncompressed POSIX ustar tar holding an OCI image layout.

This module writes format 1.1 and reads every 1.x (spec/SPEC.md is the full statement; media types and
annotation keys are in media.py). The bytes, in brief:

    tar (ustar, 512-byte blocks; sorted members; mtime 0, uid/gid 0, empty uname/gname,
         files 0644, directories 0755; ends with two zero blocks)
      blobs/  blobs/sha256/        directories
      blobs/sha256/<hex>          every blob, named by the sha256 of its bytes
      index.json                  OCI index, ONE entry: the nested index, tagged with
                                  org.opencontainers.image.ref.name; annotated with
                                  org.mlpack.format.version
      oci-layout                  {"imageLayoutVersion":"1.0.0"}

    nested index (a blob)   one OCI manifest descriptor per artifact, each with an OCI platform
                            (omitted for the portable artifact) and org.mlpack.* annotations
    manifest (a blob)       artifactType application/vnd.mlpack.artifact.v1; config = the config
                            JSON; layers in order: code, weights, test vectors (and any later
                            media types, which readers skip)

Every JSON document is written with sorted keys and compact separators, so the same model gives
the same bytes. Blob data starts on a 512-byte boundary of the file, which is why a reader can
hand out zero-copy views of an mmap (``Container.blob``). Digests are checked with plain chunked
reads, never through the mmap: touching mapped pages would count as resident memory, and a
runtime must open a model with 100 MB of weights without paying for them before the first run.

The tar reader is written here rather than taken from ``tarfile`` because it must be strict
(checksums, no links, no ``..``, no duplicates) and must raise a ``FormatError`` on every byte
sequence: it is the same algorithm the C engine implements, tested by the corpus in
``spec/conformance/``.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import mmap
import os
import re
import secrets
from dataclasses import dataclass, field
from typing import Callable

from mlpack.spec import jsondepth, media, sizes
from mlpack.spec.errors import (DigestError, FormatError, ManifestError, MediaTypeError,
                                MissingBlobError, NotAContainerError, TarError, TruncatedError,
                                VersionError)

BLOCK = 512
MAX_JSON = 64 << 20  # a JSON document larger than this is refused rather than read into memory
MAX_PAX = 1 << 20
MAX_TAR_SIZE = 8 ** 11 - 1  # the largest size an 11-digit octal ustar field holds (8 GiB - 1)
BLOB_DIR = "blobs/sha256/"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_REF_NAME = re.compile(r"[A-Za-z0-9]+(?:(?:[-._:@+]|--)[A-Za-z0-9]+)*(?:/[A-Za-z0-9]+(?:(?:[-._:@+]|--)"
                       r"[A-Za-z0-9]+)*)*")


# ================================================================ shared pieces


def is_digest(text) -> bool:
    """Whether ``text`` is a digest this format takes: ``sha256:`` and 64 lowercase hex."""
    return isinstance(text, str) and bool(_DIGEST.fullmatch(text))


def descriptor_config(ann: dict, format_version: str = media.FORMAT_VERSION_STR) -> dict:
    """The config fields selection reads, from a manifest descriptor's annotations alone (they
    copy the config's: spec/SPEC.md section 2): what is known of an artifact that was not
    fetched. The caller checks that the device and precision annotations are there."""
    sm = ann.get(media.ANN_CUDA_SM)
    return {"mlpack_format": format_version,
            "artifact": {"device": ann[media.ANN_DEVICE], "precision": ann[media.ANN_PRECISION],
                         "target": "(not pulled)", "cuda_sm": int(sm) if isinstance(sm, str) and sm.isdigit()
                         else None,
                         "cpu_features": [f for f in ann.get(media.ANN_CPU_FEATURES, "").split(",")
                                          if f]},
            "min_runtime": ann.get(media.ANN_MIN_RUNTIME, media.MIN_RUNTIME)}


def canonical_json(obj) -> bytes:
    """The one JSON serialization the format uses: sorted keys, compact, ASCII, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def digest_of(data) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _short(digest: str) -> str:
    return digest[:19] + "..." if len(digest) > 19 else digest


def parse_version(text, where: str) -> tuple[int, int]:
    """``"MAJOR.MINOR"`` as a pair; a newer major than ``media.FORMAT_VERSION`` is refused."""
    m = re.fullmatch(r"([0-9]{1,6})\.([0-9]{1,6})", text) if isinstance(text, str) else None
    if not m:
        raise ManifestError(f"{where}: format version {text!r} is not MAJOR.MINOR")
    version = (int(m.group(1)), int(m.group(2)))
    if version[0] > media.FORMAT_VERSION[0]:
        raise VersionError(f"{where}: format {text} is newer than this runtime reads "
                           f"({media.FORMAT_VERSION[0]}.x); upgrade mlpack")
    if version[0] < 1:
        raise ManifestError(f"{where}: format version {text} does not exist (the first is 1.0)")
    return version


# ================================================================ writing


@dataclass(frozen=True)
class FileBlob:
    """A blob whose bytes are a file, with their size and digest known: a model's weights
    archive, written once and copied into each container file as it is written (in the kernel,
    never through this process's memory)."""

    path: str
    size: int
    digest: str   # "sha256:<hex>"

    def __len__(self) -> int:
        return self.size


@dataclass
class Layer:
    """One layer of an artifact: its media type, its bytes (or a FileBlob), and optional
    descriptor annotations."""

    media_type: str
    data: bytes | FileBlob
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class ArtifactSpec:
    """What the writer needs for one artifact: the config document, the layers in order, the OCI
    platform (None for the portable artifact) and extra descriptor annotations (which override
    the ones derived from the config)."""

    config: dict
    layers: list[Layer]
    platform: dict | None = None
    annotations: dict[str, str] = field(default_factory=dict)


def signature(name: str, dtype: str, dims) -> dict:
    """A config SIG entry from ``dims`` as (name, size) pairs; size is an int, ``"$symbol"`` or
    (outputs) a size expression (spec/sizes.py)."""
    return {"name": name, "dtype": dtype, "dims": [{"name": d, "size": s} for d, s in dims]}


def make_config(model_name: str, inputs: list[dict], outputs: list[dict], *, device: str,
                precision: str, target: str, accuracy: dict, cpu_features=(), cuda_sm=None,
                plan: dict | None = None, min_runtime: str = media.MIN_RUNTIME) -> dict:
    """A config document (schemas/config.schema.json) from its parts."""
    return {"mlpack_format": media.FORMAT_VERSION_STR,
            "model": {"name": model_name, "inputs": inputs, "outputs": outputs},
            "artifact": {"device": device, "precision": precision, "target": target,
                         "cpu_features": list(cpu_features), "cuda_sm": cuda_sm},
            "accuracy": accuracy, "min_runtime": min_runtime, "plan": plan}


def _derived_annotations(spec: ArtifactSpec) -> dict[str, str]:
    """Descriptor annotations from the config, so a selector can rank artifacts without it."""
    art = spec.config.get("artifact") or {}
    acc = spec.config.get("accuracy") or {}
    plan = spec.config.get("plan")
    cuda = (plan.get("cuda") if isinstance(plan, dict) else None) or {}
    if art.get("device") != "cuda":
        cuda = {}
    found = {
        media.ANN_DEVICE: art.get("device"),
        media.ANN_PRECISION: art.get("precision"),
        media.ANN_CPU_FEATURES: ",".join(art.get("cpu_features") or []) or None,
        media.ANN_CUDA_SM: None if art.get("cuda_sm") is None else str(art["cuda_sm"]),
        media.ANN_MAX_ABS_ERROR: (None if acc.get("max_abs_error") is None
                                  else json.dumps(float(acc["max_abs_error"]))),
        media.ANN_MAX_ERROR: (None if acc.get("max_error") is None
                              else json.dumps(float(acc["max_error"]))),
        media.ANN_LATENCY: (None if not isinstance(spec.config.get("latency"), dict)
                            or spec.config["latency"].get("seconds") is None
                            else json.dumps(float(spec.config["latency"]["seconds"]))),
        media.ANN_MIN_RUNTIME: spec.config.get("min_runtime"),
        media.ANN_CUDA_PTX_ISA: cuda.get("ptx_isa"),
        media.ANN_CUDA_DRIVER: cuda.get("driver"),
    }
    out = {k: v for k, v in found.items() if v is not None}
    out.update(spec.annotations)
    return out


def _check_strings(d, what: str) -> None:
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in d.items()):
        raise ValueError(f"{what} must be a dict of str to str, got {d!r}")


def _check_specs(name: str, artifacts, annotations, tag: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError("the model name must be a non-empty string")
    if not _REF_NAME.fullmatch(tag):
        raise ValueError(f"tag {tag!r} is not a valid OCI reference name")
    if not artifacts:
        raise ValueError("a container needs at least one artifact (the portable one)")
    _check_strings(annotations, "container annotations")
    for i, a in enumerate(artifacts):
        if not isinstance(a.config, dict):
            raise ValueError(f"artifact {i}: config must be a dict")
        if a.platform is not None and not isinstance(a.platform, dict):
            raise ValueError(f"artifact {i}: platform must be a dict or None")
        _check_strings(a.annotations, f"artifact {i} annotations")
        for layer in a.layers:
            _check_strings(layer.annotations, f"artifact {i} layer {layer.media_type} annotations")


Edit = Callable[[str, object, int], object]


def _layout(name: str, artifacts: list[ArtifactSpec], annotations: dict[str, str], tag: str,
            edit: Edit | None = None) -> list[tuple[str, bytes | None]]:
    """The tar members (name, bytes; None for a directory) of a container, sorted by name.

    ``edit(kind, doc, i)`` may change each JSON document before it is serialized and hashed
    (kind: config, manifest, nested, index, oci-layout; i: the artifact or -1), returning the
    document or raw bytes. Only the conformance generator uses it, to make broken containers
    whose digests are still right.
    """
    blobs: dict[str, bytes | FileBlob] = {}
    digests: dict[int, tuple] = {}   # id -> (data, digest): a blob several artifacts share

    def doc(kind, obj, i=-1) -> bytes:
        obj = edit(kind, copy.deepcopy(obj), i) if edit else obj
        return obj if isinstance(obj, bytes) else canonical_json(obj)

    def put(data, media_type: str, annotations=None) -> dict:
        if isinstance(data, FileBlob):
            d = data.digest
        else:
            if id(data) not in digests:
                digests[id(data)] = (data, digest_of(data))
            d = digests[id(data)][1]
        blobs[d] = data
        out = {"mediaType": media_type, "digest": d, "size": len(data)}
        return {**out, "annotations": dict(annotations)} if annotations else out

    entries = []
    for i, a in enumerate(artifacts):
        manifest = {"schemaVersion": 2, "mediaType": media.OCI_MANIFEST,
                    "artifactType": media.ARTIFACT_TYPE,
                    "config": put(doc("config", a.config, i), media.CONFIG),
                    "layers": [put(layer.data, layer.media_type, layer.annotations)
                               for layer in a.layers]}
        entry = put(doc("manifest", manifest, i), media.OCI_MANIFEST, _derived_annotations(a))
        if a.platform is not None:
            entry["platform"] = dict(a.platform)
        entries.append(entry)
    nested = {"schemaVersion": 2, "mediaType": media.OCI_INDEX, "manifests": entries,
              "annotations": {**annotations, media.ANN_FORMAT_VERSION: media.FORMAT_VERSION_STR,
                              media.ANN_MODEL_NAME: name}}
    top = put(doc("nested", nested), media.OCI_INDEX, {media.REF_NAME: tag})
    index = {"schemaVersion": 2, "mediaType": media.OCI_INDEX, "manifests": [top],
             "annotations": {media.ANN_FORMAT_VERSION: media.FORMAT_VERSION_STR}}
    layout = {"imageLayoutVersion": media.OCI_LAYOUT_VERSION}
    members = {"blobs/": None, BLOB_DIR: None, "index.json": doc("index", index),
               "oci-layout": doc("oci-layout", layout)}
    members.update({BLOB_DIR + d.split(":", 1)[1]: data for d, data in blobs.items()})
    return sorted(members.items())


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def tar_header(name: str, size: int, typeflag: bytes = b"0", mode: int | None = None) -> bytes:
    """One ustar header with the format's fixed metadata (mtime 0, uid/gid 0, no user names)."""
    raw, prefix = name.encode(), b""
    if len(raw) > 100:  # split at a slash into prefix (155) + name (100)
        cut = raw.rfind(b"/", 0, 156)
        if cut <= 0 or len(raw) - cut - 1 > 100:
            raise ValueError(f"member name {name!r} does not fit a ustar header")
        prefix, raw = raw[:cut], raw[cut + 1:]
    if size > MAX_TAR_SIZE:
        raise ValueError(f"member {name!r} is {size} bytes; ustar holds at most {MAX_TAR_SIZE}")
    mode = mode if mode is not None else (0o755 if typeflag == b"5" else 0o644)
    h = bytearray(BLOCK)
    h[0:len(raw)] = raw
    h[100:108], h[108:116], h[116:124] = _octal(mode, 8), _octal(0, 8), _octal(0, 8)
    h[124:136], h[136:148] = _octal(size, 12), _octal(0, 12)
    h[148:156] = b" " * 8  # the checksum is summed with its own field as spaces
    h[156:157] = typeflag
    h[257:265] = b"ustar\x0000"
    h[345:345 + len(prefix)] = prefix
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def write_tar(f, members) -> None:
    """Write (name, bytes | FileBlob | None) members as a ustar stream; None makes a directory."""
    for name, data in members:
        if data is None:
            f.write(tar_header(name, 0, b"5"))
            continue
        f.write(tar_header(name, len(data)))
        if isinstance(data, FileBlob):
            _copy_file(f, data)
        else:
            f.write(data)
        f.write(b"\0" * (-len(data) % BLOCK))
    f.write(b"\0" * (2 * BLOCK))


def _copy_file(f, blob: FileBlob) -> None:
    """The bytes of ``blob`` appended to the binary file ``f``: copied by the kernel where it
    can (copy_file_range), else read in chunks; a file that is not ``blob.size`` bytes long
    is refused (it was changed since its digest was taken)."""
    with open(blob.path, "rb") as src:
        if os.fstat(src.fileno()).st_size != blob.size:
            raise OSError(f"{blob.path}: is not the {blob.size}-byte blob {blob.digest}")
        left = blob.size
        if hasattr(os, "copy_file_range") and hasattr(f, "fileno"):
            f.flush()
            try:
                while left:
                    n = os.copy_file_range(src.fileno(), f.fileno(), min(left, 1 << 30))
                    if n <= 0:
                        break
                    left -= n
            except OSError:   # (not between these file systems: copy the rest by hand)
                pass
        src.seek(blob.size - left)
        while left:
            chunk = src.read(min(left, 1 << 24))
            if not chunk:
                raise OSError(f"{blob.path}: ended before its {blob.size} bytes")
            f.write(chunk)
            left -= len(chunk)


def _open_temp(path: str):
    """A new file PATH.tmp-XXXXXXXX next to ``path`` (same file system, so os.replace is atomic)."""
    for _ in range(100):
        tmp = f"{path}.tmp-{secrets.token_hex(4)}"
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
    raise OSError(f"could not create a temporary file next to {path}")


def write_file_atomic(path, members, durable: bool = True) -> None:
    """Write the tar to a temporary file and rename it over ``path``; on failure, nothing remains.
    ``durable``: on the disk (fsync) before the rename; False for a file read back at once and
    removed (a build's container under validation)."""
    path = os.fspath(path)
    tmp, fd = _open_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write_tar(f, members)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_container(path, name: str, artifacts: list[ArtifactSpec],
                    annotations: dict[str, str] | None = None, *, tag: str = "latest",
                    durable: bool = True) -> None:
    """Write a container (deterministic bytes; atomic). ``name`` is the model name
    (org.mlpack.model.name); ``tag`` the reference name on index.json's entry; ``annotations``
    go on the nested index; ``durable``: fsync'd before it appears (write_file_atomic)."""
    annotations = dict(annotations or {})
    _check_specs(name, artifacts, annotations, tag)
    write_file_atomic(path, _layout(name, list(artifacts), annotations, tag), durable)


# ================================================================ reading: the tar


@dataclass(frozen=True)
class _Member:
    name: str
    offset: int  # of the data, a multiple of 512
    size: int
    is_dir: bool


def _pread(f, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` (fewer at the end of the file); the file position is left
    alone, so readers on several threads do not disturb each other."""
    if not hasattr(f, "fileno") or isinstance(f, io.BytesIO):   # bytes in memory (tests, corpus)
        return f.getvalue()[offset:offset + size]
    fd, parts = f.fileno(), []
    while size > 0:
        chunk = os.pread(fd, min(size, 1 << 30), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(parts) if len(parts) != 1 else parts[0]


def _tar_number(raw: bytes, what: str, where: str) -> int:
    if raw[:1] and raw[0] & 0x80:
        raise TarError(f"{where}: {what} field uses base-256, which this format does not allow")
    text = raw.split(b"\0", 1)[0].strip(b" ")
    if not text or any(c not in b"01234567" for c in text):
        raise TarError(f"{where}: {what} field {raw!r} is not an octal number")
    return int(text, 8)


def _member_name(block: bytes, where: str) -> str:
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX: a prefix field extends the name
        prefix = block[345:500].split(b"\0", 1)[0]
        name = prefix + b"/" + name if prefix else name
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        raise TarError(f"{where}: member name {name!r} is not UTF-8") from None


def _safe_name(name: str, where: str) -> str | None:
    """The normalized member name; None for the archive root ("./"); refuses unsafe names."""
    if not name:
        raise TarError(f"{where}: member name is empty")
    if name.startswith("/"):
        raise TarError(f"{where}: member name {name!r} is an absolute path")
    parts = name.split("/")
    if ".." in parts:
        raise TarError(f"{where}: member name {name!r} contains '..'")
    if parts[0] == ".":  # "./index.json", as `tar -C dir -cf x .` writes
        parts = parts[1:]
    if parts and parts[-1] == "":  # a directory's trailing slash
        parts = parts[:-1]
    if not parts:
        return None
    if "" in parts or "." in parts:
        raise TarError(f"{where}: member name {name!r} is not a normalized path")
    return "/".join(parts)


def _check_pax(data: bytes, where: str) -> None:
    """Pax records are skipped, except the ones that would change how we read the next member."""
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos, pos + 20)
        length_text = data[pos:space] if space > pos else b""
        if not length_text.isdigit() or int(length_text) <= space - pos + 1:
            raise TarError(f"{where}: malformed pax record at byte {pos} of the pax header")
        end = pos + int(length_text)
        record = data[space + 1:end]
        if end > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise TarError(f"{where}: malformed pax record at byte {pos} of the pax header")
        key = record.split(b"=", 1)[0]
        if key in (b"path", b"linkpath", b"size") or key.startswith(b"GNU."):
            raise TarError(f"{where}: pax header sets {key.decode('ascii', 'replace')!r}, "
                           "which this format does not allow")
        pos = end


_LINK_TYPES = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device",
               b"4": "a block device", b"6": "a FIFO"}


def _checksum_ok(block: bytes, stored: int) -> bool:
    blank = block[:148] + b" " * 8 + block[156:]
    signed = sum(b - 256 if b > 127 else b for b in blank)
    return stored in (sum(blank), signed)


def _read_header(block: bytes, pos: int, path: str):
    """(name or None, typeflag, size) of the header ``block`` at byte ``pos``."""
    where = f"{path}: tar header at byte {pos}"
    if block[257:263] not in (b"ustar\0", b"ustar "):
        if pos == 0:
            raise NotAContainerError(f"{path} is not a tar archive (no ustar header at its start); "
                                     "an mlpack container is an uncompressed ustar tar")
        raise TarError(f"{where} is not a ustar header")
    stored = _tar_number(block[148:156], "checksum", where)
    raw_name = _member_name(block, where)
    if not _checksum_ok(block, stored):
        raise TarError(f"{where} (member {raw_name!r}) has a bad tar header checksum")
    size = _tar_number(block[124:136], "size", f"{where} (member {raw_name!r})")
    return raw_name, block[156:157], size


def scan_tar(f, path: str, file_size: int) -> dict[str, _Member]:
    """Every member of the tar in ``f``, by normalized name; strict (see the module docstring)."""
    members: dict[str, _Member] = {}
    pos = 0
    while True:
        if pos + BLOCK > file_size:
            if pos == 0:
                raise NotAContainerError(f"{path} ({file_size} bytes) is too short to be a tar "
                                         "archive; an mlpack container is an uncompressed tar")
            raise TruncatedError(f"{path}: truncated tar: the file ends at byte {file_size}, "
                                 "before the end-of-archive marker")
        block = _pread(f, pos, BLOCK)
        if block == bytes(BLOCK):
            _check_end(f, pos, path, file_size)
            return members
        raw_name, typeflag, size = _read_header(block, pos, path)
        data = pos + BLOCK
        if size > file_size - data:
            raise TruncatedError(f"{path}: truncated tar: member {raw_name!r} declares {size} bytes "
                                 f"but the file ends {file_size - data} bytes after its header")
        _add_member(f, members, raw_name, typeflag, data, size, f"{path}: tar header at byte {pos}")
        pos = data + (size + BLOCK - 1) // BLOCK * BLOCK


def _check_end(f, pos: int, path: str, file_size: int) -> None:
    if pos + 2 * BLOCK > file_size:
        raise TruncatedError(f"{path}: truncated tar: the end-of-archive marker at byte {pos} "
                             "is cut short")
    if _pread(f, pos + BLOCK, BLOCK) != bytes(BLOCK):
        raise TarError(f"{path}: tar has a lone zero block at byte {pos} followed by data")


def _add_member(f, members, raw_name, typeflag, data, size, where) -> None:
    if typeflag in (b"x", b"g"):
        if size > MAX_PAX:
            raise TarError(f"{where}: pax header of {size} bytes is larger than allowed")
        _check_pax(_pread(f, data, size), where)
        return
    if typeflag in _LINK_TYPES:
        raise TarError(f"{where}: member {raw_name!r} is {_LINK_TYPES[typeflag]}; a container "
                       "holds only regular files and directories")
    if typeflag not in (b"0", b"\0", b"5"):
        raise TarError(f"{where}: member {raw_name!r} has unsupported tar type {typeflag!r}")
    name = _safe_name(raw_name, where)
    if name is None:
        return
    if name in members:
        raise TarError(f"{where}: duplicate tar member {name!r}")
    members[name] = _Member(name, data, size, typeflag == b"5")


# ================================================================ reading: the documents


@dataclass(frozen=True)
class Signature:
    """One signature of the container (format 1.2): cosign's simple-signing ``payload`` (the
    verified bytes) and the base64 Ed25519 ``signature`` of them, from the signature manifest
    ``manifest``; ``key`` is the signer's key id when the signer recorded it."""

    manifest: str
    signature: str
    key: str | None
    payload: bytes = field(repr=False)


@dataclass(frozen=True)
class LayerRef:
    """A layer of an artifact: where its verified bytes lie in the file."""

    media_type: str
    digest: str
    size: int
    offset: int  # byte offset of the blob in the container file (a multiple of 512)
    annotations: dict = field(default_factory=dict, compare=False)


@dataclass
class Artifact:
    """One artifact (one manifest) of a container, as read and checked."""

    index: int
    descriptor: dict  # the nested index's entry: mediaType, digest, size, platform, annotations
    manifest: dict
    config: dict
    layers: list[LayerRef]
    # False in a partial container (media.ANN_PARTIAL) for an artifact that was not pulled: no
    # manifest, no layers, and a config holding only what the descriptor's annotations say
    present: bool = True

    @property
    def platform(self) -> dict | None:
        return self.descriptor.get("platform")

    @property
    def annotations(self) -> dict:
        return self.descriptor.get("annotations") or {}

    @property
    def device(self) -> str:
        return self.config["artifact"]["device"]

    @property
    def precision(self) -> str:
        return self.config["artifact"]["precision"]

    def layer(self, media_type: str) -> LayerRef | None:
        """The first layer of that media type, or None."""
        return next((layer for layer in self.layers if layer.media_type == media_type), None)


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"duplicate key {dup!r}")
    return dict(pairs)


def _bad_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_json(data: bytes, where: str) -> dict:
    """A JSON object, strictly: UTF-8, no duplicate keys, no NaN/Infinity, nested at most 512
    levels deep (as the C engine's parser: spec/jsondepth.py)."""
    deep = jsondepth.too_deep(data)
    if deep is not None:
        raise ManifestError(f"{where} is not valid JSON: nested too deeply at byte {deep}")
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates,
                         parse_constant=_bad_constant)
    except (ValueError, RecursionError) as e:
        raise ManifestError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{where} is not a JSON object")
    return doc


def _field(doc: dict, key: str, kind, where: str, required: bool = True):
    if key not in doc or doc[key] is None:
        if required:
            raise ManifestError(f"{where}: required field {key!r} is missing")
        return None
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _string_map(doc: dict, key: str, where: str) -> dict:
    value = _field(doc, key, dict, where, required=False) or {}
    if not all(isinstance(v, str) for v in value.values()):
        raise ManifestError(f"{where}: every value of {key!r} must be a string")
    return value


def _check_sig(sig, where: str, output: bool) -> None:
    if not isinstance(sig, dict):
        raise ManifestError(f"{where}: a signature entry must be an object")
    name = _field(sig, "name", str, where)
    _field(sig, "dtype", str, where)
    for d in _field(sig, "dims", list, where):
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: a dim must be an object")
        dim = _field(d, "name", str, where)
        size = d.get("size")
        try:
            parsed = sizes.parse_size(size)
        except ValueError as e:
            raise ManifestError(f"{where} {name!r} dim {dim!r}: size {size!r} is neither a count, "
                                f"a '$symbol' nor a size expression ({e})") from None
        if sizes.is_expression(parsed) and not output:
            raise ManifestError(f"{where} {name!r} dim {dim!r}: size {size!r} is an expression; "
                                "an input dim is a count or a '$symbol'")


def check_config(cfg: dict, where: str) -> tuple[int, int]:
    """The required fields of a config document (schemas/config.schema.json); its version."""
    version = parse_version(_field(cfg, "mlpack_format", str, where), f"{where} mlpack_format")
    model = _field(cfg, "model", dict, where)
    _field(model, "name", str, f"{where} model")
    for key in ("inputs", "outputs"):
        for sig in _field(model, key, list, f"{where} model"):
            _check_sig(sig, f"{where} model.{key}", key == "outputs")
    art = _field(cfg, "artifact", dict, where)
    _field(art, "device", str, f"{where} artifact")
    _field(art, "precision", str, f"{where} artifact")
    _field(art, "target", str, f"{where} artifact")
    features = _field(art, "cpu_features", list, f"{where} artifact", required=False) or []
    if not all(isinstance(x, str) for x in features):
        raise ManifestError(f"{where} artifact: cpu_features must be strings")
    acc = _field(cfg, "accuracy", dict, where)
    # 1.0's rtol/atol and max_rel_error; 1.1's errors against the float64 reference
    for key in ("max_abs_error", "max_rel_error", "rtol", "atol", "max_error", "rel_l2",
                "baseline_max_error", "top1"):
        _field(acc, key, (int, float), f"{where} accuracy", required=False)
    for key in ("tolerance", "outputs"):
        _field(acc, key, dict, f"{where} accuracy", required=False)
    _field(cfg, "min_runtime", str, where)
    _field(cfg, "plan", dict, where, required=False)
    return version


class Container:
    """An open container: its documents parsed and checked, its blobs verified, the file mapped.

    Use as a context manager or call ``close()``. Views from ``blob`` keep the map alive; while any
    exists, ``close`` leaves the map to the garbage collector instead of failing.
    """

    def __init__(self, path: str, verify: bool):
        self.path = path
        self.verify = verify
        try:
            self._file = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by close())
        except OSError as e:
            raise FormatError(f"cannot open container {path}: {e.strerror}") from None
        self._map = None
        self._verified: set[str] = set()
        try:
            self.file_size = os.fstat(self._file.fileno()).st_size
            if self.file_size == 0:
                raise NotAContainerError(f"{path} is empty (0 bytes), not an mlpack container")
            self._members = scan_tar(self._file, path, self.file_size)
            self._read_documents()
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            self._file.close()
            raise

    # ---- documents

    def _member(self, name: str) -> _Member:
        m = self._members.get(name)
        if m is None or m.is_dir:
            raise MissingBlobError(f"{self.path}: the archive has no {name!r}; "
                                   "not an mlpack container")
        return m

    def _json_member(self, m: _Member, where: str) -> dict:
        if m.size > MAX_JSON:
            raise ManifestError(f"{where} is {m.size} bytes, larger than a JSON document may be")
        return parse_json(_pread(self._file, m.offset, m.size), where)

    def _read_documents(self) -> None:
        p = self.path
        layout = self._json_member(self._member("oci-layout"), f"{p}: oci-layout")
        _field(layout, "imageLayoutVersion", str, f"{p}: oci-layout")
        index = self._json_member(self._member("index.json"), f"{p}: index.json")
        where = f"{p}: index.json"
        version = _string_map(index, "annotations", where).get(media.ANN_FORMAT_VERSION)
        if version is None:
            raise ManifestError(f"{where}: annotation {media.ANN_FORMAT_VERSION!r} is missing; "
                                "not an mlpack container")
        self.format_version = parse_version(version, f"{where} {media.ANN_FORMAT_VERSION}")
        self.partial = _string_map(index, "annotations", where).get(media.ANN_PARTIAL) == "true"
        self._check_doc_type(index, media.OCI_INDEX, where)
        entries = _field(index, "manifests", list, where)
        self.index = index
        # one nested index, then (1.2) signature manifests: what each entry is, before reading
        signed = [isinstance(e, dict) and e.get("mediaType") == media.OCI_MANIFEST
                  and e.get("artifactType") == media.SIGNATURE_ARTIFACT_TYPE for e in entries]
        nested = [i for i, s in enumerate(signed) if not s]
        if len(nested) != 1:
            raise ManifestError(f"{where}: lists {len(nested)} entries besides signatures; an "
                                "mlpack container has exactly one (the nested index)")
        w = f"{where} manifests[{nested[0]}]"
        entry = self._descriptor(entries[nested[0]], media.OCI_INDEX, w)
        # index.json is covered by no digest: what it must say is checked, not assumed
        self.tag = _string_map(entry, "annotations", w).get(media.REF_NAME)
        if self.tag is None:
            raise ManifestError(f"{w}: annotation {media.REF_NAME!r} (the tag) is missing")
        self.nested_digest = entry["digest"]
        self._read_nested(entry)
        self.signatures: list[Signature] = []
        for i, s in enumerate(signed):
            if s:
                self._read_signature(entries[i], f"{where} manifests[{i}]")

    def _read_signature(self, entry, w: str) -> None:
        """A signature manifest (spec/SPEC.md section 9): structure only; whether it verifies,
        and under which key, is spec/signing.py's (only a trust policy asks)."""
        desc = self._descriptor(entry, media.OCI_MANIFEST, w)
        where = f"{self.path}: signature manifest {_short(desc['digest'])}"
        manifest = self._json_blob(desc, where)
        self._check_doc_type(manifest, media.OCI_MANIFEST, where)
        kind = _field(manifest, "artifactType", str, where)
        if kind != media.SIGNATURE_ARTIFACT_TYPE:
            raise MediaTypeError(f"{where}: artifactType is {kind!r}, expected "
                                 f"{media.SIGNATURE_ARTIFACT_TYPE!r}")
        self._descriptor(_field(manifest, "config", dict, where), None, f"{where} config")
        subject = self._descriptor(_field(manifest, "subject", dict, where), media.OCI_INDEX,
                                   f"{where} subject")
        if subject["digest"] != self.nested_digest:
            raise ManifestError(f"{where}: refers to {_short(subject['digest'])}, not this "
                                f"container's nested index {self.nested_digest}")
        layers = _field(manifest, "layers", list, where)
        if not layers:
            raise ManifestError(f"{where}: has no signature layer")
        for j, layer in enumerate(layers):
            lw = f"{where} layers[{j}]"
            d = self._descriptor(layer, None, lw)
            if d["mediaType"] != media.SIGNATURE_PAYLOAD:
                raise MediaTypeError(f"{lw}: mediaType is {d['mediaType']!r}, expected "
                                     f"{media.SIGNATURE_PAYLOAD!r}")
            ann = _string_map(d, "annotations", lw)
            if media.ANN_SIGNATURE not in ann:
                raise ManifestError(f"{lw}: annotation {media.ANN_SIGNATURE!r} (the signature) "
                                    "is missing")
            self.signatures.append(Signature(desc["digest"], ann[media.ANN_SIGNATURE],
                                             ann.get(media.ANN_SIGNATURE_KEY),
                                             self.read_verified(d["digest"], lw, MAX_JSON)))

    def _check_doc_type(self, doc: dict, media_type: str, where: str) -> None:
        found = _field(doc, "mediaType", str, where, required=False)
        if found is not None and found != media_type:
            raise MediaTypeError(f"{where}: mediaType is {found!r}, expected {media_type!r}")

    def _read_nested(self, entry: dict) -> None:
        where = f"{self.path}: nested index {_short(entry['digest'])}"
        nested = self._json_blob(entry, where)
        self.annotations = _string_map(nested, "annotations", where)
        if media.ANN_FORMAT_VERSION not in self.annotations:
            raise ManifestError(f"{where}: annotation {media.ANN_FORMAT_VERSION!r} is missing")
        parse_version(self.annotations[media.ANN_FORMAT_VERSION], f"{where} {media.ANN_FORMAT_VERSION}")
        self._check_doc_type(nested, media.OCI_INDEX, where)
        self.name = self.annotations.get(media.ANN_MODEL_NAME)
        if self.name is None:
            raise ManifestError(f"{where}: annotation {media.ANN_MODEL_NAME!r} is missing")
        descs = _field(nested, "manifests", list, where)
        if not descs:
            raise ManifestError(f"{where}: lists zero artifacts; a container needs at least one")
        self.artifacts = [self._read_artifact(i, d, f"{where} manifests[{i}]")
                          for i, d in enumerate(descs)]
        if not any(a.present for a in self.artifacts):
            raise MissingBlobError(f"{where}: a partial container holding none of its "
                                   f"{len(descs)} artifacts")

    def _read_artifact(self, i: int, desc, where: str) -> Artifact:
        if self.partial and self._absent(desc):
            return self._absent_artifact(i, desc, where)
        desc = self._descriptor(desc, media.OCI_MANIFEST, where)
        _field(desc, "platform", dict, where, required=False)
        annotations = _string_map(desc, "annotations", where)
        where = f"{self.path}: manifest {_short(desc['digest'])} (artifact {i})"
        manifest = self._json_blob(desc, where)
        self._check_doc_type(manifest, media.OCI_MANIFEST, where)
        kind = _field(manifest, "artifactType", str, where)
        if kind != media.ARTIFACT_TYPE:
            raise MediaTypeError(f"{where}: artifactType is {kind!r}, expected {media.ARTIFACT_TYPE!r}")
        cdesc = self._descriptor(_field(manifest, "config", dict, where), media.CONFIG, f"{where} config")
        cwhere = f"{self.path}: config {_short(cdesc['digest'])} (artifact {i})"
        config = self._json_blob(cdesc, cwhere)
        check_config(config, cwhere)
        layers = [self._layer(d, f"{where} layers[{j}]")
                  for j, d in enumerate(_field(manifest, "layers", list, where))]
        for key, value in ((media.ANN_DEVICE, config["artifact"]["device"]),
                           (media.ANN_PRECISION, config["artifact"]["precision"])):
            if annotations.get(key, value) != value:
                raise ManifestError(f"{where}: annotation {key}={annotations[key]!r} disagrees "
                                    f"with its config ({value!r})")
        return Artifact(i, desc, manifest, config, layers)

    def _absent(self, desc) -> bool:
        """A descriptor whose manifest is not in the file (only allowed when partial)."""
        digest = desc.get("digest") if isinstance(desc, dict) else None
        return is_digest(digest) and self._members.get(BLOB_DIR + digest.split(":", 1)[1]) is None

    def _absent_artifact(self, i: int, desc, where: str) -> Artifact:
        """An artifact a partial pull left out: known by its descriptor alone (selection reads
        the annotations, which copy the config's fields; spec/SPEC.md section 2)."""
        found = _field(desc, "mediaType", str, where)
        if found != media.OCI_MANIFEST:
            raise MediaTypeError(f"{where}: mediaType is {found!r}, expected {media.OCI_MANIFEST!r}")
        _field(desc, "platform", dict, where, required=False)
        ann = _string_map(desc, "annotations", where)
        for key in (media.ANN_DEVICE, media.ANN_PRECISION):
            if key not in ann:
                raise ManifestError(f"{where}: not in this partial container and without the "
                                    f"annotation {key!r}")
        return Artifact(i, desc, {}, descriptor_config(ann), [], present=False)

    def _layer(self, desc, where: str) -> LayerRef:
        desc = self._descriptor(desc, None, where)
        if self.verify:
            self._verify(desc["digest"], where)
        m = self._blob_member(desc["digest"], where)
        return LayerRef(desc["mediaType"], desc["digest"], desc["size"], m.offset,
                        _string_map(desc, "annotations", where))

    # ---- descriptors and blobs

    def _descriptor(self, desc, media_type: str | None, where: str) -> dict:
        """Check an OCI descriptor: fields, media type, and that its blob exists with its size."""
        if not isinstance(desc, dict):
            raise ManifestError(f"{where}: a descriptor must be a JSON object")
        found = _field(desc, "mediaType", str, where)
        if media_type is not None and found != media_type:
            raise MediaTypeError(f"{where}: mediaType is {found!r}, expected {media_type!r}")
        digest = _field(desc, "digest", str, where)
        size = _field(desc, "size", int, where)
        if not is_digest(digest):
            raise ManifestError(f"{where}: digest {digest[:80]!r} is not 'sha256:' and 64 lowercase hex")
        if size < 0:
            raise ManifestError(f"{where}: size {size} is negative")
        if size > self.file_size:
            raise DigestError(f"{where}: declares blob {_short(digest)} of {size} bytes, "
                              f"larger than the whole file ({self.file_size} bytes)")
        m = self._blob_member(digest, where)
        if m.size != size:
            raise DigestError(f"{where}: blob {_short(digest)} is {m.size} bytes in the archive "
                              f"but its descriptor declares {size}")
        return desc

    def _blob_member(self, digest: str, where: str) -> _Member:
        m = self._members.get(BLOB_DIR + digest.split(":", 1)[1])
        if m is None or m.is_dir:
            raise MissingBlobError(f"{where}: blob {_short(digest)} is missing from the archive")
        return m

    def _json_blob(self, desc: dict, where: str) -> dict:
        m = self._blob_member(desc["digest"], where)
        if m.size > MAX_JSON:
            raise ManifestError(f"{where} is {m.size} bytes, larger than a JSON document may be")
        data = self.read_verified(desc["digest"], where)   # always verified: they are read
        self._verified.add(desc["digest"])
        return parse_json(data, where)

    def _verify(self, digest: str, where: str) -> None:
        """Hash a blob with chunked reads (never through the mmap, which would make it resident)."""
        if digest in self._verified:
            return
        m = self._blob_member(digest, where)
        h, buf = hashlib.sha256(), bytearray(1 << 20)
        view, offset, left = memoryview(buf), m.offset, m.size
        self._file.seek(offset)
        while left:
            n = self._file.readinto(view[:min(left, len(buf))])
            if not n:
                raise TruncatedError(f"{where}: blob {_short(digest)} ends early (file changed?)")
            h.update(view[:n])
            left -= n
        if "sha256:" + h.hexdigest() != digest:
            raise DigestError(f"{where}: blob {_short(digest)} does not match its digest")
        self._verified.add(digest)

    # ---- public

    def read_verified(self, digest: str, where: str = "", limit: int | None = None) -> bytes:
        """A blob's bytes read into memory once and checked against its digest: what an executor
        loads is then exactly what was hashed, whatever happens to the file meanwhile."""
        where = where or self.path
        m = self._blob_member(digest, where)
        if limit is not None and m.size > limit:
            raise ManifestError(f"{where}: blob {_short(digest)} is {m.size} bytes, more than "
                                f"{limit}")
        data = _pread(self._file, m.offset, m.size)
        if digest_of(data) != digest:
            raise DigestError(f"{where}: blob {_short(digest)} does not match its digest")
        return data

    def fileno(self) -> int:
        """The open file's descriptor: the C engine reads the same file through it (a dup), never
        the path again."""
        return self._file.fileno()

    def member_names(self) -> list[str]:
        """Every member of the tar, by name (directories end with '/', as the writer names them)."""
        return sorted(n + "/" if m.is_dir else n for n, m in self._members.items())

    def member_bytes(self, name: str) -> memoryview | None:
        """A member's bytes, a view of the map (None for a directory): what rewriting the file
        (spec/signing.py) copies."""
        m = self._members[name.rstrip("/")]
        if m.is_dir:
            return None
        if self._map is None:
            raise ValueError(f"{self.path}: container is closed")
        return memoryview(self._map)[m.offset:m.offset + m.size]

    def json_blob(self, digest: str) -> dict:
        """A JSON blob, read, verified and parsed (a manifest, say)."""
        where = f"{self.path}: blob {_short(digest)}"
        return parse_json(self.read_verified(digest, where, MAX_JSON), where)

    def blob(self, digest: str) -> memoryview:
        """A zero-copy, read-only view of a blob's bytes in the mapped file."""
        if self._map is None:
            raise ValueError(f"{self.path}: container is closed")
        if not is_digest(digest):
            raise MissingBlobError(f"{self.path}: {digest!r} is not a sha256 digest")
        m = self._blob_member(digest, self.path)
        return memoryview(self._map)[m.offset:m.offset + m.size]

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # views from blob() are alive; the map closes when they die
                pass
            self._map = None
        self._file.close()

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        v = ".".join(map(str, self.format_version))
        return f"<Container {self.path!r} {self.name!r} format {v}, {len(self.artifacts)} artifacts>"


def open_container(path, verify: bool = True) -> Container:
    """Open and check a container. Raises a ``FormatError`` subclass naming the file and the member
    or field at fault. ``verify=False`` skips hashing the layers (JSON documents are always
    verified); sizes and structure are still checked."""
    return Container(os.fspath(path), verify)


__all__ = ["Layer", "ArtifactSpec", "LayerRef", "Artifact", "Container", "FormatError",
           "write_container", "open_container", "make_config", "signature", "canonical_json", "FileBlob",
           "is_digest", "descriptor_config"]
