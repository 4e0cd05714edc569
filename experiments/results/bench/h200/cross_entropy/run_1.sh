#!/usr/bin/env bash
# One device call: GPT-2 small's step before/after the fused cross-entropy backward, with a
# trace of the after step; the stacked engine at 8 and 16 workers. Each section has its own
# timeout; all write to $OUT.
set -u
export PYTHONUNBUFFERED=1
ROOT=$PWD
LOG=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $ROOT/.gpu/whl/*.whl >> $LOG 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $LOG
python3 -c "import jax, flax, optax, orbax.checkpoint, grain; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" >> $LOG 2>&1
sec() { echo "=== $(date -u +%T) $1" >> $LOG; }
T="--models=gpt2_small --attention=fused --gpt2_vocab=50304"

sec "1. GPT-2 small, before (committed code), B=16,64"
(cd $ROOT/.gpu/old && PYTHONPATH=/tmp/site:. timeout 110 python3 -m experiments.bench.throughput $T \
  --gpt2_batch=16,64 --out=$OUT/throughput_before.json) >> $LOG 2>&1

sec "2. GPT-2 small, after, B=16,32,64 (+ trace)"
(cd $ROOT && PYTHONPATH=/tmp/site:. timeout 150 python3 -m experiments.bench.throughput $T \
  --gpt2_batch=16,32,64 --trace_dir=/tmp/trace --out=$OUT/throughput_after.json) >> $LOG 2>&1
f=$(find /tmp/trace -path '*b16*' -name 'perfetto_trace.json.gz' | head -1)
echo "--- $f" >> $LOG
(cd $ROOT && PYTHONPATH=/tmp/site:. timeout 30 python3 -m experiments.bench.throughput --top_kernels=$f) 2>&1 | head -30 >> $LOG

sec "3. stacked engine on one GPU, 8 and 16 workers"
(cd $ROOT && PYTHONPATH=/tmp/site:. timeout 100 python3 -m experiments.bench.engine --devices=1 \
  --workers_per_device=8,16 --steps=10 --out=$OUT/engine.json) >> $LOG 2>&1
sec "done"
