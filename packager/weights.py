"""A build's weights: one archive per precision, written once to a file, shared by everything.

Every artifact of a precision stores the same weights archive, the model's weights as its graph
of that precision holds them (spec/SPEC.md section 7: what a target wants in another form, it
computes when the engine opens the artifact). So a build writes that archive once, streaming it
to a file (``write``: in the kernel cache, where a rebuild finds it, or in a scratch folder), and
from then on nothing holds the weights in this process's memory twice:

- the graph's constants become views of the file, mapped (``attach``): their pages are the page
  cache's, read when something reads them;
- a compile worker gets the graph without its constants' data (``detach``: names, dtypes and
  shapes only) and maps the same file (``attach`` there), instead of a pickled copy of every
  weight going to each worker and the packed weights coming back;
- the container is written with the archive as a ``FileBlob``, copied by the kernel from the
  file into the container (spec/container.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

from mlpack.spec.container import FileBlob
from mlpack.spec.errors import FormatError


def storable(graph) -> dict:
    """The constants of ``graph`` a weights archive holds, by name, in the graph's order: all of
    them unless a dtype has no archive spelling (the sub-byte ones a cpu target packs itself)."""
    from mlpack.spec.tensorfile import _dtype_name

    out = {}
    for name, c in graph.constants.items():
        try:
            _dtype_name(np.asarray(c.data).dtype)
        except FormatError:
            return {}
        out[name] = c.data
    return out


def write(tensors: dict, folder: Path) -> FileBlob:
    """The archive of ``tensors`` (spec/tensorfile.py) written into ``folder`` under its own
    sha256, as a FileBlob. It replaces a file of that name (by a rename: a reader of the one
    there keeps reading it), which may be damaged."""
    from mlpack.spec.tensorfile import write_tensors_to

    h = hashlib.sha256()
    size = 0

    def archive(f) -> Path:
        nonlocal size
        size = write_tensors_to(f, tensors, None, h)
        return folder / h.hexdigest()

    path = write_renamed(folder, ".weights.", archive)
    return FileBlob(str(path), size, "sha256:" + h.hexdigest())


def write_renamed(folder: Path, prefix: str, write) -> Path:
    """Write a file into ``folder`` through ``write(f)``, which returns the path it is to have
    there: a temporary file (``prefix``) renamed to it once whole, so a reader finds the whole
    file or none, and on failure nothing remains. Readable by all (mkstemp's 0600 would keep a
    shared cache folder private)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            path = write(f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


# the archives this process has hashed whole, as the file system saw each then (path, size,
# modification time, inode): a build looks its archive up twice (its compiled graph's and its
# weights'), and hashing 500 MB takes a third of a second
_CHECKED: set[tuple] = set()


CHECK_CHUNK = 1 << 22   # bytes read at a time to check an archive

# archives being checked in a thread of their own (``check_ahead``), by path: ``found`` waits
# for that check instead of hashing the file a second time beside it
_AHEAD: dict[str, threading.Thread] = {}


def check_ahead(folder: Path, digest: str, size: int) -> None:
    """Start checking the archive ``digest`` in ``folder`` (``found``) in a thread: a rebuild
    hashes its model file to find its compiled graph and then that graph's archive, two hashes
    of the model's size one after the other (GPT-2: 0.35 s each); told which archive to expect
    (packager/cache.py's hint), the two run side by side, on two cores. The check is the same
    one ``found`` makes (an archive is never trusted), so a wrong guess costs a hash on the
    other core, never a wrong archive."""
    path = str(folder / digest.split(":", 1)[1])
    if path in _AHEAD:
        return
    thread = threading.Thread(target=found, args=(folder, digest, size), daemon=True,
                              name="mlpack-check-archive")
    _AHEAD[path] = thread
    thread.start()


def found(folder: Path, digest: str, size: int) -> FileBlob | None:
    """The archive ``digest`` in ``folder`` if a file of that name and size is there, checked
    whole (a cache is never trusted; once per process while the file is unchanged), else None."""
    path = folder / digest.split(":", 1)[1]
    ahead = _AHEAD.get(str(path))
    if ahead is not None and ahead is not threading.current_thread():
        ahead.join()   # (its check, once done, is in _CHECKED)
        _AHEAD.pop(str(path), None)
    try:
        st = path.stat()
        if st.st_size != size:
            return None
        seen = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
        if seen in _CHECKED:
            return FileBlob(str(path), size, digest)
        h = hashlib.sha256()
        buf = bytearray(CHECK_CHUNK)   # (one buffer reused: a check beside the file's hash
        with open(path, "rb") as f:    # would otherwise hold 16 MB chunks on top of it)
            while n := f.readinto(buf):
                h.update(memoryview(buf)[:n])
    except OSError:
        return None
    if "sha256:" + h.hexdigest() != digest:
        return None
    _CHECKED.add(seen)
    return FileBlob(str(path), size, digest)


def mapped(blob: FileBlob) -> dict[str, np.ndarray]:
    """The arrays of the archive ``blob``, read-only views of its file mapped into memory."""
    from mlpack.spec.tensorfile import read_tensors

    with open(blob.path, "rb") as f:
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return read_tensors(view)


def attach(graph, blob: FileBlob):
    """``graph`` with each constant the archive ``blob`` holds read from the mapped file."""
    arrays = mapped(blob)
    constants = {name: dataclasses.replace(c, data=arrays[name]) if name in arrays else c
                 for name, c in graph.constants.items()}
    return dataclasses.replace(graph, constants=constants)


@dataclasses.dataclass(frozen=True)
class Detached:
    """A graph to send to another process without its weights: the archive file holds them."""

    graph: object       # the graph, every constant in ``blob`` with an empty array for data
    blob: FileBlob | None

    def attach(self):
        return self.graph if self.blob is None else attach(self.graph, self.blob)


def detach(graph, blob: FileBlob | None) -> Detached:
    """``graph`` for a worker process: the constants ``blob`` holds without their data (a
    zero-length stand-in the worker replaces with the mapped file's view, ``Detached.attach``)."""
    if blob is None:
        return Detached(graph, None)
    empty = np.zeros(0, np.uint8)
    constants = {name: dataclasses.replace(c, data=empty) for name, c in graph.constants.items()}
    return Detached(dataclasses.replace(graph, constants=constants), blob)


def scratch_folder(near: str) -> Path:
    """A new folder beside the file ``near`` (the build's output: the same file system, so the
    container takes the archive's bytes by a kernel copy), for a build without a kernel cache."""
    return Path(tempfile.mkdtemp(prefix=f".{os.path.basename(near)}.", suffix=".weights",
                                 dir=os.path.dirname(os.path.abspath(near))))
