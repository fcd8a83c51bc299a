"""The kernel cache: each target's compiled code on disk, content-addressed, for rebuilds.

A build compiles every (target, precision) of a model into ``Code`` (an ELF and its plan for a
cpu target, LLVM's optimizer being most of the time). That is a pure function of its inputs, so
``compile_cached`` keys each one by a digest of all of them (``Keys``) and reuses what an
earlier build stored:

- the graph as the compiler left it, as printed text (``spec/ir/printer.py``) with each
  constant's data replaced by its sha256, plus the origins its index messages name;
- the target (name, hence its CPU and feature list), the precision, the passes left out and
  int8's calibration ranges;
- the code that turns them into bytes: a digest of every source file of ``mlpack.codegen`` and
  ``mlpack.spec`` (an edit anywhere there is a new key, so a stale entry can never be read),
  mlpack's, llvmlite's, ziglang's and NumPy's versions, and the environment variables the
  compiler reads (MLPACK_DISABLE_PASSES, MLPACK_LLD).

The unit is a whole target's code, not a kernel: a key computed before lowering lets a warm
rebuild skip the Python lowering too (a quarter of a target's compile), which a key on each
kernel's LLVM IR could not. Within one target identical kernels are already compiled once
(``codegen/targets/cpu/module.py``'s ``_share_identical``).

The weights are not in a target's entry: every artifact of a precision stores the model's
weights as that precision's graph holds them (packager/weights.py), one archive, which the
build writes into this folder's blobs and finds again under ``weights/<key>.json`` (the key of
the graph, "weights" and the precision), so a rebuild neither writes it nor hashes the graph's
weights into a new one. An entry holds only what its target made beside them (the AMX tiles).

Layout of the folder (MLPACK_CACHE_DIR, default ``$XDG_CACHE_HOME/mlpack/kernels``, else
``~/.cache/mlpack/kernels``): ``entries/<key>.json`` says which blobs make the code and carries
the sha256 of its own text; ``weights/<key>.json`` names a precision's weights archive;
``blobs/<sha256>`` holds the ELFs and archives; ``hints/`` which archive a model file's last
build used (``check_ahead``); ``runs/<key>`` the outputs of an artifact's
vectors on this host or under qemu (packager/validation.py, emulate.py), ``vectors/<key>`` a
model's test vectors, ``graphs/<key>`` a model's compiled graph (below). A rebuild of an
unchanged model also skips the ONNX import and the graph passes (Swin-T: 3 of a warm rebuild's
4.5 s): ``graphs/<key>`` holds the compiled graph, pickled without its constants' data,
with its digest and the fp32 weights archive that holds them, keyed by the whole ONNX model
(a model file's bytes, packager/source.py's ``file_key``, else every node, port, opset, function
and initializer of the parsed model, data included: ``model_key``), the memory budget, the code
and MLPACK_DISABLE_PASSES. It is found only with its archive, whole, and read only after its
own digest matches (this folder already holds the native code a build reuses: it is the user's
own). Every file is written to a temporary name and renamed, so two builds at once never see
half an entry; an entry whose own digest or any blob's digest does not match is dropped and
compiled again, never trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import time
import weakref
from pathlib import Path

import numpy as np

from mlpack.spec import environment
from mlpack.spec.errors import Error

FORMAT = 2   # the entry's layout; a new one is a new key
_SOURCES: str | None = None   # the code digest, computed once per process


def default_folder() -> Path:
    """MLPACK_CACHE_DIR, else the XDG cache's mlpack/kernels."""
    chosen = environment.get("MLPACK_CACHE_DIR")
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlpack" / "kernels"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")   # a blob's name, as a hint may give it


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def code_digest() -> str:
    """A digest of what compiles: every source file of mlpack.codegen and mlpack.spec, and the
    versions of the libraries whose output lands in the code."""
    global _SOURCES
    if _SOURCES is None:
        import mlpack
        import mlpack.codegen
        import mlpack.spec

        h = hashlib.sha256(f"format {FORMAT} mlpack {mlpack.__version__}".encode())
        for dist in ("llvmlite", "ziglang", "numpy"):
            h.update(f" {dist} {_version(dist)}".encode())
        for package in (mlpack.codegen, mlpack.spec):
            for root in package.__path__:
                for path in sorted(Path(root).rglob("*.py")):
                    h.update(f"\n{path.relative_to(root)}\n".encode())
                    h.update(path.read_bytes())
        _SOURCES = h.hexdigest()
    return _SOURCES


def graph_digest(graph) -> str:
    """The graph as printed text, each constant's data by its digest (a 500 MB model prints
    in a second this way, not a minute), with the origins its index messages name."""
    from mlpack.spec.ir.printer import format_graph, format_layout, format_type
    import numpy as np

    h = hashlib.sha256(format_graph(dataclasses.replace(graph, constants={})).encode())
    for c in graph.constants.values():
        data = np.ascontiguousarray(c.data)
        h.update(f"const {c.name} {format_type(c.type)} {format_layout(c.layout)} {data.dtype.str} "
                 f"{data.shape} ".encode())
        h.update(hashlib.sha256(data.view(np.uint8).reshape(-1)).digest())
    h.update(repr(sorted(graph.origins.items(), key=repr)).encode())
    return h.hexdigest()


_LAST: list = []   # [(weak reference to a graph, its digest)]: a build asks again


def _graph_sha(graph) -> str:
    if not _LAST or _LAST[0][0]() is not graph:
        _LAST[:] = [(weakref.ref(graph), graph_digest(graph))]
    return _LAST[0][1]


def _canonical(value) -> str:
    """A stable text of a precision's calibration (int8: {tensor: (lo, hi)})."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_canonical(v)}" for k, v in sorted(value.items(), key=repr)) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_canonical(v) for v in value) + "]"
    if hasattr(value, "tobytes"):
        return f"array:{value.dtype.str}:{getattr(value, 'shape', ())}:{_sha(value.tobytes())}"
    return repr(float(value)) if isinstance(value, float) else repr(value)


def key(graph_sha: str, target: str, precision: str, disabled=frozenset(), calibration=None) -> str:
    """The cache key of one target x precision of the graph whose digest is ``graph_sha``."""
    parts = {"code": code_digest(), "graph": graph_sha, "target": target, "precision": precision,
             "disabled": sorted(disabled), "calibration": _canonical(calibration),
             "env": {n: environment.get(n) for n in ("MLPACK_DISABLE_PASSES", "MLPACK_LLD")}}
    return _sha(json.dumps(parts, sort_keys=True).encode())


def vectors_key(graph, model: str, feeds: list[dict], baseline: str) -> str:
    """The key of a model's test vectors: the compiled graph (its weights by digest), the ONNX
    model (``model``: the key of its compiled graph, packager/source.py, which covers what ONNX
    Runtime runs), the inputs, the baseline (ONNX Runtime's version) and the code."""
    h = hashlib.sha256(f"vectors {code_digest()} {_graph_sha(graph)} {model} "
                       f"{baseline}".encode())
    for case in feeds:
        for name, a in sorted(case.items()):
            a = np.ascontiguousarray(a)
            h.update(f"{name} {a.dtype.str} {a.shape}".encode())
            h.update(a.view(np.uint8).reshape(-1).tobytes() if a.size else b"")
    return h.hexdigest()


def graph_key_head(budget: int | None, **more) -> str:
    """What every key of a compiled graph covers besides the model (``model_key``, and
    packager/source.py's ``file_key``): the cache's format, the code, the memory budget the
    ``recompute`` pass had and the passes left out; ``more``: the key's own fields."""
    head = {"format": FORMAT, "code": code_digest(), "budget": budget, **more,
            "env": {n: environment.get(n) for n in ("MLPACK_DISABLE_PASSES",)}}
    return json.dumps(head, sort_keys=True)


def model_key(proto, budget: int | None) -> str:
    """The key of ``proto``'s compiled graph: the ONNX model whole (its weights' bytes too), the
    memory budget the ``recompute`` pass had, the code and the passes left out."""
    h = hashlib.sha256(f"graph {graph_key_head(budget, ir_version=proto.ir_version)}".encode())
    g = proto.graph

    def part(data: bytes) -> None:
        h.update(len(data).to_bytes(8, "little"))   # (parts end where their lengths say)
        h.update(data)
    for p in [*g.node, *g.input, *g.output, *g.value_info, *g.sparse_initializer,
              *proto.opset_import, *proto.functions]:
        part(p.SerializeToString())
    for t in g.initializer:   # a weight's bytes hashed as they are, not copied into a message
        if t.raw_data:
            part(repr((t.name, t.data_type, list(t.dims), t.data_location)).encode())
            part(t.raw_data)
        else:
            part(t.SerializeToString())
    return h.hexdigest()


def carry_digest(graph, same) -> None:
    """Take ``graph``'s digest as ``same``'s: the same graph by content (its constants read
    from another place), whose weights need not be hashed again."""
    remember_digest(same, _graph_sha(graph))


def remember_digest(graph, digest: str) -> None:
    """Take ``digest`` as ``graph``'s (``graph_digest``), as a cached graph's entry stored it."""
    _LAST[:] = [(weakref.ref(graph), digest)]


def graph_key(graph, target: str, precision: str, disabled=frozenset(), calibration=None) -> str:
    """``key`` of ``graph`` (its digest taken once per graph)."""
    return key(_graph_sha(graph), target, precision, disabled, calibration)


@dataclasses.dataclass
class Stats:
    """What a build got from the cache."""
    hits: list[tuple[str, str]] = dataclasses.field(default_factory=list)     # (target, precision)
    misses: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    dropped: int = 0   # entries found corrupt and compiled again


class KernelCache:
    """One cache folder: ``get`` a target's Code by key, ``put`` one compiled."""

    def __init__(self, folder: str | os.PathLike | None = None):
        self.folder = Path(folder) if folder is not None else default_folder()
        self.stats = Stats()

    def _entry(self, k: str) -> Path:
        return self.folder / "entries" / f"{k}.json"

    def _blob(self, digest: str) -> Path:
        return self.folder / "blobs" / digest

    def get(self, k: str):
        """The Code stored under ``k``, or None (absent, or corrupt: then removed, so the next
        put writes it whole)."""
        from mlpack.codegen.targets.base import Code
        from mlpack.spec.tensorfile import read_tensors

        path = self._entry(k)
        try:
            text = path.read_bytes()
        except OSError:
            return None
        try:
            digest, _, body = text.partition(b"\n")
            if digest.decode() != _sha(body):
                raise ValueError("entry digest")
            doc = json.loads(body)
            blobs = {}
            for d in [d for _, d in doc["layers"]] + [doc["weights"]]:
                data = self._blob(d).read_bytes()
                if _sha(data) != d:
                    self._discard(self._blob(d))
                    raise ValueError("blob digest")
                blobs[d] = data
            code = Code([(m, blobs[d]) for m, d in doc["layers"]],
                        read_tensors(blobs[doc["weights"]]), doc["config"], doc["timings"],
                        tuple(doc["inexact"]), bool(doc["raw_weights"]))
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, Error):
            self._discard(path)
            self.stats.dropped += 1
            return None
        return code

    def get_weights(self, k: str, folder: Path):
        """The weights archive (a FileBlob in ``folder``, this cache's blobs) that ``k`` names,
        checked whole, or None."""
        from mlpack.packager.weights import found

        try:
            doc = json.loads((self.folder / "weights" / f"{k}.json").read_text())
            blob = found(folder, doc["digest"], int(doc["size"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if blob is None:
            self.stats.dropped += 1
        return blob

    def put_weights(self, k: str, blob) -> None:
        """Remember that ``k`` names the weights archive ``blob`` (written in the blobs)."""
        body = json.dumps({"digest": blob.digest, "size": blob.size}).encode()
        try:
            self._write(self.folder / "weights" / f"{k}.json", body)
        except OSError:
            pass

    # Which archive a model file's last build used, by the file's path: a hint (``hints/``,
    # keyed by the path's digest, naming the file's size and modification time), so that a
    # rebuild checks that archive while it hashes the file (weights.check_ahead). Never trusted:
    # the archive is checked whole as ever, and only the file's digest finds its graph.

    def _hint(self, model_path) -> Path:
        name = hashlib.sha256(os.path.realpath(model_path).encode()).hexdigest()
        return self.folder / "hints" / name

    @staticmethod
    def _stamp(model_path) -> list[int]:
        st = os.stat(model_path)
        return [st.st_size, st.st_mtime_ns]

    def check_ahead(self, model_path) -> None:
        """Start checking the archive the last build of the file ``model_path`` used, if the
        file looks unchanged since (its size and modification time)."""
        from mlpack.packager.weights import check_ahead

        try:
            doc = json.loads(self._hint(model_path).read_text())
            digest = doc["digest"]
            if doc["file"] == self._stamp(model_path) and _DIGEST.fullmatch(digest):
                check_ahead(self.folder / "blobs", digest, int(doc["size"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def put_hint(self, model_path, blob) -> None:
        """Remember that a build of the file ``model_path`` used the archive ``blob``."""
        try:
            body = json.dumps({"file": self._stamp(model_path), "digest": blob.digest,
                               "size": blob.size}).encode()
            path = self._hint(model_path)
            if not path.is_file() or path.read_bytes() != body:
                self._write(path, body)
        except OSError:
            pass

    # An artifact of another architecture is validated under qemu (packager/emulate.py), which
    # takes seconds even for a small model. What the emulated engine printed is a function of
    # the program, the qemu command, the artifact's bytes and its vectors (the key: emulate's
    # run_key), so a rebuild that makes the same artifact reuses its outputs; they are judged
    # against the reference again, as a new run's would be.

    def get_outputs(self, k: str):
        """The outputs per case ([{output name: array}]) stored under ``k``, the message of a
        run that could not be emulated (a str), or None."""
        return self.get_run(k)[0]

    def get_run(self, k: str) -> tuple:
        """(``get_outputs(k)``, the seconds stored with them, a tuple, or None)."""
        from mlpack.spec.tensorfile import read_header, read_tensors

        path = self.folder / "runs" / k
        body = self._read_checked(path)
        if body is None:
            return None, None
        try:
            meta = read_header(body)["metadata"]
            if "not_emulated" in meta:
                return str(meta["not_emulated"]), None
            got = [{} for _ in range(int(meta["cases"]))]
            for name, array in read_tensors(body).items():
                case, _, output = name.partition("/")
                got[int(case)][output] = array
            seconds = meta.get("seconds")
            return got, tuple(float(t) for t in seconds) if seconds is not None else None
        except (ValueError, KeyError, TypeError, Error):
            self._drop(path)
            return None, None

    def put_outputs(self, k: str, got, seconds: tuple | None = None) -> None:
        """Store the outputs of one run (or the str saying why it could not be emulated), and
        the ``seconds`` it took (a native run's: they predict a rebuild's emulated ones)."""
        from mlpack.spec.tensorfile import write_tensors

        if isinstance(got, str):
            body = write_tensors({}, {"not_emulated": got})
        else:
            meta = {"cases": len(got)}
            if seconds is not None:
                meta["seconds"] = list(seconds)
            body = write_tensors({f"{c}/{name}": a for c, case in enumerate(got)
                                  for name, a in case.items()}, meta)
        self._write_checked(self.folder / "runs" / k, body)

    # The test vectors (inputs, ONNX Runtime's outputs and the float64 reference's) follow from
    # the model, the inputs and the code that computes them (``vectors_key``): a rebuild reads
    # them back instead of running both references again.

    def get_vectors(self, k: str) -> bytes | None:
        """The test-vector archive stored under ``k`` (whole, by its digest), or None."""
        return self._read_checked(self.folder / "vectors" / k)

    def put_vectors(self, k: str, body: bytes) -> None:
        self._write_checked(self.folder / "vectors" / k, body)

    def get_graph(self, k: str):
        """The compiled graph stored under ``k`` (``model_key``), its constants read from their
        weights archive (mapped), or None: absent, its archive gone or damaged, or its entry
        corrupt (then removed)."""
        import pickle

        from mlpack.packager.weights import attach, found

        path = self.folder / "graphs" / k
        body = self._read_checked(path)
        if body is None:
            return None
        try:
            entry = pickle.loads(body)
            blob = found(self.folder / "blobs", entry["weights"], int(entry["size"]))
            if blob is None:
                return None
            graph = attach(entry["graph"], blob)
        except Exception:   # (whatever unpickling an entry of other code raises)
            self._drop(path)
            return None
        remember_digest(graph, entry["digest"])
        return graph

    def put_graph(self, k: str, graph, blob) -> None:
        """Store ``graph`` under ``k``, without its constants' data: the weights archive
        ``blob`` (in this cache's blobs, holding every constant) has them."""
        import pickle

        from mlpack.packager.weights import detach

        try:
            body = pickle.dumps({"graph": detach(graph, blob).graph, "digest": _graph_sha(graph),
                                 "weights": blob.digest, "size": blob.size}, protocol=5)
        except (pickle.PicklingError, TypeError, AttributeError):
            return
        self._write_checked(self.folder / "graphs" / k, body)

    def put(self, k: str, code) -> None:
        """Store ``code`` under ``k``. A cache that cannot be written (a read-only home) costs
        the reuse, never the build."""
        from mlpack.spec.tensorfile import write_tensors

        try:
            layers = [(m, self._write_blob(data)) for m, data in code.layers]
            doc = {"format": FORMAT, "layers": layers,
                   "weights": self._write_blob(write_tensors(code.weights)),
                   "raw_weights": code.raw_weights, "config": code.config,
                   "timings": code.timings, "inexact": list(code.inexact_passes)}
            body = json.dumps(doc).encode()   # (key order kept: the config's bytes depend on it)
            self._write(self._entry(k), _sha(body).encode() + b"\n" + body)
        except (OSError, TypeError, ValueError):
            pass

    def _write_blob(self, data: bytes) -> str:
        digest = _sha(data)
        path = self._blob(digest)
        try:   # another entry's, or another build's: kept only if it is whole
            whole = _sha(path.read_bytes()) == digest
        except OSError:
            whole = False
        if not whole:
            self._write(path, data)
        return digest

    # A run's outputs, a model's vectors and its graph are each one file: the sha256 of the rest,
    # a newline, the rest

    def _read_checked(self, path: Path) -> bytes | None:
        """The body of the file ``path`` written by ``_write_checked``, or None: absent, or
        damaged (then removed and counted)."""
        try:
            digest, _, body = path.read_bytes().partition(b"\n")
            if digest.decode() != _sha(body):
                raise ValueError("entry digest")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, UnicodeDecodeError):
            self._drop(path)
            return None
        return body

    def _write_checked(self, path: Path, body: bytes) -> None:
        """``body`` behind its own sha256 at ``path`` (a cache that cannot be written costs the
        reuse, never the build)."""
        try:
            self._write(path, _sha(body).encode() + b"\n" + body)
        except OSError:
            pass

    def _drop(self, path: Path) -> None:
        """Remove a damaged entry and count it."""
        self._discard(path)
        self.stats.dropped += 1

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        """Write ``data`` to a temporary file beside ``path`` and rename it there (atomic)."""
        from mlpack.packager.weights import write_renamed

        def put(f) -> Path:
            f.write(data)
            return path

        write_renamed(path.parent, f".{path.name[:16]}.", put)

    @staticmethod
    def _discard(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass


def lookup(cache: KernelCache | None, models, pairs, disabled=frozenset()):
    """The pairs ``cache`` has: ({pair: (Code, seconds to read it)}, [pairs to compile],
    {pair: key}); with no cache, every pair is to compile. ``models``: the build's
    compiling.Models (its base graph and calibrations make the keys)."""
    if cache is None:
        return {}, list(pairs), {}
    keys = {pair: graph_key(models.base, *pair, disabled, models.calibrations.get(pair[1]))
            for pair in pairs}
    out, misses = {}, []
    for pair in pairs:
        t0 = time.perf_counter()
        found = cache.get(keys[pair])
        if found is None:
            misses.append(pair)
            continue
        cache.stats.hits.append(pair)
        out[pair] = (found, time.perf_counter() - t0)
    cache.stats.misses.extend(misses)
    return out, misses, keys


def store(cache: KernelCache | None, keys: dict, results: dict) -> None:
    """Put each compiled pair of ``results`` ({pair: (Code or error, seconds)}) in ``cache``."""
    from mlpack.codegen.errors import UnsupportedTargetError

    for pair, (code, _) in results.items():
        if cache is not None and not isinstance(code, UnsupportedTargetError):
            cache.put(keys[pair], code)


def compile_cached(cache: KernelCache | None, models, pairs, compile_all,
                   disabled=frozenset()) -> dict:
    """``compile_all(models, pairs)`` for the pairs not in ``cache``: {pair: (Code or
    UnsupportedTargetError, seconds)}. Hits take no compile at all (no worker is started when
    every pair hits); ``disabled``: the target passes ``compile_all`` leaves out."""
    out, misses, keys = lookup(cache, models, pairs, disabled)
    if misses:
        results = compile_all(models, misses)
        store(cache, keys, results)
        out.update(results)
    return {pair: out[pair] for pair in pairs}
