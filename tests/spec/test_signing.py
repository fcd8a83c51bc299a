"""spec/signing.py on the conformance corpus's containers: cosign's payload byte for byte, the
signature manifest's shape (index.json against its schema), and each way ``check`` refuses.
The runtimes' side (the trust policy in Python and C, planted code, races) is
tests/runtime/test_trust.py."""

from __future__ import annotations

import base64
import io
import json
import os

import pytest

from mlpack.spec import container as c
from mlpack.spec import media, signing
from mlpack.spec.conformance.generate import SIGNING_KEY
from mlpack.spec.errors import SignatureError

CORPUS = os.path.join(os.path.dirname(c.__file__), "conformance")
SCHEMAS = os.path.join(os.path.dirname(c.__file__), "schemas")


@pytest.fixture
def corpus_key():
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.from_private_bytes(SIGNING_KEY)
    return signing.TrustedKeys([key.public_key()], "corpus key"), key


def test_payload_is_cosigns_simple_signing_bytes():
    digest = "sha256:" + "ab" * 32
    assert signing.payload(digest, "reg.example/m") == (
        b'{"critical":{"identity":{"docker-reference":"reg.example/m"},"image":'
        b'{"docker-manifest-digest":"sha256:' + b"ab" * 32 + b'"},"type":'
        b'"cosign container image signature"},"optional":null}')


def test_signed_corpus_file_verifies_and_names_its_nested_index(corpus_key):
    trusted, key = corpus_key
    with c.open_container(os.path.join(CORPUS, "ok_signed.mlpack")) as box:
        assert signing.check(box, trusted) == signing.key_id(key.public_key())
        [s] = box.signatures
        claim = json.loads(s.payload)["critical"]["image"]["docker-manifest-digest"]
        assert claim == box.nested_digest
        assert key.public_key().verify(base64.b64decode(s.signature), s.payload) is None


def test_index_json_matches_its_schema_signed_or_not():
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    registry = referencing.Registry()
    for name in os.listdir(SCHEMAS):
        with open(os.path.join(SCHEMAS, name)) as f:
            registry = registry.with_resource("https://mlpack.dev/schemas/" + name,
                                              referencing.Resource.from_contents(json.load(f)))
    with open(os.path.join(SCHEMAS, "index.schema.json")) as f:
        validator = jsonschema.Draft202012Validator(json.load(f), registry=registry)

    def index_of(name):
        with open(os.path.join(CORPUS, name), "rb") as f:
            data = f.read()
        m = c.scan_tar(io.BytesIO(data), name, len(data))["index.json"]
        return json.loads(data[m.offset:m.offset + m.size])

    for name in ("ok_minimal.mlpack", "ok_multi.mlpack", "ok_signed.mlpack"):
        assert not list(validator.iter_errors(index_of(name))), name
    assert list(validator.iter_errors(index_of("err_tag_missing.mlpack")))


def test_check_says_why(corpus_key, tmp_path):
    trusted, _ = corpus_key
    with c.open_container(os.path.join(CORPUS, "ok_minimal.mlpack")) as box:
        with pytest.raises(SignatureError, match="is not signed"):
            signing.check(box, trusted)
    other = signing.load_trusted_keys(signing.keygen(tmp_path / "other")[1])
    with c.open_container(os.path.join(CORPUS, "ok_signed.mlpack")) as box:
        with pytest.raises(SignatureError, match="1 by keys not trusted"):
            signing.check(box, other)
    # a signature by the trusted key's id over other bytes (digests recomputed around it)
    from mlpack.spec.conformance import generate

    def forge(manifest):
        manifest["layers"][0]["annotations"][media.ANN_SIGNATURE] = \
            base64.b64encode(bytes(64)).decode()
        return manifest

    path = tmp_path / "forged.mlpack"
    path.write_bytes(generate._signed(generate.layout(), forge))
    with c.open_container(path) as box:
        with pytest.raises(SignatureError, match="1 that do not verify"):
            signing.check(box, trusted)
