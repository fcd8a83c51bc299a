"""The error hierarchy every part of mlpack raises for a user-facing failure.

It lives in ``mlpack.spec`` because the runtime may import nothing else; the compiler's own
errors (``mlpack.codegen.errors``) derive from these. Each message names what is at fault:
the file, node, op, field or dimension.
"""


class Error(Exception):
    """Base of every user-facing mlpack failure; the CLI prints it as one paragraph, exit code 2."""

    exit_code = 2


class InputError(Error):
    """Inputs handed to ``run`` do not match the model's signature (name, dtype, dim)."""


class FormatError(Error):
    """A container or file is malformed, truncated, tampered with or of a newer major version."""


# ---- container format errors (spec/container.py); the conformance corpus names these classes


class NotAContainerError(FormatError):
    """The file is empty or is not a tar archive at all."""


class TarError(FormatError):
    """The tar structure is broken or unsafe: bad header checksum, bad field, duplicate member,
    ``..`` or absolute member name, link/device member, missing end-of-archive marker."""


class TruncatedError(TarError):
    """The file ends before a member's data or the end-of-archive marker."""


class MissingBlobError(FormatError):
    """A required member (``oci-layout``, ``index.json``) or a referenced blob is not in the tar."""


class DigestError(FormatError):
    """A blob's bytes do not match its descriptor: wrong sha256, or a size other than declared."""


class VersionError(FormatError):
    """The container's format major version is newer than this reader understands."""


class MediaTypeError(FormatError):
    """A document or descriptor has a media type other than the one the format requires."""


class ManifestError(FormatError):
    """A JSON document (index, manifest, config) is malformed or lacks a required field, or the
    container holds no artifact."""


class IRParseError(Error):
    """The IR text form does not parse (names the line and column)."""


class VerifyError(Error):
    """A graph breaks an IR invariant (names the op and what is wrong)."""


class InterpError(Error):
    """The reference interpreter met a value it cannot evaluate (out-of-range read, bad size)."""


class IndexRangeError(InterpError):
    """An index taken from data (a Gather's, a ScatterND's) lies outside the tensor it indexes.
    Every executor raises it (the interpreters and native kernels alike: the C engine's
    MLPACK_ERR_INDEX); the message names the ONNX node and the index, as ONNX Runtime refuses."""


class SignatureError(Error):
    """A trust policy is set and the container is not signed by a trusted key: unsigned, signed
    by an unknown key, or a signature that does not verify (spec/signing.py; the C engine's
    MLPACK_ERR_SIGNATURE). Nothing of the container was loaded."""


class KeyFileError(Error):
    """A signing or trusted key file is missing, unreadable, or not an Ed25519 key."""


class RegistryError(Error):
    """A container registry could not be reached, refused a request (authentication, a missing
    tag or blob) or served bytes that do not match their digest (runtime/registry/); the message
    names the registry, the repository and the reference or digest at fault."""


# ---- selection and loading (runtime/select.py, runtime/model.py)


class NoRunnableArtifactError(Error):
    """No artifact of a container fits this host and the caller's request; the message names
    each artifact and why it was passed over."""


class PortableFallbackError(Error):
    """``load(..., strict=True)`` would have fallen back to the slow portable interpreter."""


class PortableFallbackWarning(UserWarning):
    """``load`` runs the portable interpreter because no native artifact fits (or the container
    has none); the message says why. ``strict=True`` makes it a ``PortableFallbackError``."""


class UnsignedContainerWarning(UserWarning):
    """Native code is being loaded from a container that carries no signature, with no trust
    policy set: nothing says who made the code (``mlpack sign``; ``trusted_keys``)."""
