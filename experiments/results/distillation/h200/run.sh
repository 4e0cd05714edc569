#!/usr/bin/env bash
# One device call: distribution matching on Fashion-MNIST at the papers' protocol (20,000
# iterations, 256 real images per class, 5 ConvNets x 1,000 epochs per set), each set's
# distillation capped at BUDGET seconds of wall clock; the whole-set and random-real rows.
# Everything lands in $OUT as it is measured.
set -u
export PYTHONUNBUFFERED=1
ROOT=$PWD/.gpu
LOG=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $ROOT/whl/*.whl >> $LOG 2>&1
export PYTHONPATH=/tmp/site:$PWD
export ENSEMBLE_JAX_DATA_DIR=$ROOT/data
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $LOG
python3 -c "import jax, flax, optax, ml_collections; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" >> $LOG 2>&1
echo "=== $(date -u +%T) start" >> $LOG
timeout ${LIMIT:-540} python3 -m experiments.distillation_check --ipc=10,1,50 \
  --budget_s=${BUDGET:-100} --out=$OUT/results.json >> $LOG 2>&1
echo "=== $(date -u +%T) rc=$?" >> $LOG
