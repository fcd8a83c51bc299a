"""The C engine (libmlpack) behind ``mlpack.load``: its selection, its native executor.

Selection is implemented once, in C (spec/SPEC.md section 5), so ``load`` asks the engine which
artifact to run and shows the engine's verdicts; Python and C cannot disagree. What the engine
picked then runs where it runs best:

* a native artifact (ELF kernels) runs in the engine, on its thread pool (``NativeExecutor``);
* the portable artifact runs on the NumPy interpreter (model.py), which is faster than the
  engine's tree-walking interpreter; the engine's handle is closed.

To run one particular artifact (``Model.validate(i)``, the packager's check of every
artifact), ``open_artifact`` pins it (``mlpack_options.pin_artifact``): the engine opens the
same file, checks that the host can run that artifact, and loads it; nothing is copied.

A chosen native artifact whose code the engine cannot load (a corrupt or foreign ELF) is not
fatal: ``open_engine`` reopens with ``device="portable"`` and returns the error, and model.py
falls back loudly, naming it.
"""

from __future__ import annotations

from mlpack.spec.container import Artifact, Container
from mlpack.spec.errors import (Error, FormatError, InputError, KeyFileError,
                                NoRunnableArtifactError, SignatureError)

from mlpack.runtime import native
from mlpack.runtime.select import Verdict, describe

# errors that say the container or the request is wrong: retrying on the portable artifact
# would not help, so they propagate as they are
_NOT_A_LOAD_FAILURE = (FormatError, InputError, NoRunnableArtifactError, SignatureError,
                       KeyFileError)


def available() -> bool:
    """Whether libmlpack is built and loads in this process."""
    return native.available()


def describe_engine() -> str:
    return f"libmlpack {native.version()}" if available() else "python (libmlpack is not built)"


def unavailable_reason() -> str | None:
    """Why the C engine is not used here (native.unavailable_reason), or None."""
    return native.unavailable_reason()


def _open(container: Container, threads, trusted_keys=None, **policy) -> native.NativeModel:
    # the caller's strict is applied by model.py, so the message is the same with or without C.
    # The engine reads the file the Python reader opened (its descriptor, never the path again),
    # checks the trust policy itself and hashes what it loads from its own copies: verify=False
    # only spares it hashing every other blob at open
    return native.open_model(container.path, fd=container.fileno(), threads=threads,
                             strict=False, verify=False, trusted_keys=trusted_keys, **policy)


def open_engine(container: Container, *, device=None, precision=None, accuracy_budget=None,
                threads=None, trusted_keys=None):
    """The engine opened on ``container``'s file with the caller's policy: (NativeModel, load
    error or None). ``trusted_keys``: the trust policy in the engine's form (signing.policy_spec).

    When the artifact the engine chose cannot be loaded, the model is reopened on the portable
    artifact and the error message is returned beside it."""
    policy = {"device": device, "precision": precision, "accuracy_budget": accuracy_budget,
              "trusted_keys": trusted_keys}
    try:
        return _open(container, threads, **policy), None
    except _NOT_A_LOAD_FAILURE:
        raise
    except Error as e:
        if device == "portable":
            raise
        return _open(container, threads, **{**policy, "device": "portable"}), str(e)


def verdicts(engine: native.NativeModel, container: Container, load_error: str | None):
    """The engine's verdicts as ``Verdict`` records over the Python reader's artifacts."""
    out = []
    for v in engine.artifacts:
        reason = v.reason
        art = container.artifacts[v.index]
        if load_error and v.chosen:  # not what the caller asked for: the engine's retry asked
            reason = "chosen: portable: runs anywhere; slower (native code failed to load)"
        elif load_error and v.runnable and art.device != "portable":
            reason = f"passed over: the engine could not load native code: {load_error}"
        out.append(Verdict(art, v.runnable, v.chosen, reason))
    return out


class NativeExecutor:
    """An artifact running in the engine: the executor interface model.py expects."""

    def __init__(self, engine: native.NativeModel):
        self.engine = engine

    def run(self, feeds):
        return self.engine.run(feeds)

    def close(self) -> None:
        self.engine.close()


def open_artifact(container: Container, art: Artifact, threads=None,
                  trusted_keys=None) -> native.NativeModel:
    """The engine opened on ``art`` (pinned); NoRunnableArtifactError with the engine's reason
    when this host cannot run it."""
    try:
        return _open(container, threads, trusted_keys=trusted_keys, artifact=art.index)
    except Error as e:
        raise type(e)(f"{describe(art)} cannot run in the engine: {e}") from None


__all__ = ["available", "describe_engine", "open_engine", "verdicts", "NativeExecutor",
           "open_artifact"]
