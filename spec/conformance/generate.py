"""Write the container conformance corpus: ``python -m mlpack.spec.conformance.generate [DIR]``.

Each case is a small container, valid or broken in exactly one way, and ``expected.json`` maps its
file name to the verdict a reader must give:

    {"ok_minimal.mlpack": {"verdict": "ok"},
     "err_empty.mlpack": {"verdict": "error", "error": "NotAContainerError",
                          "message_contains": "empty"}, ...}

``error`` names a FormatError subclass of spec/errors.py (the C engine maps each to a status
code); ``message_contains`` is a fragment of the message. Verdicts are about the container only:
the payloads (program, code) are tiny fakes, never executed. Broken containers whose fault lies
in a JSON document are made through the writer's ``edit`` hook, so every digest around the fault
is still right and the reader must find the fault itself, not a digest mismatch. Output is
deterministic: running this twice gives the same bytes (tests/spec/test_conformance.py checks
the committed files against a fresh run).
"""

from __future__ import annotations

import io
import json
import os
import sys

import numpy as np

from mlpack.spec import container as c
from mlpack.spec import media as m
from mlpack.spec.tensorfile import write_tensors

HERE = os.path.dirname(os.path.abspath(__file__))
UNKNOWN_LAYER = "application/vnd.mlpack.code.future.v9"


# ---------------------------------------------------------------- a plausible tiny model


def _program() -> bytes:
    """A portable program for y = relu(x + b) (spec/ir/program.py's shape; never executed here)."""
    dims = [["n", "$batch"], ["c", 4]]
    body = ["max", ["add", ["r", "x", ["n", "c"], [["v", "n"], ["v", "c"]], 0],
                    ["r", "b", ["c"], [["v", "c"]], 0]], ["c", 0.0, "f32"]]
    prog = {"program": "mlpack.portable", "version": [1, 0], "name": "tiny",
            "inputs": [{"name": "x", "dtype": "f32", "dims": dims}],
            "constants": [{"name": "b", "dtype": "f32", "dims": [["c", 4]]}],
            "ops": [{"out": "y", "dtype": "f32", "dims": dims, "body": body}],
            "outputs": [{"name": "y", "layout": ["n", "c"]}]}
    return c.canonical_json(prog)


def _weights(dtype=np.float32) -> bytes:
    return write_tensors({"b": np.arange(4, dtype=dtype)})


def _testvectors() -> bytes:
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    y = np.maximum(x + np.arange(4, dtype=np.float32), 0)
    return write_tensors({"case0/input/x": x, "case0/output/y": y}, {"cases": 1, "reference": "numpy"})


def _config(device: str, precision: str, target: str, features=(), cuda_sm=None, err=0.0) -> dict:
    dims = [("batch", "$batch"), ("c", 4)]
    acc = {"reference": "onnxruntime 1.18.0", "max_abs_error": err, "max_rel_error": err,
           "rtol": 1e-5, "atol": 1e-6}
    return c.make_config("tiny", [c.signature("x", "f32", dims)], [c.signature("y", "f32", dims)],
                         device=device, precision=precision, target=target, accuracy=acc,
                         cpu_features=features, cuda_sm=cuda_sm)


def _artifact(device, precision, target, code: c.Layer, **kw) -> c.ArtifactSpec:
    weights = _weights(np.float16 if precision == "fp16" else np.float32)
    layers = [code, c.Layer(m.WEIGHTS, weights), c.Layer(m.TESTVECTORS, _testvectors())]
    return c.ArtifactSpec(_config(device, precision, target, **kw), layers, m.platform_for(target))


def portable() -> c.ArtifactSpec:
    return _artifact("portable", "fp32", "portable", c.Layer(m.PROGRAM_PORTABLE, _program()))


def multi() -> list[c.ArtifactSpec]:
    """Portable, x86-64 v3, aarch64 (fp32 and fp16) and cuda: shared weights, one per precision."""
    elf = c.Layer(m.CODE_ELF, b"\x7fELF fake x86_64-v3 kernels")
    arm = c.Layer(m.CODE_ELF, b"\x7fELF fake aarch64 kernels")
    cuda = _artifact("cuda", "fp32", "cuda", c.Layer(m.CODE_PTX, b"// fake PTX\n.version 7.0\n"),
                     cuda_sm=80)
    cuda.platform = {"os": "linux", "architecture": "amd64"}
    return [portable(), _artifact("cpu", "fp32", "x86_64-v3", elf, features=("avx2", "fma")),
            _artifact("cpu", "fp32", "aarch64", arm, features=("neon",)),
            _artifact("cpu", "fp16", "aarch64", arm, features=("neon", "fp16"), err=1e-3), cuda]


# ---------------------------------------------------------------- building and breaking


def layout(artifacts=None, edit=None) -> list:
    return c._layout("tiny", artifacts or [portable()], {}, "latest", edit)


def tar(members) -> bytes:
    f = io.BytesIO()
    c.write_tar(f, members)
    return f.getvalue()


def _member(data: bytes, name: str):
    return c.scan_tar(io.BytesIO(data), "corpus", len(data))[name]


def _layer_blob(members, layer: int) -> str:
    """Name of the blob member holding layer ``layer`` of the (only) manifest in ``members``."""
    manifest = next(json.loads(d) for n, d in members
                    if d and d.startswith(b'{"artifactType"'))
    return c.BLOB_DIR + manifest["layers"][layer]["digest"].split(":")[1]


def _edit(kind: str, fn):
    """An edit hook that applies ``fn`` to documents of one kind only."""
    return lambda k, doc, i: fn(doc) if k == kind else doc


def _set(doc, path: list, value):
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def _at_version(version: str):
    """An edit that writes ``version`` wherever a document states the format version."""
    def edit(kind, doc, i):
        if kind in ("index", "nested"):
            doc["annotations"][m.ANN_FORMAT_VERSION] = version
        if kind == "config":
            doc["mlpack_format"] = version
        return doc
    return edit


_newer_major = _at_version("2.0")


def _unknown_fields(kind, doc, i):
    """Format 1.9: fields and a layer media type this reader has never heard of."""
    if isinstance(doc, dict):
        doc["x-future-field"] = {"kind": kind, "list": [1, 2.5, None]}
    if kind in ("index", "nested"):
        doc["annotations"][m.ANN_FORMAT_VERSION] = "1.9"
        doc["annotations"]["org.mlpack.future"] = "yes"
        doc["manifests"][0]["x-future-descriptor-field"] = True
    if kind == "config":
        doc["mlpack_format"] = "1.9"
        doc["artifact"]["x-future"] = [1]
    if kind == "manifest":
        doc["layers"][0]["x-future-descriptor-field"] = True
    return doc


# format 1.0, as the first writers wrote it (every field it has, 1.0 has)
_older_minor = _at_version("1.0")


def _output_size(size):
    """An edit of the config that sets the output's first dim size (a size expression: 1.1)."""
    return _edit("config", lambda d: _set(d, ["model", "outputs", 0, "dims", 0, "size"], size))


def _valid_cases():
    future = portable()
    future.layers.append(c.Layer(UNKNOWN_LAYER, b"bytes for a code format of a later minor"))
    return {
        "ok_minimal.mlpack": (tar(layout()), None),
        "ok_multi.mlpack": (tar(layout(multi())), None),
        "ok_minor_unknown_fields.mlpack": (tar(layout([future], _unknown_fields)), None),
        "ok_minor_older.mlpack": (tar(layout(edit=_older_minor)), None),
        "ok_size_expression.mlpack": (tar(layout(edit=_output_size("2 * $batch"))), None),
    }


def _tar_cases(valid: bytes, members: list):
    """Faults in the tar itself (the documents inside are fine)."""
    weights = _member(valid, _layer_blob(members, 1))
    flipped = bytearray(valid)
    flipped[weights.offset + weights.size - 1] ^= 0x01
    bad_sum = bytearray(valid)
    bad_sum[100:108] = b"0000775\0"  # the first header's mode, without fixing its checksum
    symlink = valid[:-2 * c.BLOCK] + c.tar_header("evil", 0, b"2") + bytes(2 * c.BLOCK)
    cut = len(valid) // 2 + 100
    return {
        "err_truncated.mlpack": (valid[:cut], ("TruncatedError", "truncated tar")),
        "err_wrong_digest.mlpack": (bytes(flipped), ("DigestError", "does not match its digest")),
        "err_tar_checksum.mlpack": (bytes(bad_sum), ("TarError", "checksum")),
        "err_duplicate_member.mlpack": (tar(members + [("index.json", dict(members)["index.json"])]),
                                        ("TarError", "duplicate tar member 'index.json'")),
        "err_dotdot_member.mlpack": (tar(members + [("blobs/../../evil", b"x")]), ("TarError", "'..'")),
        "err_absolute_member.mlpack": (tar([("/etc/evil", b"x")] + members),
                                       ("TarError", "absolute path")),
        "err_symlink_member.mlpack": (symlink, ("TarError", "symbolic link")),
        "err_not_a_tar.mlpack": (b"PK\x03\x04" + bytes(range(256)) * 4,
                                 ("NotAContainerError", "not a tar archive")),
        "err_empty.mlpack": (b"", ("NotAContainerError", "empty")),
    }


def _document_cases(members: list):
    """Faults in the OCI layout or the JSON documents, with every digest right."""
    missing = _layer_blob(members, 2)

    def with_raw(which: str, raw: bytes):
        return lambda k, doc, i: raw if k == which else doc

    oversized = _edit("manifest", lambda d: _set(d, ["layers", 1, "size"], 1 << 40))
    wrong_type = _edit("index", lambda d: _set(d, ["manifests", 0, "mediaType"], m.OCI_MANIFEST))
    no_artifacts = _edit("nested", lambda d: _set(d, ["manifests"], []))
    return {
        "err_missing_blob.mlpack": (tar([mb for mb in members if mb[0] != missing]),
                                    ("MissingBlobError", "is missing from the archive")),
        "err_major_2.mlpack": (tar(layout(edit=_newer_major)),
                               ("VersionError", "format 2.0 is newer than this runtime reads (1.x)")),
        "err_index_json_malformed.mlpack": (
            tar(layout(edit=with_raw("index", b'{"schemaVersion":2,"manifests":[{"mediaType":'))),
            ("ManifestError", "index.json is not valid JSON")),
        "err_config_json_malformed.mlpack": (
            tar(layout(edit=with_raw("config", b'{"mlpack_format":"1.0","model":{"name":"tiny",'))),
            ("ManifestError", "is not valid JSON")),
        "err_index_media_type.mlpack": (tar(layout(edit=wrong_type)),
                                        ("MediaTypeError", "index.json manifests[0]: mediaType")),
        "err_oversized_size.mlpack": (tar(layout(edit=oversized)),
                                      ("DigestError", "larger than the whole file")),
        "err_zero_artifacts.mlpack": (tar(layout(edit=no_artifacts)),
                                      ("ManifestError", "zero artifacts")),
        "err_size_malformed.mlpack": (tar(layout(edit=_output_size("2 * $batch +"))),
                                      ("ManifestError", "nor a size expression")),
        "err_input_size_expression.mlpack": (
            tar(layout(edit=_edit("config", lambda d: _set(
                d, ["model", "inputs", 0, "dims", 0, "size"], "$batch + 1")))),
            ("ManifestError", "an input dim is a count or a '$symbol'")),
    }


def _nested(depth: int) -> bytes:
    """A config with an unknown field whose innermost value lies at ``depth`` (the document's
    value is at depth 0: spec/jsondepth.py); a reader allows 512."""
    config = c.canonical_json(portable().config)
    return config[:-1] + b',"x-nested":' + b"[" * (depth - 1) + b"0" + b"]" * (depth - 1) + b"}"


def _nesting_cases():
    """JSON nested to the readers' limit (512 levels, as runtime/c/src/json.c) and past it."""
    def with_raw(which: str, raw: bytes):
        return lambda k, doc, i: raw if k == which else doc

    deep_index = b'{"x-nested":' + b"[" * 2000 + b"]" * 2000 + b"}"   # past Python's recursion
    return {
        "ok_json_nested_512.mlpack": (tar(layout(edit=with_raw("config", _nested(512)))), None),
        "err_json_nested_513.mlpack": (tar(layout(edit=with_raw("config", _nested(513)))),
                                       ("ManifestError", "is not valid JSON: nested too deeply")),
        "err_index_json_nested.mlpack": (
            tar(layout(edit=with_raw("index", deep_index))),
            ("ManifestError", "index.json is not valid JSON: nested too deeply at byte 524")),
    }


SIGNING_KEY = bytes(range(32))  # a fixed Ed25519 key: the corpus is the same bytes on every run


def _signed(members: list, edit=None) -> bytes:
    """``members`` signed with SIGNING_KEY (spec/signing.py); ``edit`` may change the signature
    manifest, whose digest and index.json entry are then recomputed (digests stay right)."""
    import tempfile

    from cryptography.hazmat.primitives.asymmetric import ed25519

    from mlpack.spec import signing

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.mlpack")
        with open(path, "wb") as f:
            f.write(tar(members))
        with c.open_container(path) as box:
            key = ed25519.Ed25519PrivateKey.from_private_bytes(SIGNING_KEY)
            signed = dict((n, None if v is None else bytes(v))
                          for n, v in signing.signed_members(box, key))
    if edit:
        index = json.loads(signed["index.json"])
        entry = next(e for e in index["manifests"] if e.get("artifactType"))
        old = c.BLOB_DIR + entry["digest"].split(":")[1]
        manifest = c.canonical_json(edit(json.loads(signed.pop(old))))
        entry.update(digest=c.digest_of(manifest), size=len(manifest))
        signed[c.BLOB_DIR + entry["digest"].split(":")[1]] = manifest
        signed["index.json"] = c.canonical_json(index)
    return tar(sorted(signed.items()))


def _signature_cases(members: list):
    """Format 1.2: index.json lists a signature manifest beside the nested index (the readers
    check its structure; whether it verifies is the trust policy's, tests/runtime/test_trust.py)."""
    untagged = _edit("index", lambda d: _set(d, ["manifests", 0, "annotations"], {}))
    first_layer = ["layers", 0]

    manifest_digest = next(c.digest_of(data) for n, data in members
                           if data and data.startswith(b'{"artifactType"'))
    manifest_size = next(len(data) for n, data in members
                         if data and data.startswith(b'{"artifactType"'))
    return {
        "ok_signed.mlpack": (_signed(members), None),
        "err_tag_missing.mlpack": (tar(layout(edit=untagged)),
                                   ("ManifestError", "(the tag) is missing")),
        "err_signature_subject.mlpack": (
            _signed(members, lambda d: _set(d, ["subject"], {
                "mediaType": m.OCI_INDEX, "digest": manifest_digest, "size": manifest_size})),
            ("ManifestError", "not this container's nested index")),
        "err_signature_layer_type.mlpack": (
            _signed(members, lambda d: _set(d, first_layer + ["mediaType"], m.CONFIG)),
            ("MediaTypeError", "simplesigning")),
        "err_signature_unannotated.mlpack": (
            _signed(members, lambda d: _set(d, first_layer + ["annotations"], {})),
            ("ManifestError", "(the signature) is missing")),
    }


def _partial(keep: set[int]) -> bytes:
    """ok_multi pulled for one host (spec/SPEC.md "Partial containers"): index.json annotated
    partial, only the manifests, configs and layers of the artifacts in ``keep`` left."""
    members = layout(multi(), _edit("index", lambda d: _set(
        d, ["annotations", m.ANN_PARTIAL], "true")))
    docs = dict(members)
    nested_name = c.BLOB_DIR + json.loads(docs["index.json"])["manifests"][0]["digest"][7:]
    wanted = {"blobs/", c.BLOB_DIR, "index.json", "oci-layout", nested_name}
    for i, entry in enumerate(json.loads(docs[nested_name])["manifests"]):
        if i not in keep:
            continue
        manifest = json.loads(docs[c.BLOB_DIR + entry["digest"][7:]])
        for d in [entry, manifest["config"], *manifest["layers"]]:
            wanted.add(c.BLOB_DIR + d["digest"][7:])
    return tar([mb for mb in members if mb[0] in wanted])


def _partial_cases():
    return {
        "ok_partial.mlpack": (_partial({0, 4}), None),   # portable and cuda: validates anywhere
        "err_partial_empty.mlpack": (_partial(set()),
                                     ("MissingBlobError", "holding none of its 5 artifacts")),
    }


def cases() -> dict[str, tuple[bytes, tuple[str, str] | None]]:
    """Every case: file name -> (bytes, None if valid else (error class, message fragment))."""
    members = layout()
    out = _valid_cases()
    out.update(_tar_cases(tar(members), members))
    out.update(_document_cases(members))
    out.update(_nesting_cases())
    out.update(_signature_cases(members))
    out.update(_partial_cases())
    return dict(sorted(out.items()))


def expected(all_cases) -> dict:
    return {name: ({"verdict": "ok"} if err is None else
                   {"verdict": "error", "error": err[0], "message_contains": err[1]})
            for name, (_, err) in all_cases.items()}


def generate(out_dir: str = HERE) -> list[str]:
    """Write every case and expected.json into ``out_dir``; returns the file names written."""
    all_cases = cases()
    os.makedirs(out_dir, exist_ok=True)
    for name, (data, _) in all_cases.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        f.write(json.dumps(expected(all_cases), indent=1, sort_keys=True) + "\n")
    return [*all_cases, "expected.json"]


if __name__ == "__main__":
    written = generate(sys.argv[1] if len(sys.argv) > 1 else HERE)
    print(f"wrote {len(written)} files")
