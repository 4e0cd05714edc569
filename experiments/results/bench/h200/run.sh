#!/usr/bin/env bash
# One device call: GPT-2 small's step before/after, the one-device Fashion-MNIST study,
# the stacked engine at many workers. Each section has its own timeout; all write to $OUT.
set -u
export PYTHONUNBUFFERED=1
ROOT=$PWD/.gpu
LOG=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $ROOT/whl/*.whl >> $LOG 2>&1
export PYTHONPATH=/tmp/site
export ENSEMBLE_JAX_DATA_DIR=$ROOT/data
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $LOG
python3 -c "import jax, flax, optax, orbax.checkpoint, grain; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" >> $LOG 2>&1
sec() { echo "=== $(date -u +%T) $1" >> $LOG; }

sec "1. GPT-2 small, before (committed code), B=16"
(cd $ROOT/old && timeout 110 python3 -m experiments.bench.throughput --models=gpt2_small \
  --attention=fused --gpt2_vocab=50304 --gpt2_batch=16 --out=$OUT/throughput_before.json) >> $LOG 2>&1

sec "2. GPT-2 small, after, B=16,32,64 (+ trace)"
(cd $ROOT/new && timeout 150 python3 -m experiments.bench.throughput --models=gpt2_small \
  --attention=fused --gpt2_vocab=50304 --gpt2_batch=16,32,64 --trace_dir=/tmp/trace \
  --out=$OUT/throughput_after.json) >> $LOG 2>&1
for f in $(find /tmp/trace -name '*.trace.json.gz' -o -name 'perfetto_trace.json.gz' | sort); do
  echo "--- $f" >> $LOG
  (cd $ROOT/new && timeout 30 python3 -m experiments.bench.throughput --top_kernels=$f) 2>&1 | head -22 >> $LOG
done

sec "3. Fashion-MNIST on one device: grid one_device, seed 1 (tuning seed 0 at the full grid's choices)"
(cd $ROOT/new && timeout 250 python3 -m experiments.sweeps.cost_vs_time \
  --config=experiments/configs/fashion_mnist.py --grid=one_device --workdir=/tmp/study \
  --seeds=1) > $OUT/study_log.txt 2>&1
echo "study rc=$?" >> $LOG
tail -5 $OUT/study_log.txt >> $LOG
(cd /tmp && tar -czf $OUT/study.tgz --exclude=checkpoints --exclude='*.npz' study) >> $LOG 2>&1

sec "4. ResNet-50 after (B=256), and GPT-2 B=32 without Triton GEMMs"
(cd $ROOT/new && timeout 70 python3 -m experiments.bench.throughput --models=resnet50 \
  --out=$OUT/throughput_resnet50.json) >> $LOG 2>&1
(cd $ROOT/new && XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 60 python3 -m \
  experiments.bench.throughput --models=gpt2_small --attention=fused --gpt2_vocab=50304 \
  --gpt2_batch=32 --out=$OUT/throughput_no_triton_gemm.json) >> $LOG 2>&1

sec "5. stacked engine on one GPU, 1..32 workers"
(cd $ROOT/new && timeout 90 python3 -m experiments.bench.engine --devices=1 \
  --workers_per_device=1,2,4,8,16,32 --steps=20 --out=$OUT/engine.json) >> $LOG 2>&1
sec "done"
