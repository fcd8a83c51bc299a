#!/usr/bin/env bash
# The cuda target's checks on a machine with an NVIDIA GPU, in one call of the session's device
# tool (about 10 minutes): the GPU suite (tests/gpu), ONNX's node suite through cuda beside the
# cpu target, and benchmarks.cuda beside PyTorch. Each step has its own time limit and writes
# its output under $OUT as it goes, so a step that runs long costs only itself.
#
# Prepare here (the GPU machine has no network; its Python has torch, onnx, onnxruntime,
# llvmlite, typer and pytest, and CUDA's ptxas):
#     echo /.whl/ >> .git/info/exclude
#     pip wheel --no-deps ./runtime -w .whl && pip wheel --no-deps . -w .whl
# then run, carrying .whl:   bash benchmarks/gpu_session.sh
set -uo pipefail
OUT=${OUT:-/tmp/mlpack-gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MLPACK_CACHE_DIR=/tmp/mlpack-cache
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv | tee "$OUT/gpu.txt"
level=$(python3 -c "from mlpack.runtime.host import probe_cuda as p; s = p()[0] or 0; print('cuda-sm90' if s >= 90 else 'cuda-sm80')")
echo "level: $level" | tee -a "$OUT/gpu.txt"

# 1. the GPU suite: the quick models first, so a timeout still leaves most of the answer
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu -s \
    -k "mlp or bert or capsule or lstm or topk or squeezenet or shufflenet or resnet50" \
    2>&1 | tee "$OUT/gpu_suite.txt"
# 2. the benchmark beside PyTorch (resnet50 fp16 at batch 1 and 32, the BERT block, the capsule)
timeout 200 python3 -m benchmarks.cuda --json "$OUT/cuda_bench.json" --rounds 5 --runs 10 \
    2>&1 | tee "$OUT/cuda_bench.txt"
# 3. ONNX's node suite through cuda and through the cpu target, same machine
MLPACK_NATIVE_TARGET=$level timeout 150 python3 -m mlpack.conformance --native --jobs 16 \
    --json "$OUT/nodes_cuda.json" > "$OUT/nodes_cuda.txt" 2>&1
timeout 60 python3 -m mlpack.conformance --native --jobs 16 --json "$OUT/nodes_cpu.json" \
    > "$OUT/nodes_cpu.txt" 2>&1
tail -n 5 "$OUT/nodes_cuda.txt" "$OUT/nodes_cpu.txt"
# 4. the rest of the GPU suite, as time allows
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu -s \
    -k "not (mlp or bert or capsule or lstm or topk or squeezenet or shufflenet or resnet50)" \
    2>&1 | tee "$OUT/gpu_suite_rest.txt"
