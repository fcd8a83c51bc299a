"""LLVM IR -> PTX (llvmlite's NVPTX backend), and PTX -> cubin with ptxas where it is installed.

ptxas is NVIDIA's assembler. It ships in the ``nvidia-cuda-nvcc`` wheels (``pip install
'mlpack[cuda]'``); MLPACK_PTXAS names another one, and one on PATH (a CUDA toolkit) is used
when neither is there. Without it a cuda artifact carries PTX alone, which the driver compiles
when the artifact is loaded (a one-time cost the driver caches); with it, the build also checks
that every kernel assembles and stores a cubin for the level's SM, which the engine loads
directly on a GPU of that SM family.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from importlib import util

import llvmlite.binding as llvm

from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.targets.cpu.objects import init_llvm, optimize
from mlpack.codegen.targets.cuda.target import TRIPLE, CudaTarget
from mlpack.spec import environment


def machine(t: CudaTarget):
    init_llvm()
    return llvm.Target.from_triple(TRIPLE).create_target_machine(
        cpu=t.arch, features=t.ptx_feature, opt=3)


def emit_ptx(text: str, t: CudaTarget) -> str:
    """The PTX of the module ``text`` for level ``t``, optimized at O3."""
    tm = machine(t)
    return tm.emit_assembly(optimize(text, tm))


def find_ptxas() -> str | None:
    """The ptxas to run: MLPACK_PTXAS, the nvidia-cuda-nvcc wheel's, or one on PATH; None."""
    named = environment.get("MLPACK_PTXAS")
    if named:
        return named
    spec = util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        # nvidia-cuda-nvcc-cu12 installs nvidia/cuda_nvcc/bin, nvidia-cuda-nvcc (13) nvidia/cu13/bin
        for path in sorted(glob.glob(os.path.join(root, "*", "bin", "ptxas"))):
            if os.access(path, os.X_OK):
                return path
    return shutil.which("ptxas")


def ptxas_version(ptxas: str) -> str:
    """``ptxas --version``'s release line ("Cuda compilation tools, release 12.9, V12.9.86")."""
    out = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines() if "release" in ln]
    return lines[-1].strip() if lines else out.strip()


def assemble(ptx: str, t: CudaTarget, ptxas: str) -> bytes:
    """The cubin of ``ptx`` for level ``t``'s SM. Raises UnsupportedTargetError with ptxas's
    message when it refuses the PTX (a defect of the lowering, not of the model)."""
    with tempfile.TemporaryDirectory(prefix="mlpack-ptxas-") as tmp:
        src, out = os.path.join(tmp, "kernels.ptx"), os.path.join(tmp, "kernels.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [ptxas, f"-arch={t.arch}", "-O3", src, "-o", out]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise UnsupportedTargetError(
                f"{t.name}: ptxas refused the PTX ({ptxas}): {proc.stderr.strip()[:2000]}")
        with open(out, "rb") as f:
            return f.read()
