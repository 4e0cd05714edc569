#!/usr/bin/env bash
# One device call: GPT-2 small (this code) at B=64 and 128, and at B=16 and 64 with XLA's
# cuBLASLt GEMMs (bias and activation epilogues fused into the GEMM where XLA can).
set -u
export PYTHONUNBUFFERED=1
ROOT=$PWD
LOG=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $ROOT/.gpu/whl/*.whl >> $LOG 2>&1
sec() { echo "=== $(date -u +%T) $1" >> $LOG; }
T="--models=gpt2_small --attention=fused --gpt2_vocab=50304"
sec "GPT-2 small, B=64,128"
(PYTHONPATH=/tmp/site:. timeout 90 python3 -m experiments.bench.throughput $T --gpt2_batch=64,128 \
  --out=$OUT/throughput_b128.json) >> $LOG 2>&1
sec "GPT-2 small, B=16,64, --xla_gpu_enable_cublaslt=true"
(PYTHONPATH=/tmp/site:. XLA_FLAGS=--xla_gpu_enable_cublaslt=true timeout 80 python3 -m \
  experiments.bench.throughput $T --gpt2_batch=16,64 --out=$OUT/throughput_cublaslt.json) >> $LOG 2>&1
sec "done"
