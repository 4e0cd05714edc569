#!/usr/bin/env bash
# One device call: GPT-2 small's step with the committed cross-entropy (old), its backward as
# one fusion (mid), and that plus the argmax pass giving the logsumexp's shift (new), side by
# side at B=16 and 64; a trace and the optimised HLO of new at B=16.
set -u
export PYTHONUNBUFFERED=1
ROOT=$PWD
LOG=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $ROOT/.gpu/whl/*.whl >> $LOG 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $LOG
sec() { echo "=== $(date -u +%T) $1" >> $LOG; }
T="--models=gpt2_small --attention=fused --gpt2_vocab=50304 --gpt2_batch=16,64"
for v in old mid; do
  sec "GPT-2 small, $v"
  (cd $ROOT/.gpu/$v && PYTHONPATH=/tmp/site:. timeout 80 python3 -m experiments.bench.throughput \
    $T --out=$OUT/throughput_$v.json) >> $LOG 2>&1
done
sec "GPT-2 small, new (+ trace, HLO)"
(cd $ROOT && PYTHONPATH=/tmp/site:. timeout 110 python3 -m experiments.bench.throughput $T \
  --trace_dir=/tmp/trace --hlo_dir=/tmp/hlo --out=$OUT/throughput_new.json) >> $LOG 2>&1
gzip -c /tmp/hlo/gpt2_small_fused_b16.hlo.txt > $OUT/gpt2_small_fused_b16.hlo.txt.gz
f=$(find /tmp/trace -path '*b16*' -name 'perfetto_trace.json.gz' | head -1)
cp $f $OUT/trace_b16.json.gz
(cd $ROOT && PYTHONPATH=/tmp/site:. timeout 30 python3 -m experiments.bench.throughput --top_kernels=$f) 2>&1 | head -40 >> $LOG
sec "done"
