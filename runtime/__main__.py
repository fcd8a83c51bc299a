"""``python -m mlpack.runtime``: where libmlpack and mlpack.h are, for building C programs.

    cc -O2 main.c -o main $(python -m mlpack.runtime --cflags --libs)

``--cflags`` is the include flag, ``--libs`` links the shared libmlpack with an rpath to its
folder (the program finds it without LD_LIBRARY_PATH), ``--version`` is the engine's version.
"""

import argparse
import os
import sys

from mlpack.spec.errors import Error

from mlpack.runtime import native


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlpack.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("--cflags", action="store_true", help="compiler flags: -I for mlpack.h")
    parser.add_argument("--libs", action="store_true", help="linker flags for libmlpack.so, with an rpath")
    parser.add_argument("--version", action="store_true", help="the version of the libmlpack found")
    args = parser.parse_args(argv)
    if not (args.cflags or args.libs or args.version):
        parser.print_help()
        return 2
    try:
        words = []
        if args.version:
            words.append(native.version())
        if args.cflags:
            words.append(f"-I{native.include_dir()}")
        if args.libs:
            path = native.library_path()
            if path is None:
                raise Error("libmlpack is not built: install mlpack-runtime (pip install ./runtime in a checkout)")
            folder = os.path.dirname(os.path.abspath(path))
            words += [f"-L{folder}", f"-Wl,-rpath,{folder}", "-lmlpack"]
    except Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(" ".join(words))
    return 0


if __name__ == "__main__":
    sys.exit(main())
