# Set-up is part of every target: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdirs
# Test workers: on 2 cores a third fills them while the others wait on child processes
# (measured: make test 8 min 44 s against 9 min 44 s with 2, back to back).
PYTEST_WORKERS ?= 3
# The committed CPU results ran on 8 simulated devices (XLA's host platform), so the demo and
# the sweeps do too: the same layouts, the same numbers. The tests set their own; on a GPU
# or TPU host the flag leaves the accelerators as they are.
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
# Every Python process here imports jax: from cached bytecode, not its sources compiled anew
# (measured: the package's import 7.1 s with PYTHONDONTWRITEBYTECODE=1, 3.0 s with the
# bytecode written once; each test worker, child process and notebook kernel imports it).
# An environment that forbids writing bytecode gets it written for the targets below.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: install install-test data test test-fast test-slurm demo sweep-fashion sweep-pydocs sweep-pydocs-kd sweep-samplers critical-batch many-workers \
	projection docs ceilings ladder ladder-pydocs lipt pile pile-run imagenet imagenet-run study clean

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# uv installs what pip would (tools/uv_flags.py passes on pip's local wheels and
# constraints), several times faster; where uv cannot, pip does. The demo needs the
# package only; the tests add their extras (torch, transformers, Jupyter).
UV_INSTALL = $(PY) -m uv pip install -q --python $(PY) $$($(PY) tools/uv_flags.py)

$(VENV)/.installed: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv
	$(UV_INSTALL) -e . || $(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(UV_INSTALL) -e ".[test]" || $(PY) -m pip install -q -e ".[test]"
	touch $@

# Embedded offline datasets from Debian packages (no root): Fashion-MNIST, Python docs.
data: install
	$(PY) -m ensemble_jax.data.fetch

# The whole suite but the SLURM tier; test-fast is its unit tier (each test file's
# pytestmark), for the edit-run loop.
test: install-test data
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=25 -m "not slurm" tests

# The study on a SLURM cluster started on this host (tests/slurm_cluster.py: as root, with
# Debian's slurm-wlm and munge, installed if missing; one line says why it skips elsewhere).
test-slurm: install-test data
	$(PY) -m pytest -q -rs --durations=5 -m slurm tests

test-fast: install-test data
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=10 -m "unit and not slow" tests

demo: install data
	$(PY) -m experiments.demo --workdir=$(WORKDIR)/demo

# The cost-vs-time grids, resumable, written to experiments/results/<workload>: every point
# tuned on seed 0, then reported on seeds 1-3 (seeds that played no part in the choice).
# $(call study_of,CONFIG,GRID,WORKDIR,CALIBRATED): CONFIG's GRID as a cost-vs-time study in
# experiments/results/WORKDIR, seeds 1-3, its steps priced by CALIBRATED's device timings.
study_of = $(PY) -m experiments.sweeps.cost_vs_time --config=experiments/configs/$(1).py \
	  --grid=$(2) --workdir=experiments/results/$(3) --seeds=1,2,3 \
	  --calibration=experiments/results/$(4)/calibration

sweep-fashion: install data
	$(PY) -m experiments.sweeps.cost_vs_time --config=experiments/configs/fashion_mnist.py \
	  --workdir=experiments/results/fashion_mnist --seeds=1,2,3

sweep-pydocs: install data
	$(PY) -m experiments.sweeps.cost_vs_time --config=experiments/configs/pydocs_gpt2.py \
	  --workdir=experiments/results/pydocs_gpt2 --seeds=1,2,3

# Knowledge distillation: the ensemble's points taught by the full grid's strongest
# data-parallel run (pydocs_gpt2.KD_TEACHER, its training charged); after sweep-pydocs.
sweep-pydocs-kd: install data
	$(call study_of,pydocs_gpt2,kd,pydocs_gpt2_kd,pydocs_gpt2)

# Where the claim could hold: many-worker ensembles, N = 2 .. 64 (Fashion-MNIST's PCA-routed
# experts to 128) at the full grid's L at N = 8 (random streams and routed experts of both
# models: PCA on Fashion-MNIST, tf-idf on the Python docs), then the modelled projection to
# 1024 devices from the measured grids.
many-workers: install data
	$(call study_of,fashion_mnist,many_workers,many_workers,fashion_mnist)
	$(call study_of,pydocs_gpt2,many_workers,many_workers_pydocs,pydocs_gpt2)

projection: install
	$(PY) -m experiments.projection --workload=fashion_mnist --also=experiments/results/many_workers
	$(PY) -m experiments.projection --workload=fashion_mnist --also=experiments/results/many_workers \
	  --what_if=resnet50
	$(PY) -m experiments.projection --workload=pydocs_gpt2 --also=experiments/results/many_workers_pydocs
	$(PY) -m experiments.projection --workload=pydocs_gpt2 --what_if=gpt2_small \
	  --also=experiments/results/many_workers_pydocs
	$(PY) -m experiments.projection --workload=fashion_mnist --also=experiments/results/many_workers \
	  --what_if=resnet50 --charge_pools
	$(PY) -m experiments.projection --workload=pydocs_gpt2 --what_if=gpt2_small --charge_pools \
	  --also=experiments/results/many_workers_pydocs

# The targets and distillation figures, then every page and generated region rendered from
# docs/templates/ (experiments/docs_render.py; without --write it only checks).
docs: install
	$(PY) -m experiments.targets --plot >/dev/null
	$(PY) -m experiments.distillation_page
	$(PY) -m experiments.docs_render --write

# The ceilings (docs/results/targets.md): the sweep, wider and small models at D = 8 trained
# 2-16 epochs to their end on all 10,000 test images, every rung of the ladder tracked.
ceilings: install data
	$(call study_of,fashion_mnist,ceilings,fashion_mnist_ceilings,fashion_mnist)

# The ladder (docs/results/targets.md): the method and the baselines at fixed lengths that
# span the rungs, each point tuned by the rule per rung, on all 10,000 test images; its
# points land one by one (--curves/--points) and every run resumes.
ladder: install data
	$(call study_of,fashion_mnist,ladder,fashion_mnist_ladder,fashion_mnist)

# The Python docs' ladder: perplexity 14 to 10 at 1, 2 and 4 budgets (0.46-1.85 passes);
# its single models' fixed lengths are the docs' ceilings (the best within them).
ladder-pydocs: install data
	$(call study_of,pydocs_gpt2,ladder,pydocs_gpt2_ladder,pydocs_gpt2)

# Distilled sequences: the ensemble per sampler (3 seeds), and the LiPT pipeline.
sweep-samplers: install data
	$(PY) -m experiments.sweeps.samplers --workload=fashion --seeds=0,1,2
	$(PY) -m experiments.sweeps.samplers --workload=pydocs --seeds=0,1,2

# Data-parallel's critical batch: steps to target vs global batch (64 .. 16,384
# Fashion-MNIST, 64 .. 8,192 docs and Fashion-MNIST's small model), 3 seeds, B_simple
# alongside; resumable, written to experiments/results/critical_batch/<workload>; the
# learning rate and the schedule's length tuned per B by the cost-vs-time sweep's rule
# (experiments/sweeps/tuning.py).
critical-batch: install data
	$(PY) -m experiments.sweeps.critical_batch --workload=fashion --seeds=1,2,3
	$(PY) -m experiments.sweeps.critical_batch --config=experiments/configs/fashion_mnist.py \
	  --grid=small_model --workdir=experiments/results/critical_batch/fashion_small_model \
	  --seeds=1,2,3
	$(PY) -m experiments.sweeps.critical_batch --workload=pydocs --seeds=1,2,3

lipt: install data
	$(PY) -m experiments.lipt_pipeline --workdir=experiments/results/lipt --seeds=0,1,2

# The cost-vs-time study on the real workloads (experiments/sweeps/cost_vs_time.py, the
# config's sweep_grid(GRID)), resumable, written to $(WORKDIR)/imagenet or /pile: runs,
# table.md, cost_vs_time_<preset>.png. STUDY_FLAGS adds flags, e.g. --curves=data_parallel,
# --launcher=slurm (submitted to SLURM: the quiet phase, a job array of points, the report),
# --distributed (every process of a multi-controller job) or --plan (one job per point).
SEEDS ?= 1,2,3
GRID ?= full
STUDY_FLAGS ?=
STUDY := $(PY) -m experiments.sweeps.cost_vs_time --seeds=$(SEEDS) --grid=$(GRID)

define NEED_PILE
  echo "make $@ needs PILE_DIR and TOKENIZER_DIR:"; \
  echo "  PILE_DIR=/data/pile       shards *.jsonl.zst (or *.jsonl), one JSON object per line:"; \
  echo "                            {\"text\": ..., \"meta\": {\"pile_set_name\": ...}}"; \
  echo "  TOKENIZER_DIR=/data/gpt2  GPT-2 encoder.json + vocab.bpe, or a tokenizer.json"; \
  echo "e.g. make $@ PILE_DIR=/data/pile TOKENIZER_DIR=/data/gpt2 [WORKDIR=/mnt/bucket/runs: a local or mounted path]"
endef
define NEED_IMAGENET
  echo "make $@ needs DATA_DIR, a TFDS data_dir holding imagenet2012 as array_record."; \
  echo "Prepare it once (the tar files come from image-net.org):"; \
  echo "  tfds build imagenet2012 --manual_dir=/path/to/tars --data_dir=DATA_DIR --file_format=array_record"; \
  echo "e.g. make $@ DATA_DIR=/data/tfds [WORKDIR=/mnt/bucket/runs: a local or mounted path]"
endef

# GPT-2 small on the Pile: PILE_DIR (shards *.jsonl.zst) and TOKENIZER_DIR (GPT-2 BPE files).
pile: install
	@if [ -z "$(PILE_DIR)" ] || [ -z "$(TOKENIZER_DIR)" ]; then \
	  echo "make pile runs the cost-vs-time study of GPT-2 small on the Pile (make pile-run: one run)."; \
	  $(NEED_PILE); exit 2; fi
	$(STUDY) --config=experiments/configs/pile_gpt2.py --workdir=$(WORKDIR)/pile \
	  --set=data.path=$(PILE_DIR) --set=data.tokenizer_dir=$(TOKENIZER_DIR) $(STUDY_FLAGS)

pile-run: install
	@if [ -z "$(PILE_DIR)" ] || [ -z "$(TOKENIZER_DIR)" ]; then \
	  echo "make pile-run trains GPT-2 small on the Pile once, the recipe's data-parallel run."; \
	  $(NEED_PILE); exit 2; fi
	$(PY) -m ensemble_jax.main --config=experiments/configs/pile_gpt2.py --workdir=$(WORKDIR)/pile-run \
	  --config.data.path=$(PILE_DIR) --config.data.tokenizer_dir=$(TOKENIZER_DIR)

# ResNet-50 on ImageNet from TFDS array_record files in DATA_DIR.
imagenet: install
	@if [ -z "$(DATA_DIR)" ]; then \
	  echo "make imagenet runs the cost-vs-time study of ResNet-50 on ImageNet (make imagenet-run: one run)."; \
	  $(NEED_IMAGENET); exit 2; fi
	$(STUDY) --config=experiments/configs/imagenet_resnet50.py --workdir=$(WORKDIR)/imagenet \
	  --set=data.data_dir=$(DATA_DIR) $(STUDY_FLAGS)

imagenet-run: install
	@if [ -z "$(DATA_DIR)" ]; then \
	  echo "make imagenet-run trains ResNet-50 on ImageNet once, the recipe's data-parallel run."; \
	  $(NEED_IMAGENET); exit 2; fi
	$(PY) -m ensemble_jax.main --config=experiments/configs/imagenet_resnet50.py \
	  --workdir=$(WORKDIR)/imagenet-run --config.data.data_dir=$(DATA_DIR)

# Any workload config with a sweep_grid(): the same study, in $(WORKDIR)/<config's name>.
# Without CONFIG, the usage at once: the install waits for a study to run.
study: $(if $(CONFIG),install)
	@if [ -z "$(CONFIG)" ]; then \
	  echo "make study runs the cost-vs-time study of a config file with a sweep_grid(name):"; \
	  echo "  make study CONFIG=path/to/config.py [GRID=full] [SEEDS=1,2,3] [STUDY_FLAGS=--set=data.data_dir=/data]"; \
	  echo "Try the smoke grid first (two points, a minute or two; Fashion-MNIST's full grid takes about 17 h):"; \
	  echo "  make study CONFIG=experiments/configs/fashion_mnist.py GRID=smoke SEEDS=1"; \
	  exit 2; fi
	$(STUDY) --config=$(CONFIG) --workdir=$(WORKDIR)/$(notdir $(basename $(CONFIG))) $(STUDY_FLAGS)

clean:
	rm -rf $(WORKDIR)
