"""Fashion-MNIST, embedded offline data (Debian's dataset-fashion-mnist via `make data`).

  python -m ensemble_jax.main --config=experiments/configs/fashion_mnist.py --workdir=/tmp/fm
  # variants, comma-separated: smoke, ensemble, diloco, sweep, tiny; e.g. :smoke,ensemble

Default: data-parallel ResNet-18 (small stem, width 16, 0.70M params), AdamW, batch 128,
2 epochs, warmup + cosine.
`ensemble`: N=8 workers (own inits, own random streams), each L=117 steps at batch 128,
so the ensemble's total compute equals the DP run's 938 steps; critical path 1/8 of it.
`smoke`: the quickest run that learns (seconds); `tiny`: compile-light, for tests.
`sweep`: the cost-vs-time workload (`sweep_grid`, experiments/sweeps/cost_vs_time.py):
ResNet-18 width 8 at 64 examples per device or worker, target 85% on 2,000 test images
evaluated every 25 steps (every 5% of the steps near the target), budgets by one rule
(SWEEP_EXAMPLES), small enough for 3 seeds of every point on 2 CPU cores.
"""
import os

from ensemble_jax import config_lib, report
from ensemble_jax.config_lib import base_config
from experiments import configs
from experiments.configs import tuned_schedule


def get_config(arg: str = ""):
  c = base_config()
  c.data.dataset = "fashion_mnist"
  c.data.source = "idx"
  c.data.image_size = 28
  c.data.train_augment = "none"  # in 2 epochs crop+flip costs accuracy (84.7% vs 87.0% at 1)
  c.data.mean, c.data.std = (0.286,), (0.353,)
  c.model.name, c.model.width, c.model.stem = "resnet18", 16, "small"
  c.optim.name = "adamw"
  c.optim.learning_rate = 3e-3  # at base_batch_size 128; scaled linearly with batch size
  c.optim.base_batch_size = 128
  c.optim.weight_decay = 5e-4
  c.optim.warmup_fraction = 0.05  # of every run's own step budget, whatever the method
  c.train.batch_size = 128
  c.train.num_epochs = 2.0
  c.eval.batch_size = 1000
  c.eval.target_metric, c.eval.target_value = "accuracy", 0.91
  variants = config_lib.parse_variants(arg, ("smoke", "tiny", "ensemble", "diloco", "sweep"),
                                       "fashion_mnist.py")
  if variants & {"ensemble", "diloco"}:
    c.method.name = "ensemble"
    c.mesh = "worker:-1,data:1"
    c.method.num_workers = 8
    c.method.steps_per_worker = 117  # 8 x 117 = 936 worker-steps ~ the DP run's 938
    c.method.sampler = "random"
    c.method.aggregation = "logits,probs"
  if "diloco" in variants:  # the same engine, with an outer Nesterov step every H steps
    c.method.name, c.method.aggregation = "diloco", "global"  # one model: the outer params
    c.method.sync_every = 25
    c.tune.fields = ("optim.learning_rate", "method.outer_learning_rate")
  if "sweep" in variants:
    c.model.width = 8
    c.train.batch_size = c.optim.base_batch_size = 64  # per device (DP) or per worker
    c.optim.lr_scaling = "sqrt"  # Adam at D x 64
    # Tuned and stopped on 2,000 test images, as time-to-accuracy benchmarks do; the final
    # model is scored on the other 8,000 too (results.json `rest`).
    c.eval.every_steps, c.eval.num_examples = 25, 2000
    c.eval.score_rest_at_end = True
    c.eval.target_value = SWEEP_TARGET
    c.eval.target_resolution = 0.05  # steps to target known to 5% (evals near it)
    c.train.stop_at_target = True  # a steps-to-target run, by hand as in the sweeps
    c.train.timing_warmup_steps = 5
    c.train.num_epochs, c.train.num_steps = 0.0, budget_steps(64)  # DP at D = 1
    c.method.num_workers, c.method.steps_per_worker = 4, budget_steps(4 * 64)
  if "smoke" in variants:
    # The quickest run that learns: 300 steps of a narrow two-stage ResNet-18 (~20 s on 2
    # CPU cores), well above chance (10%). With `ensemble`: 4 workers of 150 steps each,
    # half data-parallel's steps at twice its compute.
    c.model.name, c.model.width, c.model.stage_sizes = "resnet18", 8, (1, 1)
    c.train.batch_size = c.optim.base_batch_size = 64
    c.optim.learning_rate = 0.01
    c.train.num_epochs, c.train.num_steps = 0.0, 300
    c.train.log_every_steps = 50
    c.eval.every_steps, c.eval.num_examples = 50, 1000
    c.eval.target_value = SMOKE_TARGET
    c.method.num_workers = 4
    c.method.steps_per_worker = 150 if variants & {"ensemble", "diloco"} else 0
    c.method.sync_every = 50 if "diloco" in variants else 0
  if "tiny" in variants:
    # Compile-light, for tests: a few steps of a 1,382-parameter model, no learning to show.
    # ResNet-18's block at width 4 in two one-block stages (1,382 parameters): a train
    # step compiles in ~0.7 s on 2 CPU cores, against 2.1 s for all four stages of two.
    c.model.name, c.model.width, c.model.stage_sizes = "resnet18", 4, (1, 1)
    c.train.batch_size = 32
    c.train.num_epochs, c.train.num_steps = 0.0, 4
    c.optim.warmup_fraction = 0.75  # 3 of the 4 steps, as the golden values were made
    c.train.log_every_steps = 2
    c.eval.every_steps = 2
    c.eval.batch_size = 64
    c.eval.num_examples = 128
    c.eval.target_value = 0.05
    c.checkpoint.every_steps = 2
    c.method.steps_per_worker = 4 if variants & {"ensemble", "diloco"} else 0
    c.method.sync_every = 2 if "diloco" in variants else 0
    c.cost.calibration_steps = 6  # a sweep's calibration run: its mechanism, not a timing
  return c


SMOKE_TARGET = 0.65  # accuracy on 1,000 test images

# Measured (1 seed): DP width 8 at batch 64 with a 2-epoch cosine passes 85% on the sweep's
# eval set at step ~500 of 1,875 and ends at ~90%; the target sits where every curve can
# reach it within its budget or is reported as missing it.
SWEEP_TARGET = 0.85
TRAIN_EXAMPLES = 60_000
# The ladder of targets up to the ceilings (docs/results/targets.md): every half point from
# the sweep's 85% to 94%, so each rung the study reads (88%, 90%, half a point below a
# ceiling, one between two ceilings) is resolved to 5% of its steps in one set of runs.
LADDER = tuple(round(0.85 + 0.005 * i, 3) for i in range(19))
# Fixed schedule lengths (epochs) that span the ladder: the ceiling is the best of them, the
# plateau where a doubling gains less than the seeds' spread.
CEILING_EPOCHS = (2, 4, 8, 16)
# The budget rule, one for every point of every curve: the same number of training
# examples, all models together (D x 64 per DP step, N x 64 per ensemble or DiLoCo step),
# 2 epochs: several times what DP at D = 1 needs to reach the target (docs/methodology.md
# gives the multiple, from the committed runs), so a point that misses it within the budget
# shows that it cannot. Runs stop at
# the target, so an unused budget costs nothing but the length of its cosine schedule.
# dp_short_schedule's points take stated fractions of it: their shorter schedule is the
# point.
SWEEP_EXAMPLES = 2 * TRAIN_EXAMPLES


# make demo's points, the headline in under 4 minutes on 2 cores: the fastest data-parallel
# point (D = 8), the committed study's
# strongest baseline (`demo_points`, read from its results, never named here) and the
# ensemble's middle point (DiLoCo, at ~3.5 minutes a point, is left to the full grid), at
# what the full grid's tuning chose for them on seed 0 (`configs.tuned_choice`). The demo
# trains them once, on seed 0: its runs repeat those tuning runs.
DEMO_POINTS = {"data_parallel": ("D8",), "ensemble": ("N4_L469",)}


def demo_points() -> dict:
  """DEMO_POINTS plus the committed study's strongest baseline (`report.verdict` of the
  committed experiments/results/fashion_mnist): {curve: (point, ...)}."""
  pts = report.points(report.load_runs(os.path.join(configs.RESULTS, "fashion_mnist")))
  curve, point = report.verdict(pts)["strongest"].split()
  out = dict(DEMO_POINTS)
  out[curve] = tuple(dict.fromkeys(out.get(curve, ()) + (point,)))
  return out


# The one-device grid's points: {curve: {point: the full grid's (curve, point) whose tuning
# choice it trains at}} (experiments/rerun_plan.py reads it: a choice that moves, moves them).
ONE_DEVICE_NAMESAKES = {
    "data_parallel": {"B64": ("data_parallel", "D1"), "B256": ("data_parallel_sync_bn", "D4")},
    "ensemble": {"N4_L469": ("ensemble", "N4_L469")},
    "ensemble_pca_routed_small": {"N8_L235": ("ensemble_pca_routed_small", "N8_L235")}}


def _at_tuned_choice(curve: str, point: str, **extra) -> tuple[str, dict]:
  """The full grid's `point` at its tuning's choice, trained once (no tuning of its own)."""
  variant, overrides = sweep_grid("full")[curve][point]
  kept = {k: v for k, v in overrides.items() if not k.startswith("tune.")}
  return variant, {**kept, **configs.at_choice(configs.tuned_choice("fashion_mnist", curve,
                                                                      point)), **extra}


def budget_steps(examples_per_step: int, examples: int = SWEEP_EXAMPLES) -> int:
  """The steps a point may take: `examples` at `examples_per_step`, rounded up."""
  return -(-examples // examples_per_step)


def sweep_grid(name: str = "full") -> dict:
  """{curve: {point: (variant, overrides)}} for experiments/sweeps/cost_vs_time.py.

  data_parallel at D devices = one model at global batch 64 D (cost.devices = D); the
  survey's strong baselines: the same DP with a shorter full cosine schedule
  (dp_short_schedule, E epochs), and a smaller model (dp_small_model, width 4); the
  ensemble over N (one worker per device, L steps each); DiLoCo with N = 4 over the sync
  period H. Every budget is SWEEP_EXAMPLES' (`budget_steps`), so DP at D and the ensemble
  at N = D take the same steps, L.
  """
  # Data-parallel normalises each device's 64 examples alone (per-device BatchNorm, as
  # large-batch ImageNet training runs it, and as the critical-batch sweep's D simulated
  # devices do): its step all-reduces the gradients alone, on the grid as in the projection
  # beyond it.
  sync_bn = {"method.batchnorm": "synchronised"}

  def dp(d, **extra):
    return ("sweep", {"train.batch_size": 64 * d, "cost.devices": d,
                      "train.num_steps": budget_steps(64 * d), "method.batchnorm": "per_device",
                      **extra})

  def ensemble(n, l=None, **extra):  # L: the budget rule's unless given
    steps = budget_steps(64 * n) if l is None else l
    return ("ensemble,sweep", {"method.num_workers": n, "method.steps_per_worker": steps,
                               **extra})

  # Cheap routed experts (no proxy): worker i trains on k-means cluster i of the pixels' top
  # principal components; each test image is routed by its own projection.
  pca_routed = {"distill.builder": "kmeans", "distill.embedding": "pca",
                "method.aggregation": "routed,logits,probs"}

  # 200 iterations: the reduced protocol's matching loss is within 12% of its 500-iteration
  # value there (experiments/results/distillation/cpu_reduced), at 2/5 of the cost.
  distilled = {"distill.builder": "distribution_matching", "distill.images_per_class": 10,
               "distill.iterations": 200, "distill.real_per_class": 64}

  def distilled_ensemble(n, **extra):  # priced at the ensemble curve's step (same program)
    return tuned_schedule(ensemble(n, **distilled, **extra, **{
        "cost.price_like": f"ensemble/N{n}_L{budget_steps(64 * n)}"}))

  def diloco(h):
    return ("diloco,sweep", {"method.sync_every": h,
                             "method.steps_per_worker": budget_steps(4 * 64)})

  if name == "smoke":  # the test of the sweep itself: seconds; two rates, no extension
    tune = {"tune.factors": (1.0, 2.0), "tune.max_extensions": 0}
    return {"data_parallel": {"D2": ("tiny", {"train.batch_size": 64, "cost.devices": 2,
                                               **tune})},
            "ensemble": {"N8_L4": ("ensemble,tiny", tune)}}
  if name == "demo":  # make demo: the full grid's points at its tuning's choices, trained once
    return {curve: {point: _at_tuned_choice(curve, point) for point in points}
            for curve, points in demo_points().items()}
  if name == "ceilings":  # how far below the single model's ceiling 85% sits
    # Each model trained at fixed lengths to their end (no stop at a target), its rate tuned
    # for the best final accuracy on seed 0 (tune.objective final_metric), scored on all
    # 10,000 test images, every rung of LADDER tracked: these runs are also data-parallel's
    # tuning runs at D = 8 for every rung (`chosen_per_target`).
    ceiling = {"eval.num_examples": 0, "eval.score_rest_at_end": False,
               "eval.target_values": LADDER, "train.stop_at_target": False,
               "tune.objective": "final_metric"}

    def at_length(epochs, **extra):
      return dp(8, **{"train.num_steps": budget_steps(8 * 64, epochs * TRAIN_EXAMPLES),
                      **ceiling, **extra})

    return {"data_parallel": {f"D8_E{e}": at_length(e) for e in CEILING_EPOCHS},
            # an ensemble of four's parameters in one model: ResNet-18 width 16 (0.70M
            # parameters, 4x the sweep model's 0.18M at width 8)
            "dp_wide_model": {f"D8_E{e}": at_length(e, **{"model.width": 16})
                              for e in CEILING_EPOCHS},
            "dp_small_model": {f"D8_E{e}": at_length(e, **{"model.width": 4})
                               for e in CEILING_EPOCHS}}
  if name == "ladder":  # the study at every rung of LADDER, beside the ceilings' runs
    # Fixed lengths that span the rungs, each point tuned by the rule (its first rung chooses
    # `chosen`; each rung's own choice gets seeds too: tuning.rung_choices), scored on all
    # 10,000 test images. Pruned for a 2-core host, never in seeds or tuning: data-parallel
    # at D = 4 (D = 8 is the ceilings study's), the strongest baseline at 85% (the small
    # model, synchronised BatchNorm, D = 8; per-device is the ceilings study's), the
    # ensembles at N = 4 and 8 (random streams; small-model routed experts), each worker
    # E epochs of its stream (E = the single model's length: the deep ensemble). The
    # ceilings' lengths start at 2 epochs: the sweep model and the wider one at D = 8 also
    # train 1 epoch here, a shorter schedule that may reach the lower rungs for less.
    ladder = {"eval.num_examples": 0, "eval.score_rest_at_end": False,
              "eval.target_values": LADDER, "train.stop_at_target": True}

    def dp_at(d, epochs, **extra):
      return dp(d, **{"train.num_steps": budget_steps(d * 64, epochs * TRAIN_EXAMPLES),
                      **ladder, **extra})

    def workers_at(n, epochs, share=1, **extra):  # each worker E epochs of its 1/share
      return ensemble(n, budget_steps(64, epochs * TRAIN_EXAMPLES // share),
                      **ladder, **extra)

    # An N-worker evaluation of 10,000 images costs N single ones (~2.8 s each at width 8
    # here): at N = 8 the evaluations outweigh the steps, so N = 8 stops at 2 epochs.
    lengths, short = (1, 2, 4, 8), (1, 2, 4)
    return {
        "data_parallel": {"D8_E1": dp_at(8, 1), **{f"D4_E{e}": dp_at(4, e) for e in lengths}},
        # the wider model at D = 4 and 1 too: the sweep model gains a point from 512 a step
        # to 64 (data-parallel's 2-epoch ceiling at D = 8 against the deep ensemble's
        # workers alone), so the rungs above its ceiling need the wider model at smaller
        # batches, down to the 64 a step each of the deep ensemble's workers trains at
        "dp_wide_model": {"D8_E1": dp_at(8, 1, **{"model.width": 16}),
                          **{f"D{d}_E2": dp_at(d, 2, **{"model.width": 16}) for d in (4, 1)}},
        "dp_small_model_sync_bn": {f"D8_E{e}": dp_at(8, e, **{"model.width": 4}, **sync_bn)
                                   for e in lengths},
        "ensemble": {f"N{n}_E{e}": workers_at(n, e)
                     for n, es in ((4, lengths), (8, (1, 2))) for e in es},
        "ensemble_pca_routed_small": {
            f"N{n}_E{e}": workers_at(n, e, share=n, **pca_routed, **{"model.width": 4})
            for n in (4, 8) for e in short}}
  if name == "many_workers":  # does averaging more short runs ever reach 85%?
    # Every N trains L = 235 steps (the full grid's budget at N = 8) at what the full grid's
    # tuning chose at N = 8 (its learning rate and schedule length, `configs.tuned_choice`): a
    # worker trains alike whatever N, only the average changes, and the rule's three-plus
    # rates at N = 64 would cost ~10 hours on 2 cores. So N = 8 here is the full grid's
    # N8_L235 point, measured again.
    sizes = (2, 4, 8, 16, 32, 64)  # above 8: several workers per device, unrolled
    # The routed experts' steps still fall from N = 32 to 64 (both models), so their curves
    # go on to 128.
    routed_sizes = sizes + (128,)
    chosen = {curve: configs.tuned_choice("fashion_mnist", curve, "N8_L235")
              for curve in ("ensemble", "ensemble_pca_routed", "ensemble_pca_routed_small")}

    def fixed(curve, n):
      # At N = 64 the eval batch is 250 images, not 1,000 (125 at N = 128): each device
      # evaluates its workers unrolled, and at 1,000 the process needs ~16 GB at N = 64. A
      # layout field: it changes no trained step and no accuracy.
      return {**configs.at_choice(chosen[curve]),
              **({"eval.batch_size": 250 * 64 // n} if n >= 64 else {})}

    return {"ensemble": {f"N{n}_L235": ensemble(n, 235, **fixed("ensemble", n))
                         for n in sizes},
            "ensemble_pca_routed": {f"N{n}_L235": ensemble(n, 235, **pca_routed,
                                                           **fixed("ensemble_pca_routed", n))
                                    for n in routed_sizes},
            # The method's small-model option (the full grid's best method point at N = 8).
            "ensemble_pca_routed_small": {
                f"N{n}_L235": ensemble(n, 235, **pca_routed, **{"model.width": 4},
                                       **fixed("ensemble_pca_routed_small", n))
                for n in routed_sizes}}
  if name == "one_device":  # one real accelerator: every point on it, its times measured
    # What trains fastest to 85% on ONE device: one model at batch 64 or 256, four models
    # stacked (vmapped) at 64 each, eight small-model routed experts; each at what the full
    # grid's tuning chose for its namesake (its committed tuning.json), seeds reported as
    # there. cost.devices 1: nothing is scaled, the time is the device's own; one device
    # normalises its whole batch, so B256's namesake is the synchronised-BatchNorm D4.
    one = {"cost.devices": 1}
    return {curve: {point: _at_tuned_choice(*namesake, **one)
                    for point, namesake in points.items()}
            for curve, points in ONE_DEVICE_NAMESAKES.items()}
  if name != "full":
    raise ValueError(f"unknown grid {name!r} of fashion_mnist.py; choose full, demo, smoke, "
                     "many_workers, one_device, ceilings or ladder")
  # Every curve but the fixed short schedules tunes its schedule's length too.
  return {
      "data_parallel": {f"D{d}": tuned_schedule(dp(d)) for d in (1, 2, 4, 8)},
      "dp_short_schedule": {
          f"D4_E{e}": dp(4, **{"train.num_steps": budget_steps(4 * 64, int(e * TRAIN_EXAMPLES))})
          for e in (0.25, 0.5, 1.0)},
      "dp_small_model": {f"D{d}": tuned_schedule(dp(d, **{"model.width": 4})) for d in (1, 4, 8)},
      # The same with synchronised BatchNorm (statistics over the global batch: fewer steps,
      # an all-reduce per layer's statistics): the faster of the two is the baseline
      # wherever it is faster. D = 1 is the same program either way.
      "data_parallel_sync_bn": {f"D{d}": tuned_schedule(dp(d, **sync_bn)) for d in (2, 4, 8)},
      "dp_small_model_sync_bn": {f"D{d}": tuned_schedule(dp(d, **{"model.width": 4}, **sync_bn))
                                 for d in (4, 8)},
      "ensemble": {f"N{n}_L{budget_steps(64 * n)}": tuned_schedule(ensemble(n))
                   for n in (2, 4, 8)},
      "ensemble_pca_routed": {f"N{n}_L{budget_steps(64 * n)}": tuned_schedule(
          ensemble(n, **pca_routed)) for n in (2, 4, 8)},
      # The method's small-model option, as dp_small_model is the baseline's: each expert's
      # task (one cluster) is narrower than the whole data set's.
      "ensemble_pca_routed_small": {f"N{n}_L{budget_steps(64 * n)}": tuned_schedule(
          ensemble(n, **pca_routed, **{"model.width": 4})) for n in (2, 4, 8)},
      "diloco": {f"H{h}": tuned_schedule(diloco(h)) for h in (10, 50, 300)},
      # Synthetic distilled data: each worker trains on its own distribution-matching set
      # (10 images per class, distilled from its own 1/N share), charged like a pool build;
      # the reduced protocol (200 iterations, 64 real images per class) fits a 2-core host.
      "ensemble_distilled": {f"N{n}_L{budget_steps(64 * n)}": distilled_ensemble(n)
                             for n in (8, 4, 2)},
      # A distilled warm start: the set for the first quarter of the budget, then the
      # worker's real share (the published 10-per-class sets stop below the 85% target).
      "ensemble_distilled_warm": {
          f"N{n}_L{budget_steps(64 * n)}": distilled_ensemble(
              n, **{"distill.synthetic_fraction": 0.25}) for n in (8, 4, 2)},
  }


def critical_batch_grid(name: str = "full") -> dict:
  """Data-parallel's critical batch, for experiments/sweeps/critical_batch.py.

  The `sweep` model (ResNet-18 width 8, target 85% on 2,000 test images) at global batch
  B = 64 .. 16,384: D = B / 64 devices of 64 examples, the cost-vs-time grid's per-device
  batch. Budget: 2 epochs (SWEEP_EXAMPLES, the cost-vs-time budget), at least 200 steps,
  since large batches need a floor of steps. Tuning runs that can no longer be chosen stop
  early: the same choice for less compute.
  """
  stop_losers = {"tune.stop_losers": True}
  if name == "smoke":  # the sweep's own test: seconds on 8 fake CPU devices
    return {"variant": "tiny", "per_device": 8, "batches": (8, 16), "budget_examples": 32,
            "min_steps": 4, "warmup_fraction": 0.05, "evals_per_budget": 2,
            "checkpoints_per_budget": 2,
            "overrides": {"tune.factors": (1.0, 2.0), "tune.max_extensions": 0, **stop_losers}}
  if name not in ("full", "small_model"):
    raise ValueError(f"unknown critical-batch grid {name!r} of fashion_mnist.py; choose full, "
                     "small_model or smoke")
  # small_model: the cost-vs-time grid's dp_small_model (width 4) beyond its D = 8, the
  # baseline the small-model routed experts of the many-worker grid meet there.
  small = name == "small_model"
  return {"variant": "sweep", "per_device": 64,
          "batches": tuple(64 * 2**i for i in range(8 if small else 9)),
          "budget_examples": SWEEP_EXAMPLES, "min_steps": 200, "warmup_fraction": 0.05,
          "evals_per_budget": 100, "checkpoints_per_budget": 16,
          # The budget rule ties the schedule's length to B: it is tuned per B too, as
          # Shallue et al. (2018) do (tune.schedule_fractions of the budget).
          "overrides": {**stop_losers,
                        "tune.fields": ("optim.learning_rate", "train.schedule_fraction"),
                        **({"model.width": 4} if small else {})}}
