"""LLVM IR text -> object code: the optimization pipeline and the backend, for one module in
this process, or for a target's parts at once in helper processes.

LLVM's optimizer and backend are most of a cpu target's compile, and llvmlite serializes every
call into LLVM behind one lock per process, so the parts of a target (module.py's ``split``)
run in separate processes: part 0 here, each other part in a helper that is this file run as a
script (``python objects.py IN.json``). The helper imports llvmlite and nothing of mlpack, so it
starts in a tenth of a second. Each part's object is linked with the others into one library
(link.py). A helper ignores Ctrl-C (the build process answers it) and dies with its parent
(Linux's parent-death signal), so an interrupted build leaves none running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading

import llvmlite.binding as llvm

SPEED_LEVEL = 2   # LLVM's optimization level (the backend's stays 3: it measured the same)
_INIT = threading.Lock()
_initialized = False


def init_llvm() -> None:
    global _initialized
    with _INIT:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


def machine(triple: str, cpu: str, features: str):
    """The target machine every part of a target is emitted with (PIC, generic CPU)."""
    init_llvm()
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="pic", codemodel="default")


def optimize(text: str, tm):
    """Parse and verify ``text``, run the O2 pipeline with both vectorizers: the module."""
    mod = llvm.parse_assembly(text)
    mod.verify()
    # O2, not O3: the kernels come unrolled and blocked as written, and O3's extra passes
    # (aggressive instcombine, argument promotion, more unswitching) bought no speed on any
    # model measured, at up to twice LLVM's time (aarch64; docs/decisions.md, "Compile time")
    pto = llvm.create_pipeline_tuning_options(speed_level=SPEED_LEVEL)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    # The unroller stays on for maps and reductions; the loops whose bodies are written
    # unrolled (micro-kernel tiles, depthwise windows) carry llvm.loop.unroll.disable
    # (codegen/llvm/loops.py), where unrolling only cost compile time (decisions.md)
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def emit_parts(texts: list[str], triple: str, cpu: str, features: str, log=None) -> list[bytes]:
    """The object code of each module text, the first here and the others in helpers running at
    the same time. ``log(mod, tm)``: called with each module optimized here (the debug dump)."""
    tm = machine(triple, cpu, features)
    if len(texts) == 1:
        mod = optimize(texts[0], tm)
        if log:
            log(mod, tm)
        return [tm.emit_object(mod)]
    with tempfile.TemporaryDirectory(prefix="mlpack-llvm-") as tmp:
        helpers = []
        for i, text in enumerate(texts[1:], 1):
            src, out = os.path.join(tmp, f"part{i}.ll"), os.path.join(tmp, f"part{i}.o")
            with open(src, "w") as f:
                f.write(text)
            job = os.path.join(tmp, f"part{i}.json")
            with open(job, "w") as f:
                json.dump({"triple": triple, "cpu": cpu, "features": features, "ir": src,
                           "object": out}, f)
            helpers.append((subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__),
                                              job], stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE),
                            out))
        try:
            mod = optimize(texts[0], tm)
            if log:
                log(mod, tm)
            objects = [tm.emit_object(mod)]
        except BaseException:
            for proc, _ in helpers:
                proc.kill()
                proc.wait()
            raise
        for i, (proc, out) in enumerate(helpers, 1):
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"LLVM failed on part {i} of {len(texts)} (exit status "
                                   f"{proc.returncode}): {err.decode(errors='replace').strip()}")
            with open(out, "rb") as f:
                objects.append(f.read())
        return objects


def _helper(job_path: str) -> None:
    """A helper's work: one part's IR file -> its object file."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):   # die with the compile that started us
        import ctypes

        parent = os.getppid()
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            sys.exit(1)
    with open(job_path) as f:
        job = json.load(f)
    with open(job["ir"]) as f:
        text = f.read()
    tm = machine(job["triple"], job["cpu"], job["features"])
    obj = tm.emit_object(optimize(text, tm))
    with open(job["object"], "wb") as f:
        f.write(obj)


if __name__ == "__main__":
    _helper(sys.argv[1])
