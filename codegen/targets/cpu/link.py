"""Object file -> ELF shared object, with the ld.lld that ships in the ``ziglang`` wheel.

``--no-undefined`` makes the link fail if the code needs any symbol it does not define (a libm
call slipping in, say), so a library that links imports nothing. The output is deterministic:
no build id, no timestamps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.spec import environment

LLD_FLAGS = ("-shared", "--no-undefined", "--build-id=none", "-z", "noexecstack",
             "-z", "relro", "-z", "now", "--hash-style=both", "-O1")


def lld_command() -> list[str]:
    """The command that runs ld.lld (overridable with MLPACK_LLD, e.g. a system ld.lld)."""
    override = environment.get("MLPACK_LLD")
    if override:
        return override.split()
    return [sys.executable, "-m", "ziglang", "ld.lld"]


def link_shared(objs: bytes | list[bytes], soname: str = "libmlpack_kernels.so") -> bytes:
    """Link relocatable objects (a module's parts: module.py) into one shared object and return
    its bytes."""
    objs = [objs] if isinstance(objs, bytes) else objs
    with tempfile.TemporaryDirectory(prefix="mlpack-link-") as tmp:
        srcs = [os.path.join(tmp, f"kernels{i}.o" if i else "kernels.o") for i in range(len(objs))]
        out = os.path.join(tmp, "kernels.so")
        for src, obj in zip(srcs, objs):
            with open(src, "wb") as f:
                f.write(obj)
        cmd = [*lld_command(), *LLD_FLAGS, "-soname", soname, "-o", out, *srcs]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise UnsupportedTargetError(
                f"cpu: linking the kernel library failed ({' '.join(cmd[:4])} ...): "
                f"{proc.stderr.strip() or proc.stdout.strip()}")
        with open(out, "rb") as f:
            return f.read()
