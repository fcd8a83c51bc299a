#!/bin/bash
# every precision on x86-64 v4 (+bf16, +vnni) and aarch64 (+bf16, +dotprod, +i8mm), validated
# here and under qemu-aarch64 to the end (mlpack validate), per model of the benchmark set;
# containers go to $OUT (default /tmp). benchmarks/RESULTS.md records a run.
#     bash benchmarks/precision_matrix.sh > matrix.log
#     bash benchmarks/precision_matrix.sh mlp bert_block > matrix.log   # those models only
set -u
cd "$(dirname "$0")/.."
ALL="mlp bert_block squeezenet shufflenet capsule_einsum inception_v1 resnet50 densenet121 inception_v2"
for m in ${@:-$ALL}; do
  f=$(python -c "from benchmarks import models; print(models.materialize('$m'))")
  echo "=== $m $(date -u +%T)"
  mlpack build $f -o ${OUT:-/tmp}/$m.mlpack -t x86_64-v4 -t x86_64-v4-bf16 -t x86_64-v4-vnni \
     -t aarch64 -t aarch64-bf16 -t aarch64-dotprod -t aarch64-i8mm -p all --quiet 2>&1 | tail -3
  timeout 900 mlpack validate ${OUT:-/tmp}/$m.mlpack 2>&1 | tail -20
done
echo "=== done $(date -u +%T)"
