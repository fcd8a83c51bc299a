"""The zig target libmlpack is compiled for on each CPU: ``{arch}-linux-gnu.{glibc}``.

One place for everything that builds the engine for a CPU: the runtime wheel (runtime/setup.py),
the C programs that validate other CPUs' artifacts under qemu (packager/emulate.py), and the
cross builds of runtime/c/cross.mk and examples/c/Makefile (which run this file as a script:
``python zig_target.py riscv64`` prints ``riscv64-linux-gnu.2.27``).

glibc 2.17 is the oldest libmlpack supports (the manylinux2014 wheels' floor); riscv64's glibc
starts at 2.27. The library links dynamically against glibc, which the loader needs (dlopen of a
kernel library's memfd).
"""

from __future__ import annotations

import sys

GLIBC = {"x86_64": "2.17", "aarch64": "2.17", "riscv64": "2.27"}


def zig_target(arch: str) -> str:
    """zig's ``-target`` for CPU ``arch`` (x86_64, aarch64, riscv64)."""
    try:
        return f"{arch}-linux-gnu.{GLIBC[arch]}"
    except KeyError:
        raise ValueError(f"libmlpack is not built for CPU {arch!r}; CPUs: {', '.join(GLIBC)}") from None


if __name__ == "__main__":
    try:
        print(zig_target(sys.argv[1] if len(sys.argv) > 1 else ""))
    except ValueError as e:
        sys.exit(str(e))
