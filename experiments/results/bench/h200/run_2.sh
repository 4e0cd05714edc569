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

sec "3b. one-device study, seeds 2,3 (seed 1 and the tuning runs read back)"
cp -r $ROOT/study /tmp/study
(cd $ROOT/new && timeout 160 python3 -m experiments.sweeps.cost_vs_time \
  --config=experiments/configs/fashion_mnist.py --grid=one_device --workdir=/tmp/study \
  --seeds=1,2,3) > $OUT/study_log.txt 2>&1
echo "study rc=$?" >> $LOG
tail -3 $OUT/study_log.txt >> $LOG
(cd /tmp && tar -czf $OUT/study.tgz --exclude=checkpoints --exclude='*.npz' study) >> $LOG 2>&1

sec "5. stacked engine on one GPU, 1..16 workers"
(cd $ROOT/new && timeout 150 python3 -m experiments.bench.engine --devices=1 \
  --workers_per_device=1,2,4,8,16 --steps=10 --out=$OUT/engine.json) >> $LOG 2>&1
sec "done"
