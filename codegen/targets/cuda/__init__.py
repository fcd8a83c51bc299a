"""The cuda target: NVIDIA GPUs through PTX (llvmlite's NVPTX backend) and, where ptxas is
installed, cubins for each SM level (target.py names them, compile.py builds an artifact).

Kernels are the cpu target's kernels (codegen/targets/cpu/kernels.py: one per comprehension,
epilogues fused) mapped onto a grid of threads (lower.py), procedures run by one thread, and the
plan is the cpu target's plan format (spec/SPEC.md section 7) with one workgroup per thread
block. The same kernel bodies also compile for the build host's CPU with each block's threads
run in turn (module.py, the ``cuda-emulated`` target), which is how the lowering is checked
against the float64 reference on machines without a GPU.
"""
