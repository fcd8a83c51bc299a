"""Artifacts of another architecture, validated under qemu-user.

``mlpack validate`` and ``mlpack build`` run each artifact this host can run through libmlpack;
an artifact this host cannot run only because it is another architecture's (aarch64 or riscv64
on x86-64) runs here instead: runtime/c/tools/mlpack_vectors.c, a small program over libmlpack, is
cross-compiled with zig's C compiler for that architecture and run under qemu-user with the
architecture's glibc as its sysroot (``qemu-aarch64 -L /usr/aarch64-linux-gnu``), once per
artifact for all of its test cases. Its outputs are judged by ``judge_vectors``, the function
``Model.validate`` judges native outputs with: the same float64 reference, measures and
tolerance, the same ``ValidationResult`` (its ``emulator`` says which qemu ran it).

Each architecture is one row of ``EMULATORS``: the zig target the program is compiled for, the
qemu-user program and its CPU options, the sysroot and its dynamic loader, and the Debian
packages that install them. The program is compiled once per source, compiler and target, into
``$XDG_CACHE_HOME/mlpack/qemu`` (default ``~/.cache/mlpack/qemu``), named by a hash of all of
those, so an edit to libmlpack compiles it again.

Where an architecture cannot be run (no qemu, no sysroot, no zig, no C sources beside
mlpack.runtime, which a checkout and the runtime wheel both have; or ``MLPACK_QEMU=0``, for
models whose runs would take minutes under qemu), ``missing`` says why and the artifact is skipped as before, with that reason. This module
is the compiler's, not the runtime's: it needs zig (the ``ziglang`` wheel, a dependency of the
compiler only) and libmlpack's C sources.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlpack.spec import environment
from mlpack.spec.container import Artifact, open_container
from mlpack.spec.errors import Error
from mlpack.spec.ir import dtypes
from mlpack.runtime.zig_target import zig_target


@dataclass(frozen=True)
class Emulator:
    """How to run the artifacts of one architecture under qemu-user."""

    arch: str        # the OCI architecture of the artifacts it runs ("arm64")
    zig_target: str  # what zig cc compiles the program for (glibc version included)
    qemu: str        # the qemu-user program
    sysroot: str     # the architecture's glibc (qemu's -L)
    loader: str      # the dynamic loader inside the sysroot: proof the glibc is there
    packages: tuple[str, str]  # the Debian packages of the qemu and of the sysroot
    cpu: tuple[str, ...] = ()  # qemu's options for a CPU with every feature the target needs

    def command(self, program: Path) -> list[str]:
        """The command line that runs ``program`` under qemu."""
        return [find_qemu(self.qemu) or self.qemu, *self.cpu, "-L", self.sysroot, str(program)]


# zig targets as the runtime wheel's (runtime/zig_target.py); qemu 7's rv64 CPU has no vector
# unit unless asked
EMULATORS = {e.arch: e for e in (
    Emulator("arm64", zig_target("aarch64"), "qemu-aarch64", "/usr/aarch64-linux-gnu",
             "lib/ld-linux-aarch64.so.1", ("qemu-user", "libc6-arm64-cross")),
    Emulator("riscv64", zig_target("riscv64"), "qemu-riscv64", "/usr/riscv64-linux-gnu",
             "lib/ld-linux-riscv64-lp64d.so.1", ("qemu-user", "libc6-riscv64-cross"),
             ("-cpu", "rv64,v=true,vlen=128,vext_spec=v1.0")),
)}

FLAGS = ("-std=c11", "-O2", "-s")
LIBS = ("-ldl", "-lpthread", "-lm")
PROGRAM = "mlpack_vectors"
STALE_DAYS = 30  # cached programs of other sources unused this long are removed


class NotEmulated(Error):
    """The artifact was not run under qemu: the message says why (no program could be built,
    or the emulated host cannot run it either). Callers list it as skipped, not as failed."""


def find_qemu(name: str) -> str | None:
    """The path of qemu-user program ``name`` on PATH; None when it is not installed."""
    return shutil.which(name)


def emulator_for(art: Artifact, host_arch: str) -> Emulator | None:
    """The row that runs ``art`` when it is a Linux artifact of another architecture than the
    host's that a row covers; None otherwise (portable, this architecture, or none known)."""
    p = art.platform or {}
    if p.get("os") != "linux" or p.get("architecture") in (None, host_arch):
        return None
    return EMULATORS.get(p["architecture"])


def missing(emu: Emulator) -> str:
    """Why this host cannot run ``emu``'s artifacts under qemu; "" when it can."""
    if environment.get("MLPACK_QEMU") == "0":  # a big model's runs take minutes under qemu
        return "MLPACK_QEMU=0"
    if platform.system() != "Linux":
        return f"{emu.qemu} runs Linux programs on Linux only"
    if not find_qemu(emu.qemu):
        return f"{emu.qemu} was not found (Debian package {emu.packages[0]})"
    if not (Path(emu.sysroot) / emu.loader).exists():
        return (f"no {emu.arch} glibc in {emu.sysroot} for {emu.qemu} (Debian package "
                f"{emu.packages[1]})")
    if importlib.util.find_spec("ziglang") is None:
        return f"zig's C compiler (the ziglang wheel) is not installed to build for {emu.qemu}"
    if _sources() is None:
        return (f"libmlpack's C sources are not installed, to build for {emu.qemu} (a checkout "
                "has them: pip install -e ./runtime)")
    return ""


# ---------------------------------------------------------------- the program


def _sources() -> Path | None:
    """runtime/c beside mlpack.runtime (a checkout, or the runtime wheel); None without it."""
    import mlpack.runtime

    c = Path(mlpack.runtime.__file__).resolve().parent / "c"
    return c if (c / "tools" / f"{PROGRAM}.c").is_file() and (c / "src").is_dir() else None


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlpack" / "qemu"


def _key(emu: Emulator, c: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for part in (importlib.metadata.version("ziglang"), emu.zig_target, *FLAGS, *LIBS):
        h.update(part.encode() + b"\0")
    for f in files:
        h.update(str(f.relative_to(c)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def program(emu: Emulator, progress=None) -> Path:
    """The program for ``emu``'s architecture, compiled into the cache the first time (a few
    seconds; ``progress`` is told). NotEmulated when it cannot be."""
    c = _sources()
    if c is None:
        raise NotEmulated(missing(emu) or "libmlpack's C sources are not installed")
    sources = sorted((c / "src").glob("*.c")) + [c / "tools" / f"{PROGRAM}.c"]
    files = sources + sorted((c / "src").glob("*.h")) + sorted((c / "include").glob("*.h")) \
        + sorted((c / "vendor").rglob("*.[ch]"))   # src/monocypher.c includes the vendored copy
    folder = _cache() / f"{emu.zig_target}-{_key(emu, c, files)}"
    exe = folder / PROGRAM
    if exe.is_file():
        os.utime(folder)  # in use: not stale
        return exe
    if progress:
        progress(f"  compiling libmlpack for {emu.qemu} (once, into {folder.parent})")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(prefix=f".{PROGRAM}.", dir=folder)
        os.close(fd)
    except OSError as e:
        raise NotEmulated(f"cannot write the cache folder {folder} to build for {emu.qemu}: "
                          f"{e.strerror or e}") from None
    try:
        cmd = [sys.executable, "-m", "ziglang", "cc", "-target", emu.zig_target, *FLAGS,
               f"-I{c / 'include'}", f"-I{c / 'src'}", *map(str, sources), "-o", scratch, *LIBS]
        proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise NotEmulated(f"zig cc could not build libmlpack for {emu.qemu}: "
                              + " / ".join(tail))
        os.chmod(scratch, 0o755)
        os.replace(scratch, exe)  # atomic: a build beside this one finds a whole file or none
    finally:
        _remove(scratch)
    _prune(folder)
    return exe


def _prune(keep: Path) -> None:
    """Remove the programs of other sources not used for STALE_DAYS (an old checkout's)."""
    cutoff = time.time() - STALE_DAYS * 86400
    for old in keep.parent.iterdir():
        try:
            if old != keep and old.is_dir() and old.stat().st_mtime < cutoff:
                shutil.rmtree(old)
        except OSError:  # another process's, or gone already: not ours to insist on
            pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------- running and judging


def validate(path: str, art: Artifact, reason: str, emu: Emulator, progress=None,
             timeout: float | None = None, trusted_keys: str | None = None, runs=None,
             predicted: float | None = None, cases: list | None = None):
    """Run ``art``'s test vectors under ``emu`` and judge them as ``Model.validate`` does: a
    ``ValidationResult`` with ``emulator`` set. ``reason`` is this host's verdict on the artifact.
    NotEmulated when it could not be run under qemu at all, or not within ``timeout`` seconds;
    another ``Error``, the engine's message or the signal that killed the program, when it ran
    and failed. ``trusted_keys`` is the emulated engine's trust policy (None: this process's
    MLPACK_TRUSTED_KEYS; "": none, for a build checking the file it just wrote). ``runs``: a
    store of earlier runs' outputs (packager/cache.py's get_outputs/put_outputs), by run_key.
    ``predicted``: the seconds the run is expected to take (packager/validation.py); one
    expected past ``timeout`` is not started (NotEmulated, stored in ``runs`` as a run over the
    limit is). ``cases``: the artifact's vectors where the caller has read them (else they are
    read from ``path``: a big model's container takes a second to parse)."""
    from mlpack.runtime.model import judge_vectors, vector_cases

    exe = program(emu, progress)
    if cases is None:
        with open_container(path, verify=False) as container:  # the caller's open verified it
            cases = vector_cases(container, art)

    def run():
        if predicted is not None and timeout is not None and predicted > timeout:
            raise NotEmulated(f"its {_count(cases)} would take about {predicted:.0f} s "
                              f"under {emu.qemu} (from a run on this host), over a build's "
                              f"limit of {timeout:g} s; mlpack validate runs them")
        return _run(exe, path, art, cases, emu, timeout, trusted_keys)

    if not cases:
        got = []
    elif runs is None:
        got = run()
    else:
        key = run_key(exe, art, emu, timeout, trusted_keys, len(cases))
        got = runs.get_outputs(key)
        if isinstance(got, str):
            raise NotEmulated(got)
        if got is None:
            try:
                got = run()
            except NotEmulated as e:   # (a run over the timeout included: it would be again)
                runs.put_outputs(key, str(e))
                raise
            runs.put_outputs(key, got)
    return judge_vectors(art, cases, got, reason, emu.qemu)


def _count(cases: list) -> str:
    return "test case" if len(cases) == 1 else f"{len(cases)} test cases"


def run_key(exe: Path, art: Artifact, emu: Emulator, timeout, trusted_keys,
            cases: int | None = None) -> str:
    """What an emulated run's outputs follow from: the program (its folder is named by a hash
    of libmlpack's sources and compiler), the qemu command and its binary, the artifact's
    manifest digest (config, code, weights and vectors), the time limit and trust policy, and
    how many of its cases it runs (a build runs the first that fit its limit)."""
    qemu = find_qemu(emu.qemu) or emu.qemu
    try:
        st = os.stat(qemu)
        qemu += f" {st.st_size} {st.st_mtime_ns}"
    except OSError:
        pass
    parts = [str(exe), *emu.command(exe), qemu, art.descriptor.get("digest", ""), str(timeout),
             _absolute_keys(trusted_keys), str(cases)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _absolute_keys(trusted_keys: str | None) -> str:
    """The trust policy for the emulated engine (which reads MLPACK_TRUSTED_KEYS and runs in a
    scratch folder): the caller's, else this process's, with every path made absolute."""
    spec = trusted_keys if trusted_keys is not None else environment.get("MLPACK_TRUSTED_KEYS")
    return os.pathsep.join(os.path.abspath(p) for p in spec.split(os.pathsep) if p)


def _run(exe: Path, path: str, art: Artifact, cases: list, emu: Emulator,
         timeout: float | None = None, trusted_keys: str | None = None) -> list[dict]:
    """The artifact's outputs on each case, by name, from one run of the program under qemu."""
    inputs = art.config["model"]["inputs"]
    outputs = [o["name"] for o in art.config["model"]["outputs"]]
    with tempfile.TemporaryDirectory(prefix="mlpack-qemu-") as tmp:
        lines = [str(len(cases))]
        for c, (feeds, _, _) in enumerate(cases):
            for k, sig in enumerate(inputs):
                a = _input(feeds, sig, c)
                lines.append(" ".join(map(str, (a.ndim, *a.shape))))
                a.tofile(os.path.join(tmp, f"{c}.{k}.in"))
        Path(tmp, "cases").write_text("\n".join(lines) + "\n")
        cmd = [*emu.command(exe), os.path.abspath(path), str(art.index), tmp]
        # in the scratch folder: qemu writes a crashed program's core file into its cwd
        try:
            env = dict(os.environ, MLPACK_TRUSTED_KEYS=_absolute_keys(trusted_keys))
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=timeout,
                                  env=env)
        except subprocess.TimeoutExpired:
            raise NotEmulated(f"its vectors ran over {timeout:g} s under {emu.qemu} (a build's "
                              "limit; mlpack validate runs them to the end)") from None
        if proc.returncode == 3:  # the emulated host cannot run it either: its verdict says why
            why = proc.stdout.strip().removeprefix("passed-over ").removeprefix("passed over: ")
            raise NotEmulated(f"{emu.qemu} passes it over too: {why}")
        crash = _emulator_crash(proc, emu)
        if crash:
            raise NotEmulated(crash)
        if proc.returncode != 0:
            raise Error(_failure(proc))
        got = [{} for _ in cases]
        for line in proc.stdout.splitlines():
            word = line.split()
            if word[:1] != ["output"]:
                continue
            c, k, dtype, rank = int(word[1]), int(word[2]), word[3], int(word[4])
            shape = tuple(int(d) for d in word[5:5 + rank])
            a = np.fromfile(os.path.join(tmp, f"{c}.{k}.out"), dtype=dtypes.to_numpy(dtype))
            got[c][outputs[k]] = a.reshape(shape)
    if any(len(g) != len(outputs) for g in got):
        raise Error(f"{PROGRAM} wrote {sum(map(len, got))} of the {len(cases) * len(outputs)} "
                    "outputs it owes")
    return got


def _input(feeds: dict, sig: dict, case: int) -> np.ndarray:
    """Input ``sig`` of a case, as the program reads it: C order, the signature's dtype."""
    name = sig["name"]
    if name not in feeds:
        raise Error(f"test case {case} has no input {name!r}")
    a = np.ascontiguousarray(feeds[name])
    want = dtypes.to_numpy(sig["dtype"])
    if a.dtype != want:
        raise Error(f"test case {case}: input {name!r} is {a.dtype}, the model takes {want}")
    return a


def _emulator_crash(proc: subprocess.CompletedProcess, emu: Emulator) -> str | None:
    """Why the run says nothing about the artifact, when qemu itself failed: an assertion of
    its own on stderr (qemu 7.2's RISC-V translator aborts on some vector code, ``decode_save_opc:
    Assertion `ctx->insn_start != NULL'``, qemu issue 1441, fixed in qemu 8.1), whatever signal
    the program then dies of. None when the program ran (or failed) on its own."""
    if proc.returncode == 0:
        return None
    own = [ln.strip() for ln in proc.stderr.splitlines()
           if ln.startswith(f"{os.path.basename(emu.qemu)}:") and "Assertion" in ln]
    if not own:
        return None
    return (f"{emu.qemu} itself failed ({own[0]}), a bug of this qemu, not of the artifact; "
            "validate it on such a machine or under a newer qemu")


def _failure(proc: subprocess.CompletedProcess) -> str:
    """What went wrong in a failed run, in one line: the engine's message, or the signal."""
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        return f"the program was killed by {name}"
    text = " ".join(ln.strip() for ln in proc.stderr.splitlines() if ln.strip())
    return text.removeprefix(f"{PROGRAM}: ") or f"exit status {proc.returncode}"


__all__ = ["Emulator", "EMULATORS", "NotEmulated", "find_qemu", "emulator_for", "missing",
           "program", "validate"]
