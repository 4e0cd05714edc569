r"""Cost vs time to a target: DP over data-parallel width, the ensemble over (N, L), DiLoCo over H.

  python -m experiments.sweeps.cost_vs_time --config=experiments/configs/fashion_mnist.py \
      --workdir=experiments/results/fashion_mnist [--seeds=1,2,3] [--grid=full|demo|smoke] \
      [--curves=ensemble,...] [--points=N2_L235,...] [--calibration=DIR]
  python -m experiments.sweeps.cost_vs_time --config=... --workdir=... --recost [--recalibrate | --keep_device_step] [--retime_pools]
  python -m experiments.sweeps.cost_vs_time --config=... --workdir=... --plan   # a cluster's jobs
  python -m experiments.sweeps.cost_vs_time --config=... --workdir=... --launcher=slurm \
      [--slurm_partition=P --slurm_time_min=240 --slurm_gpus=point ...]  # submitted to SLURM

The grid is the config file's `sweep_grid(name)`; any config file with one runs here. It
writes, under --workdir: `calibration/` (one device-step timing per compiled program),
`pools/`, `<curve>/<point>/tune/` with `tuning.json`, `<curve>/<point>/seed<k>/`, then
table.md and cost_vs_time_<preset>.png (`ensemble_jax.report`). Resumable: a finished run
is read back, a half-finished one resumes from its checkpoint; Ctrl-C or SIGTERM stops it
cleanly (exit 130 / 143). Every point is checked before anything trains, and a workdir
holding another study (`study.json`) is refused unless --start_over moves it aside
(experiments/sweeps/study.py). The full grids with 3 seeds trained ~17 h (Fashion-MNIST,
its distilled curves included) and ~8.5 h (the Python docs) on 2 CPU cores; `smoke`,
seconds.

On a cluster, either every process of one multi-controller job runs this command with
--distributed (the same plan in the same order; process 0 writes the shared workdir, every
process reads it), or --launcher=slurm submits the study to SLURM (experiments/sweeps/
launcher.py: the quiet phase, the points as a job array, the report), or --plan prints one
command per point for another scheduler (a quiet phase first, then the points, then
--report_only collects them). On real
accelerators each run's own step is measured (no calibration) and its wall-clock to the
target is recorded beside the modelled time.

The rules every point follows: docs/methodology.md.
"""
from __future__ import annotations

import ast
import copy
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import statistics
import time
import types

import jax
import ml_collections
from absl import flags, logging

from ensemble_jax import (checkpoint, config_lib, costs, distributed, methods, record, report,
                          resume, sharding, stored, train)
from ensemble_jax import run as run_lib
from ensemble_jax.distill import pools as pools_lib
from ensemble_jax.distill.registry import BUILDERS
from experiments import cli, sweeps
from experiments.sweeps import launcher, study, tuning

# The calibration run's schedule: values that only set scalar constants of the step, so its
# time does not depend on them. Canonical, so that points tuned to other rates or warm-ups
# compile to one text: XLA merges equal constants, and a coincidence of two values (a
# warm-up equal to the decay, say) would otherwise change the text, not the program's cost.
CALIBRATION_LEARNING_RATE, CALIBRATION_WARMUP_FRACTION = 1e-3, 0.05
AUGMENT_FACTORS = "augment_factors.json"


def _point_config(module, variant: str, overrides: dict, seed: int, workdir: str):
  """A point's config at `seed`, as the grid sets it (the configured learning rate)."""
  config = module.get_config(variant)
  config.seed = seed
  config.train.stop_at_target = True
  config.distill.cache_dir = os.path.join(workdir, "pools")  # built in the quiet phase
  for key, value in overrides.items():
    config_lib.set_dotted(config, key, value)
  methods.fit_workers_to_devices(config, jax.device_count())  # as every run does
  return config


def with_settings(module, settings: dict | None, tune_schedule: bool = False):
  """`module` whose get_config() also sets `settings` ({dotted key: value}, `--set`): where
  the data is (data.data_dir, data.path, data.tokenizer_dir), on every point alike. With
  `tune_schedule`, every point tunes its schedule's length after its other fields."""
  if not settings and not tune_schedule:
    return module

  def get_config(arg: str = ""):
    config = module.get_config(arg)
    for key, value in (settings or {}).items():
      config_lib.set_dotted(config, key, value)
    if tune_schedule and config_lib.SCHEDULE_FRACTION not in config.tune.fields:
      config.tune.fields = (*config.tune.fields, config_lib.SCHEDULE_FRACTION)
    return config

  return types.SimpleNamespace(**{**vars(module), "get_config": get_config})


def parse_settings(values: list[str]) -> dict:
  """`--set=data.path=/data/pile` flags as {dotted key: value} (Python literals parsed,
  anything else a string)."""
  settings = {}
  for item in values:
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise SystemExit(f"error: --set={item}: expected --set=<group>.<field>=<value>")
    try:
      settings[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      settings[key] = value
  return settings


def device_config(config):
  """One device's program of a point: one model at the per-device (per-worker) batch, on
  one device of the host (a `data: -1` mesh would split that batch over all the simulated
  devices sharing the host's cores), on the calibration's schedule. A multi-process run
  on simulated devices (the tests' two-process studies) spans every device: each process
  must take part in the program."""
  c = copy.deepcopy(config)
  if not methods.METHODS[c.method.name].stacked:  # one model's batch over the devices
    c.train.batch_size //= max(c.cost.devices, 1)
  one_device = [("data", 1 if jax.process_count() == 1 else -1)]
  c.method.name, c.mesh, c.cost.devices = "data_parallel", one_device, 1
  c.method.aggregation, c.distill.builder = "logits", "none"  # the step, not the pool
  steps = c.cost.calibration_steps
  c.train.num_steps, c.train.num_epochs, c.train.schedule_fraction = steps, 0.0, 1.0
  c.train.stop_at_target, c.train.timing_warmup_steps = False, steps // 3
  c.eval.every_steps, c.eval.num_examples = steps, c.eval.batch_size
  c.eval.target_resolution, c.eval.score_rest_at_end = 0.0, False
  c.checkpoint.every_steps, c.seed = 0, 0
  c.optim.learning_rate, c.optim.lr_scaling = CALIBRATION_LEARNING_RATE, "none"
  c.optim.warmup_fraction = CALIBRATION_WARMUP_FRACTION
  return c


_SOURCE_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_METADATA = re.compile(r',?\s*metadata=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')
_SCALAR_CONSTANT = re.compile(r"(\b[a-z]+\d*\[\]\s+constant)\([^()]*\)")


def program_fingerprint(hlo_text: str) -> str:
  """A hash of a compiled program's optimized HLO text, without what does not change its
  step time: source locations (metadata, the file and stack-frame tables) and the values
  of scalar constants (learning rates, schedule lengths)."""
  lines, in_source_table = [], False
  for line in hlo_text.splitlines():
    if line.strip() in _SOURCE_SECTIONS:
      in_source_table = True
    elif in_source_table:
      in_source_table = bool(line.strip())  # a table ends at a blank line
    else:
      lines.append(line)
  text = _SCALAR_CONSTANT.sub(r"\1(_)", _METADATA.sub("", "\n".join(lines)))
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def _program_key(c, calibration_dir: str) -> str:
  """`program_fingerprint` of `c`'s compiled step, remembered per config (and jax) in
  `<calibration_dir>/programs.json` so that a resumed sweep compiles nothing twice."""
  path = os.path.join(calibration_dir, "programs.json")
  config_key = hashlib.sha256(json.dumps({"config": c.to_dict(), "jax": jax.__version__},
                                         sort_keys=True, default=str).encode()).hexdigest()[:16]
  index = _index(path)
  if config_key not in index:
    fingerprint = program_fingerprint(train.compile_step(c).as_text())
    if not sweeps.is_writer():
      return fingerprint
    _remember(path, config_key, fingerprint)
    return fingerprint
  return index[config_key]


def _index(path: str) -> dict:
  """The JSON index in `path` (a calibration's programs or augmentation factors), {} before
  its first key."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _remember(path: str, key: str, value) -> None:
  """Adds `key: value` to the JSON index in `path`, atomically (other jobs, a --plan array,
  may have added keys meanwhile: it is read again first)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  index = _index(path)
  index[key] = value
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    json.dump(index, f, indent=2)
  os.replace(tmp, path)


def calibrate(config, calibration_dir: str) -> float:
  """The median step of `device_config(config)`, timed once per distinct compiled program
  in `<calibration_dir>/<fingerprint>/` (a sweep's `<workdir>/calibration` unless sweeps of
  one workload share one)."""
  c = device_config(config)
  run_dir = os.path.join(calibration_dir, _program_key(c, calibration_dir))
  path = os.path.join(run_dir, run_lib.RESULTS_FILE)
  sweeps.sync(f"calibrate {run_dir}")
  if not os.path.exists(path):
    return run_lib.train_and_evaluate(c, run_dir)["step_time_s"]  # process 0 writes it
  return stored.load(path)["step_time_s"]


def augment_factor(config, calibration_dir: str) -> float:
  """A point's step on a distilled set's own examples over the same step on real ones (1
  where it trains on none, or leaves them as they are: `distill.synthetic_augment`): its
  device program (`device_config`) run both ways side by side (`train.step_runner`),
  interleaved, `cost.calibration_steps` each, the first third untimed, the ratio of the
  medians. Remembered per program and augmentation in `<calibration_dir>/AUGMENT_FACTORS`
  with both medians and the load average it was timed at."""
  augment = config.distill.synthetic_augment
  if not BUILDERS[config.distill.builder].synthetic or augment == "none":
    return 1.0
  c = device_config(config)
  key, path = f"{_program_key(c, calibration_dir)}/{augment}", os.path.join(
      calibration_dir, AUGMENT_FACTORS)
  sweeps.sync(f"augment factor {key}")
  factors = _index(path)
  if key not in factors:
    runs = {"plain": train.step_runner(c)[1],
            "augmented": train.step_runner(c, synthetic=True)[1]}
    times = {name: [] for name in runs}
    for i in range(c.cost.calibration_steps):
      for name, run in runs.items():
        start = time.perf_counter()
        run()
        if i >= c.cost.calibration_steps // 3:
          times[name].append(time.perf_counter() - start)
    plain, augmented = (statistics.median(times[name]) for name in runs)
    factors[key] = {"factor": augmented / plain, "plain_step_s": plain,
                    "augmented_step_s": augmented, "load_average": os.getloadavg()[0]}
    if sweeps.is_writer():
      _remember(path, key, factors[key])
  return factors[key]["factor"]


def device_step_time(config, calibration_dir: str, workdir: str,
                     point_dir: str | None = None) -> float:
  """A point's device step: the one its config gives (`cost.device_step_time_s` > 0), the
  one the seed runs of the point it is priced like were priced at (`cost.price_like`,
  once they have run; times `teacher_factor` and `augment_factor`), the one its own seed
  runs in `point_dir` were priced at (a point re-run keeps its study's calibration: a
  program that moved since would otherwise be timed on whatever host re-runs it, beside
  points timed on another; `--recost --recalibrate` re-times a whole study on one), else
  `calibrate`'s times `augment_factor`."""
  if config.cost.device_step_time_s > 0:
    return config.cost.device_step_time_s
  if config.cost.price_like:
    like_dir = os.path.normpath(os.path.join(workdir, config.cost.price_like))  # '..' too
    if (step := _priced_at(like_dir, f"cost.price_like={config.cost.price_like!r}")):
      return step * teacher_factor(config) * augment_factor(config, calibration_dir)
  elif point_dir and (step := _priced_at(point_dir, point_dir)):
    return step
  return calibrate(config, calibration_dir) * augment_factor(config, calibration_dir)


def _priced_at(point_dir: str, what: str) -> float | None:
  """The device step `point_dir`'s seed runs were priced at; None before they have run."""
  steps = {stored.load(path)["cost"]["modelled"]["device_step_time_s"]
           for path in glob.glob(os.path.join(point_dir, "seed*", run_lib.RESULTS_FILE))}
  if len(steps) > 1:
    raise SystemExit(f"error: {what}: its seed runs were priced at {sorted(steps)}; recost "
                     "them at one calibration first")
  return steps.pop() if steps else None


def teacher_factor(config) -> float:
  """A taught step over the same step untaught (1 without a teacher), by XLA's FLOP counts
  of the two device programs: the point a taught one is priced like trained untaught, and
  the teacher's forward adds to each step (a modelled time: FLOPs at one device's rate)."""
  if not config.distill.teacher:
    return 1.0
  taught = device_config(config)
  untaught = copy.deepcopy(taught)
  untaught.distill.teacher, untaught.distill.kd_weight = "", 0.0
  return costs.flops(train.compile_step(taught)) / costs.flops(train.compile_step(untaught))


def _check_finished(workdir: str, keys) -> None:
  """Exits naming the finished seed runs from before the tuning rule (no `tune` in their
  config): they belong to no tuned point. Runs at other values than a point's choice are
  set aside before any seed trains (`tuning.ready_seeds`)."""
  stale = []
  for key in keys:
    for path in sorted(glob.glob(os.path.join(workdir, *key, "seed*", run_lib.RESULTS_FILE))):
      if "tune" not in stored.load(path)["config"]:
        stale.append(os.path.dirname(path))
  if stale:
    raise SystemExit("error: finished runs from before the tuning rule; delete them to rerun "
                     "them under it:\n  " + "\n  ".join(stale))


def _grid_curves(module, grid: str, curves: list[str] | None) -> dict:
  """The config module's `grid`, its `curves` only (None: every curve)."""
  if not hasattr(module, "sweep_grid"):
    raise SystemExit(f"error: {module.__file__} defines no sweep_grid(name); see "
                     "experiments/configs/fashion_mnist.py for one")
  grid_curves = module.sweep_grid(grid)
  unknown = set(curves or ()) - set(grid_curves)
  if unknown:
    raise SystemExit(f"error: --curves {sorted(unknown)} not in the grid {sorted(grid_curves)}")
  return {curve: specs for curve, specs in grid_curves.items() if not curves or curve in curves}


def simulated() -> bool:
  """Whether this host simulates the cluster (CPU devices sharing its cores): then the time
  axis is modelled from a calibrated device step; on accelerators each run is timed."""
  return jax.devices()[0].platform == "cpu"


def run(config_path: str, workdir: str, seeds: list[int], grid: str,
        curves: list[str] | None = None, calibration_dir: str | None = None,
        point_names: list[str] | None = None, quiet_only: bool = False,
        write_report: bool = True, settings: dict | None = None,
        tune_schedule: bool = False, start_over: bool = False) -> dict[str, int]:
  """Runs every (curve, point) of `curves` and `point_names` (default all), in three phases.

  1. Quiet, before anything trains: each point's device step (`calibrate`) and its pool
     for every seed, so the pool's build time is measured as quietly as the steps.
  2. Tuning on seed `tune.seed` (`tuning.tune`), every point before any other seed.
  3. Seeds outermost, so an interrupted sweep has whole seeds of every point; seed
     `tune.seed`'s run is the chosen tuning run, copied. A seed run (finished or not) at other
     values than the chosen ones moves to `<point>/superseded/` and runs again.

  Before anything is written, every point of the grid is resolved and each to train
  checked (`study.check_points`: its config, mesh, data and method; each bad point one
  line of a ConfigError), and the workdir must hold this study or none
  (`study.check_workdir`; `start_over` moves another aside).

  Returns run counts: `tuning_runs` and `trained` (seed runs) trained now, `resumed` (of
  those, continued from a checkpoint), `from_tuning` (seed runs that are the chosen tuning
  run), `skipped` (seed runs finished before), `read_back` (tuning runs finished before),
  `diverged`.
  The report covers every run under the workdir. `calibration_dir` (default
  `<workdir>/calibration`): another sweep's of the same workload shares its timings.
  `settings`: {dotted key: value} set on every point (`with_settings`); `tune_schedule`:
  the schedule's length tuned too. `quiet_only`: phase 1 only (a scheduler's first job,
  `--plan`). On accelerators
  (`simulated()` false) phase 1 builds the pools only: each run's own measured step is
  its device step.

  Under JAX's multi-controller runtime every process calls this with the same arguments:
  all walk the same points in the same order and train each run together; process 0
  writes the shared files (`sweeps.is_writer`), and every process waits for it
  (`sweeps.sync`) before reading them.
  """
  module = with_settings(sweeps.load_config_module(config_path), settings, tune_schedule)
  calibration_dir = calibration_dir or os.path.join(workdir, "calibration")
  grid_curves = _grid_curves(module, grid, curves)
  points = {(curve, point): spec for curve, specs in grid_curves.items()
            for point, spec in specs.items()}
  names = {point for _, point in points}
  if set(point_names or ()) - names:
    raise SystemExit(f"error: --points {sorted(set(point_names) - names)} not in the curves "
                     f"{sorted(grid_curves)}: they have {sorted(names)}")
  # The whole grid is the study (a part of it, --curves or --points, is the same study);
  # the points this command trains are checked as their runs will check them.
  selected = [os.path.join(*key) for key in points if not point_names or key[1] in point_names]
  configs = study.check_points(
      {os.path.join(curve, point): functools.partial(_point_config, module, *spec, 0, workdir)
       for curve, specs in _grid_curves(module, grid, None).items()
       for point, spec in specs.items()},
      selected, seeds)
  study.check_workdir(workdir, study.identity(config_path, grid, settings, configs),
                      start_over)
  points = {key: spec for key, spec in points.items() if not point_names or key[1] in point_names}

  def point_config(key, seed):
    variant, overrides = points[key]
    return _point_config(module, variant, overrides, seed, workdir)

  _check_finished(workdir, points)
  study.say_holdings(workdir, [os.path.join(*key) for key in points])
  # 1. Quiet: every timing the time axis needs, before any point trains (a pool timed
  # apart is built when a run first needs it).
  device_step = {}
  for key in points:
    config = point_config(key, 0)
    checkpoint.PreemptionWatch.stop_before(f"{os.path.join(*key)}'s calibration and pools")
    device_step[key] = (device_step_time(config, calibration_dir, workdir,
                                         os.path.join(workdir, *key)) if simulated() else 0.0)
    if BUILDERS[config.distill.builder].timed_apart:
      continue
    for seed in sorted({*tuning.tuning_seeds(config), *seeds}):
      run_lib.build_pool(point_config(key, seed), os.path.join(workdir, "pools"))
  sweeps.sync("quiet phase done")
  counts = dict.fromkeys(study.COUNTS, 0)
  if quiet_only:
    return counts

  # 2. Tuning on seed tune.seed, every point before any other seed trains.
  tuned = {}
  for key in points:
    base = point_config(key, 0)
    base.seed = base.tune.seed
    base.cost.device_step_time_s = device_step[key]
    point_dir = os.path.join(workdir, *key)
    tuning.set_aside_inherited(point_dir, base)
    tuned[key] = tuning.tune(base, point_dir, lambda c, run_dir, b=base: study.counted(
        counts, "tuning_runs", run_dir, lambda: tuning.train_run(
            c, run_dir, counts, "tuning_runs", pool_config=tuning.on_seed(b, c.seed))))
    tuning.write_record(point_dir, tuned[key][1])

  # 3. Seeds outermost: an interrupted sweep has whole seeds of every point, not some points.
  # With a ladder of targets, a rung whose choice differs from the point's gets its seeds
  # too (`tuning.rung_choices`), in <point>/per_target/<run>/.
  chosen_at = {}  # (key, directory under the point) -> (config, record)
  for key, (chosen, record) in tuned.items():
    chosen_at[key, ""] = chosen, record
    for sub, choice in tuning.rung_choices(chosen, record).items():
      chosen_at[key, sub] = choice
  for (key, sub), (chosen, record) in chosen_at.items():
    tuning.ready_seeds(chosen, record, os.path.join(workdir, *key, sub), seeds, counts)
  for seed in seeds:
    for (key, sub), (chosen, record) in chosen_at.items():
      point_dir = os.path.join(workdir, *key, sub)
      study.counted(counts, "trained", os.path.join(point_dir, f"seed{seed}"),
                    lambda: tuning.run_seed(chosen, record, point_dir, seed, counts,
                                            pool_config=point_config(key, seed)))
  sweeps.sync("points done")
  if write_report and sweeps.is_writer():
    print(report.write(workdir, workdir))
  return counts


def plan(config_path: str, workdir: str, seeds: list[int], grid: str,
         curves: list[str] | None = None, calibration_dir: str | None = None,
         compile_cache: str | None = None, settings: dict | None = None,
         tune_schedule: bool = False) -> str:
  """The sweep as jobs for a cluster's scheduler, one command a line: the quiet phase
  (calibration and pools) first, alone; then one line per point, each on the devices its
  comment names (a SLURM array runs line i as task i); when all have finished, the
  report. Each line is this command, resumable: a job that is preempted and started
  again continues."""
  return jobs(config_path, workdir, seeds, grid, curves, calibration_dir, compile_cache,
              settings, tune_schedule).text()


def jobs(config_path: str, workdir: str, seeds: list[int], grid: str,
         curves: list[str] | None = None, calibration_dir: str | None = None,
         compile_cache: str | None = None, settings: dict | None = None,
         tune_schedule: bool = False) -> launcher.Plan:
  """The sweep as a scheduler's jobs (`plan`'s lines; `--launcher=slurm` submits them)."""
  module = with_settings(sweeps.load_config_module(config_path), settings)
  common = [f"--config={config_path}", f"--workdir={workdir}",
            f"--seeds={','.join(map(str, seeds))}", f"--grid={grid}"]
  common += [f"--set={k}={v}" for k, v in (settings or {}).items()]
  if calibration_dir:
    common.append(f"--calibration={calibration_dir}")
  if compile_cache is not None and compile_cache != sweeps.COMPILE_CACHE:
    common.append(f"--compile_cache={compile_cache}")
  if tune_schedule:
    common.append("--tune_schedule")
  grid_curves = _grid_curves(module, grid, curves)
  points = []
  for curve, specs in grid_curves.items():
    for point, (variant, overrides) in specs.items():
      c = _point_config(module, variant, overrides, 0, workdir)
      devices = (c.cost.devices or c.method.num_workers
                 if methods.METHODS[c.method.name].stacked else c.cost.devices or 1)
      outputs = tuple(os.path.join(curve, point, f"seed{s}", run_lib.RESULTS_FILE)
                      for s in seeds)
      points.append(launcher.Point(f"{curve}/{point}", (
          *common, f"--curves={curve}", f"--points={point}", "--noreport"), devices, outputs))
  return launcher.Plan("experiments.sweeps.cost_vs_time", workdir,
                       (*common, f"--curves={','.join(grid_curves)}", "--quiet_only"),
                       tuple(points), (*common, "--report_only"))


def _retime_pools(module, grid_curves: dict, workdir: str) -> dict[str, dict]:
  """Every proxy-free pool the grid's finished runs read, built again and timed
  (`run_lib.retime_pool`), one at a time: {its cache file's name: its new info}. Run it on
  a host doing nothing else, as the quiet phase builds them. Each is built from its run's
  point config and must come out as cached (`pools.retime`); one that does not is named,
  and its runs keep the build time they recorded."""
  retimed, changed = {}, []
  for curve, points in grid_curves.items():
    for point, (variant, overrides) in points.items():
      point_dir = os.path.join(workdir, curve, point)
      for path in sorted(glob.glob(os.path.join(point_dir, "tune", "*", run_lib.RESULTS_FILE))
                         + glob.glob(os.path.join(point_dir, "seed*", run_lib.RESULTS_FILE))):
        results = stored.load(path)
        cached = os.path.basename((results.get("distill") or {}).get("cached") or "")
        if not cached or cached in retimed:
          continue
        config = _pool_config(module, variant, overrides, workdir, results["config"])
        if not pools_lib.proxy_free(config):
          continue
        pool_dir = os.path.join(workdir, "pools")
        try:
          retimed[cached] = run_lib.retime_pool(config, pool_dir,
                                                os.path.join(pool_dir, cached),
                                                results["distill"])
        except pools_lib.PoolChanged as e:
          logging.warning("%s keeps its recorded build time: %s", path, e)
          changed.append(path)
          retimed[cached] = None
          continue
        logging.info("%s: pool %s re-timed: %.1f s (was %.1f s)", path, cached,
                     retimed[cached]["build_time_s"], results["distill"]["build_time_s"])
  if changed:
    print("pools this code builds otherwise; their runs keep their recorded build time:\n  "
          + "\n  ".join(changed))
  return {name: info for name, info in retimed.items() if info is not None}


def _check_calibrated_here(calibration_dir: str) -> None:
  """Exits unless this host is the one that timed the study's calibrations: a pool re-timed
  here would be charged beside device steps timed on another machine (the study's other
  prices), so the two must be taken on one host (`--recalibrate` with `--retime_pools`)."""
  here = record.describe_host(record.host_info())
  hosts = {record.describe_host(stored.load(path).get("host") or {})
           for path in glob.glob(os.path.join(calibration_dir, "*", run_lib.RESULTS_FILE))}
  if hosts and hosts != {here}:
    raise SystemExit(
        f"error: --retime_pools on {here}, but {calibration_dir} was timed on "
        f"{' / '.join(sorted(hosts))}: the pool builds and the device steps they are charged "
        "beside would come from two machines. Re-time both on one quiet host (--recost "
        "--recalibrate --retime_pools), or re-time the pools on the calibration's host.")


def _retimed_pools(workdir: str) -> dict[str, dict]:
  """{pool file name: its re-timed info} from the study's records (superseded runs too):
  a pool's re-timed build prices every run that read it, also a run trained after the
  re-time that built the pool again itself (a point re-run on another host)."""
  out = {}
  for path in sorted(glob.glob(os.path.join(workdir, "**", run_lib.RESULTS_FILE),
                               recursive=True)):
    d = stored.load(path).get("distill") or {}
    if d.get("cached") and d.get("retimed"):
      out.setdefault(os.path.basename(d["cached"]),
                     {k: v for k, v in d.items() if k != "cached"})
  return out


def _pool_config(module, variant: str, overrides: dict, workdir: str, run_config: dict):
  """The config the sweep built a run's pool with: its point's configured values at the
  run's seed (every run of a point and seed reads one pool, whatever its tuned values),
  routing the eval rows the run scored (a run from before `eval.score_rest_at_end` existed
  routed only those)."""
  config = _point_config(module, variant, overrides, run_config["seed"], workdir)
  config.eval.score_rest_at_end = bool(run_config["eval"].get("score_rest_at_end"))
  return config


def _recost_file(path: str, step_time: float | None, point_config=None,
                 retimed: dict[str, dict] | None = None,
                 retimed_before: dict[str, dict] | None = None) -> None:
  """`path`'s cost block at `step_time` (None: the device step it records), with the
  collectives the run recorded; with the run's `point_config`, those of a run whose own
  reading failed, or that was priced on another cluster than the point's, are read now.
  `retimed` ({pool file name: info}): a run that read one of those pools takes its info;
  `retimed_before` (the same, from the study's records): so does a run of one of those
  pools whose own info was not re-timed.
  The file is read as written, not through `stored.load`: rewritten, it keeps its names."""
  with open(path) as f:
    results = json.load(f)
  distill = results.get("distill") or {}
  name = os.path.basename(distill.get("cached") or "")
  info = (retimed or {}).get(name) or (
      None if distill.get("retimed") else (retimed_before or {}).get(name))
  if name and info is not None:
    results["distill"] = {**info, "cached": distill["cached"]}
  if step_time is None:
    step_time = results["cost"]["modelled"]["device_step_time_s"]
  cost = results["config"]["cost"]
  cost["device_step_time_s"] = step_time
  communication = None
  cluster = 0 if point_config is None else point_config.cost.devices
  if point_config is not None and (costs.recorded_communication(results) is None
                                   or cluster and cost["devices"] != cluster):
    # Priced on another cluster than its point's (workers spread over spare devices were
    # priced on all of them): its programs are read again on the point's.
    cost["devices"] = cluster or cost["devices"]
    communication = _read_communication(results, point_config, os.path.dirname(path))
  # Else the collectives the run recorded (older results: the legacy model, labelled).
  results["cost"] = costs.summary(results, communication, cost["devices"],
                                  cost.get("overlap", 0.0), simulated=True,
                                  device_step_time_s=step_time)
  record.write_json(path, results)


def _read_communication(results: dict, point_config, run_dir: str) -> costs.Communication:
  """The collectives of a finished run's compiled programs, read as the run reads them at
  its end (for a run whose own reading failed, e.g. a child process that could not build
  it): its point's config at the run's seed and tuned values, which must be the config the
  run saved."""
  config = copy.deepcopy(point_config)
  config.seed = results["config"]["seed"]
  for field in config.tune.fields:
    config_lib.set_dotted(config, field, tuning.trained_value(results["config"], field))
  changed = {k: v for k, v in resume.config_changes(results["config"], config).items()
             if not resume.may_change_on_resume(k, *v)}
  if changed:
    raise SystemExit(f"error: {run_dir} ran another config than its point's now ({changed}); "
                     "rerun it to read its programs")
  pool_config = copy.deepcopy(point_config)
  pool_config.seed = config.seed
  return run_lib.read_communication(config, run_dir, pool_config)


class _Unfinished(Exception):
  """A tuning run that has not been trained yet (recost trains nothing)."""


def _finished(config, run_dir: str) -> dict | None:
  del config
  finished, results = tuning.read_run(run_dir)
  if not finished:
    raise _Unfinished(run_dir)
  return results


def _moved(point_dir: str, record: dict) -> bool:
  """Whether the rule replayed on a point's finished tuning runs chooses other values than
  its committed tuning.json (the rule changed since, e.g. issue 58's margin): its seeds ran
  at the committed choice, so the committed record stays until the point is re-run
  (experiments/results/rerun_plan.md lists them); re-costing never re-tunes."""
  path = os.path.join(point_dir, tuning.TUNING_FILE)
  if not os.path.exists(path):
    return False
  with open(path) as f:
    committed = json.load(f)["chosen"]
  moved = committed != record["chosen"]
  if moved:
    print(f"recost: {point_dir}: the rule now chooses {record['chosen']}, not the committed "
          f"{committed}; the committed record is kept until the point is re-run")
  return moved


def recost(config_path: str, workdir: str, grid: str, recalibrate: bool = False,
           calibration_dir: str | None = None, curves: list[str] | None = None,
           keep_device_step: bool = False, retime_pools: bool = False) -> int:
  """Recomputes every finished run's `cost` block (tuning runs too) of the grid's `curves`
  (None: all) with its point's calibrated device step (after `recalibrate` re-times them
  all, e.g. on a quiet host; with `keep_device_step`, the one each run records: the cost
  model re-applied, nothing timed or compiled), and each point's tuning record from them;
  returns the seed runs updated. A pool re-timed before prices every run that read it
  (`_retimed_pools`). With `retime_pools`, every proxy-free pool the runs read is first
  built again by this code, timed (`_retime_pools`), and the runs take its build time: the
  same pool, this code's machinery, on the host that timed the calibrations (else refused:
  `_check_calibrated_here`).

  The cost block is derived from results.json and the calibration, so this changes no
  measurement: only which device step time the modelled time axis uses. A run whose own
  reading of its programs' collectives failed (the legacy model stood in, labelled) has
  them read now, from its compiled programs.
  """
  module = sweeps.load_config_module(config_path)
  calibration_dir = calibration_dir or os.path.join(workdir, "calibration")
  if retime_pools and not recalibrate:
    _check_calibrated_here(calibration_dir)
  if recalibrate:
    shutil.rmtree(calibration_dir, ignore_errors=True)
  grid_curves = _grid_curves(module, grid, curves)
  retimed = _retime_pools(module, grid_curves, workdir) if retime_pools else {}
  retimed_before = _retimed_pools(workdir)
  updated = 0
  for curve, points in grid_curves.items():
    for point, (variant, overrides) in points.items():
      config = _point_config(module, variant, overrides, 0, workdir)
      step_time = (None if keep_device_step
                   else device_step_time(config, calibration_dir, workdir))
      point_dir = os.path.join(workdir, curve, point)
      for path in glob.glob(os.path.join(point_dir, "tune", "*", run_lib.RESULTS_FILE)):
        _recost_file(path, step_time, config, retimed, retimed_before)
      config.seed = config.tune.seed
      try:
        record = tuning.tune(config, point_dir, _finished)[1]
      except _Unfinished:
        record = None
      else:
        if _moved(point_dir, record):
          record = None  # its seeds ran at the committed choice: kept until it is re-run
        else:
          tuning.write_record(point_dir, record)
      for path in glob.glob(os.path.join(point_dir, "seed*", run_lib.RESULTS_FILE)):
        _recost_file(path, step_time, config, retimed, retimed_before)
        if record is not None:
          tuning.attach(path, record)
        updated += 1
  print(report.write(workdir, workdir))
  return updated


FLAGS = flags.FlagValues()
flags.DEFINE_string("config", None, "a workload config file with a sweep_grid(name)",
                    flag_values=FLAGS)
flags.DEFINE_string("workdir", None, "where the runs, the table and the figures go",
                    flag_values=FLAGS)
flags.mark_flags_as_required(["config", "workdir"], flag_values=FLAGS)
flags.DEFINE_string("seeds", "1,2,3", "comma-separated seeds reported (tune.seed, 0, chooses the "
                    "tuned values; its run stays in tune/)", flag_values=FLAGS)
flags.DEFINE_string("grid", "full", "a grid the config's sweep_grid() knows", flag_values=FLAGS)
flags.DEFINE_string("curves", "", "comma-separated subset of the grid's curves",
                    flag_values=FLAGS)
flags.DEFINE_string("points", "", "comma-separated subset of the curves' points, e.g. "
                    "N2_L235,N4_L235", flag_values=FLAGS)
flags.DEFINE_bool("recost", False, "train nothing: recompute finished runs' cost blocks from "
                  "calibration", flag_values=FLAGS)
flags.DEFINE_bool("recalibrate", False, "with --recost: re-time every calibration first",
                  flag_values=FLAGS)
flags.DEFINE_bool("keep_device_step", False, "with --recost: keep each run's recorded "
                  "device step (the cost model re-applied, nothing timed)", flag_values=FLAGS)
flags.DEFINE_bool("retime_pools", False, "with --recost: build every proxy-free pool the runs "
                  "read again, timed (it must come out the same), and price the runs with "
                  "this code's build time; on a quiet host", flag_values=FLAGS)
flags.DEFINE_string("calibration", "", "the device-step timings' directory (default "
                    "<workdir>/calibration); another sweep's of the same workload shares its "
                    "timings", flag_values=FLAGS)
flags.DEFINE_multi_string("set", [], "<group>.<field>=<value> set on every point's config, "
                          "e.g. --set=data.data_dir=/data/tfds (where the data is)",
                          flag_values=FLAGS)
flags.DEFINE_bool("start_over", False, "the workdir holds another study: move its records "
                  "to <workdir>.previous (nothing is deleted) and start this one; where only some "
                  "points' configs changed, only theirs move, to each point's "
                  "superseded/start-over", flag_values=FLAGS)
flags.DEFINE_bool("tune_schedule", False, "every point also tunes its schedule's length "
                  "(train.schedule_fraction at tune.schedule_fractions) after its other "
                  "fields", flag_values=FLAGS)
flags.DEFINE_bool("plan", False, "train nothing: print the sweep as one command per job for "
                  "a cluster's scheduler (quiet phase, one line per point, report)",
                  flag_values=FLAGS)
flags.DEFINE_bool("quiet_only", False, "only the quiet phase: calibration and pools",
                  flag_values=FLAGS)
flags.DEFINE_bool("report", True, "write table.md and the figures when done (--noreport: "
                  "a point's job of --plan)", flag_values=FLAGS)
flags.DEFINE_bool("report_only", False, "train nothing: write table.md and the figures from "
                  "the finished runs", flag_values=FLAGS)
flags.DEFINE_bool("distributed", False, "join JAX's multi-controller runtime first "
                  "(jax.distributed.initialize: TPU pods, SLURM and Open MPI detect the "
                  "rest); every process runs this same command", flag_values=FLAGS)
flags.DEFINE_string("coordinator_address", "", "with --distributed where nothing is detected: "
                    "host:port of process 0", flag_values=FLAGS)
flags.DEFINE_integer("num_processes", 0, "with --distributed: the number of processes "
                     "(0: detected)", flag_values=FLAGS)
flags.DEFINE_integer("process_id", -1, "with --distributed: this process's index (-1: "
                     "detected)", flag_values=FLAGS)
flags.DEFINE_integer("local_device_count", 0, "with --distributed on CPU: fake devices per "
                     "process (tests)", flag_values=FLAGS)
sweeps.define_flags(FLAGS)
launcher.define_flags(FLAGS)


def _names(value: str) -> list[str]:
  return [v for v in value.split(",") if v]


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  if FLAGS.plan:
    print(plan(FLAGS.config, FLAGS.workdir, [int(s) for s in _names(FLAGS.seeds)], FLAGS.grid,
               _names(FLAGS.curves) or None, FLAGS.calibration or None, FLAGS.compile_cache,
               parse_settings(FLAGS.set), FLAGS.tune_schedule), end="")
    return 0
  if FLAGS.launcher == "slurm":  # --plan's jobs, submitted (their paths absolute)
    opts, absolute = launcher.options(FLAGS), lambda p: p and os.path.abspath(p)  # noqa: E731
    return launcher.run_slurm(jobs(
        absolute(FLAGS.config), absolute(FLAGS.workdir), [int(s) for s in _names(FLAGS.seeds)],
        FLAGS.grid, _names(FLAGS.curves) or None, absolute(FLAGS.calibration) or None,
        absolute(FLAGS.compile_cache), parse_settings(FLAGS.set), FLAGS.tune_schedule), opts)
  if FLAGS.report_only:
    print(report.write(FLAGS.workdir, FLAGS.workdir))
    return 0
  if FLAGS.distributed:  # before anything asks JAX about devices
    distributed.maybe_initialize(ml_collections.ConfigDict({
        "initialize": True, "coordinator_address": FLAGS.coordinator_address,
        "num_processes": FLAGS.num_processes, "process_id": FLAGS.process_id,
        "local_device_count": FLAGS.local_device_count}))
  sweeps.use_compile_cache(FLAGS.compile_cache)
  calibration_dir = FLAGS.calibration or None
  if FLAGS.recost:
    n = recost(FLAGS.config, FLAGS.workdir, FLAGS.grid, FLAGS.recalibrate, calibration_dir,
               _names(FLAGS.curves) or None, FLAGS.keep_device_step, FLAGS.retime_pools)
    print(f"sweep: {n} runs recosted")
    return 0
  code, counts = study.guarded(FLAGS.workdir, lambda: run(
      FLAGS.config, FLAGS.workdir, [int(s) for s in _names(FLAGS.seeds)], FLAGS.grid,
      _names(FLAGS.curves) or None, calibration_dir, _names(FLAGS.points) or None,
      FLAGS.quiet_only, FLAGS.report, parse_settings(FLAGS.set), FLAGS.tune_schedule,
      FLAGS.start_over))
  if code == 0:
    print(study.counts_line(counts))
  return code


if __name__ == "__main__":
  cli.run(main)
