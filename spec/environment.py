"""Every environment variable mlpack reads, in one registry: the compiler's, the runtime's, the
C engine's (libmlpack reads its own with getenv; they are listed here too), the build's and the
tests'. ``mlpack --help`` and docs/errors-and-debugging.md list them from here, and a test fails
when the source reads one that is not here, or lists one nothing reads.

Python code reads them through ``get``, which refuses a name that is not registered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    reader: str    # compiler, runtime (Python), engine (libmlpack, C), build (wheels), tests
    meaning: str


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    Variable("MLPACK_DEBUG", "compiler",
             "0 quiet (default); 1 each pass's name and time, and the traceback of an internal "
             "error in the CLI; 2 and the IR after each pass that changed it; 3 and each cpu "
             "target's LLVM IR before optimization and its assembly after"),
    Variable("MLPACK_DISABLE_PASSES", "compiler",
             "passes to leave out, by name, comma-separated: the graph's (dce, cse, affine_gather, "
             "fuse, divide_after, scale_after, fold_scale, sums, absorb, recompute, split_dims, "
             "unflatten), the "
             "cpu target's (channels_last, rows_first, gather_operands, split_concats, winograd, "
             "point_tiles, row_blocks, "
             "and bf16_products on x86_64-v4-bf16) and the cuda target's (split_k; tiled, "
             "group_reduce: those kernels run as grids; tensor_cores)"),
    Variable("MLPACK_LLD", "compiler",
             "the ld.lld that links cpu kernel libraries (default: the one in the ziglang wheel)"),
    Variable("MLPACK_PTXAS", "compiler",
             "the ptxas that assembles cuda artifacts' PTX into cubins (default: the one in the "
             "nvidia-cuda-nvcc wheel of the cuda extra, else one on PATH; none: PTX alone)"),
    Variable("MLPACK_CACHE_DIR", "compiler",
             "the kernel cache, where mlpack build stores each target's compiled code by a digest "
             "of the graph, target, precision and compiler, and a rebuild reuses it "
             "(packager/cache.py; default: $XDG_CACHE_HOME/mlpack/kernels, else "
             "~/.cache/mlpack/kernels; mlpack build --no-cache bypasses it)"),
    Variable("MLPACK_QEMU", "compiler",
             "0: mlpack build and validate leave other architectures' artifacts unrun instead of "
             "validating them under qemu-user, where it is installed (packager/emulate.py)"),
    Variable("MLPACK_EMULATION_SECONDS", "compiler",
             "seconds mlpack build waits for each other architecture's test vectors under "
             "qemu-user (default 5; a run predicted to take longer is not started, and the "
             "artifact is written unvalidated, saying why); mlpack validate runs them to the end"),
    Variable("MLPACK_NATIVE_TARGET", "compiler",
             "the target mlpack.backend's native mode (python -m mlpack.conformance --native) "
             "compiles for instead of this host's best cpu level: cuda-emulated (the cuda "
             "lowering on this CPU), cuda-sm80 or cuda-sm90 (on a GPU)"),
    Variable("MLPACK_BACKEND", "compiler",
             "mlpack.backend's mode for ONNX's backend tests: interp (default) or native"),
    Variable("MLPACK_LIBRARY", "runtime",
             "the libmlpack.so to load (default: the one installed beside mlpack.runtime)"),
    Variable("MLPACK_LIBCUDA", "engine",
             "the CUDA driver library the engine (and Python's host probe) opens for cuda "
             "artifacts (default: libcuda.so.1); 0: never use a GPU"),
    Variable("MLPACK_CUDA_GRAPHS", "engine",
             "0: launch a cuda artifact's kernels one by one on every run, instead of replaying "
             "the CUDA graph captured on the second run of the same shapes"),
    Variable("MLPACK_NUM_THREADS", "engine",
             "threads of a run when the caller sets none (default: every core)"),
    Variable("MLPACK_TRUSTED_KEYS", "runtime",
             "the trust policy when the caller sets none: Ed25519 public keys (PEM files, or "
             "folders of .pub/.pem files) separated by ':'; a container then loads only when one "
             "of them signed it (mlpack sign), checked before any code is loaded (the engine "
             "reads it too)"),
    Variable("MLPACK_OCI_CACHE", "runtime",
             "the registry cache (runtime/registry/cache.py): blobs stored once by digest, and "
             "the containers load('oci://...') assembles from them (default: "
             "$XDG_CACHE_HOME/mlpack/oci, else ~/.cache/mlpack/oci)"),
    Variable("MLPACK_REGISTRY_USERNAME", "runtime",
             "the user name mlpack push, pull and load('oci://...') give every registry that asks "
             "(basic auth, or for a bearer token), with MLPACK_REGISTRY_PASSWORD; unset: the "
             "registry's entry in ~/.docker/config.json's auths ($DOCKER_CONFIG/config.json)"),
    Variable("MLPACK_REGISTRY_PASSWORD", "runtime",
             "the password (or access token) that goes with MLPACK_REGISTRY_USERNAME"),
    Variable("MLPACK_REGISTRY_INSECURE", "runtime",
             "registries (HOST or HOST:PORT, comma-separated) reached over plain http instead of "
             "https; localhost, 127.0.0.1 and [::1] always are"),
    Variable("MLPACK_KEY_PASSWORD", "compiler",
             "the password of an encrypted signing key (mlpack keygen encrypts with it when set; "
             "mlpack sign decrypts with it)"),
    Variable("MLPACK_PROFILE", "engine",
             "1: time every kernel dispatch of a native artifact and print where the time went "
             "when the model is closed"),
    Variable("MLPACK_WHEEL_ARCH", "build",
             "the CPU the mlpack-runtime wheel is built for: x86_64 or aarch64 (default: this "
             "host's)"),
    Variable("MLPACK_FIXTURES", "tests",
             "the folder of the C engine's test containers (runtime/c/tests; default "
             "build/fixtures)"),
    Variable("MLPACK_REAL_MODELS", "tests",
             "the cache folder of the exported real architectures (default "
             "benchmarks/.models/real)"),
)}


def get(name: str, default: str = "") -> str:
    """The value of registered variable ``name`` ("" or ``default`` when unset)."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not in spec/environment.py's registry")
    return os.environ.get(name, default)


def listing(readers=None) -> str:
    """One line per variable (of ``readers`` when given), for help texts."""
    return "\n".join(f"{v.name}: {v.meaning}" for v in VARIABLES.values()
                     if readers is None or v.reader in readers)
