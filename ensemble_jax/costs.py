"""What training costs: FLOPs from XLA, step time measured, communication modelled.

One CPU host simulating many devices cannot show interconnect time. It can show what is
communicated: every collective of every program a method runs (`Method.programs`), such as
the train step, evaluations, DiLoCo's outer step and a final aggregation. Each collective
is read off the compiled HLO (`ensemble_jax/hlo.py`) with its kind, operand bytes and
group size, and charged an alpha-beta time on a named interconnect preset
(`collective_time`). Everything else is measured. Reports label each number `measured` or
`modelled`.
"""
from __future__ import annotations

import dataclasses
import math
import statistics

from ensemble_jax import hlo


def flops(compiled) -> float:
  """FLOPs of one call of a compiled (SPMD) executable, as XLA's cost analysis counts them.

  Matches the analytic count on CPU. On GPU it misses the GEMMs and convolutions XLA
  hands to cuBLAS / cuDNN. On an H100 it read 0.11 of ResNet-50's 6.28 TFLOP per step, and
  2.6-5.1 of GPT-2 small's 14.0 (`experiments/bench/throughput.py`). GPU runs' FLOPs axes
  are not to be trusted until they are counted another way.
  """
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax returned one dict per program
    analysis = analysis[0] if analysis else {}
  return float((analysis or {}).get("flops", float("nan")))


def median_step_time(durations: list[float], warmup: int) -> float:
  steady = durations[warmup:] or durations
  return statistics.median(steady) if steady else float("nan")


@dataclasses.dataclass(frozen=True)
class Interconnect:
  """A link preset: bandwidth and per-message latency.

  Bandwidth is per device and each way, in bytes/s. Latency is in seconds, paid once per
  ring hop."""
  name: str
  bandwidth: float
  latency: float
  models: str  # the hardware the numbers stand for


# Assumed, order-of-magnitude figures; a report names the preset it used.
INTERCONNECTS = {
    "nvlink": Interconnect("nvlink", 300e9, 2e-6,
                           "NVLink 3 (A100): 300 GB/s each way per GPU; 2 us per message"),
    "ib_xdr800": Interconnect("ib_xdr800", 100e9, 5e-6,
                              "XDR InfiniBand, 800 Gb/s = 100 GB/s per port (NDR is 400 Gb/s "
                              "= 50 GB/s); 5 us per message"),
    "eth10g": Interconnect("eth10g", 1.25e9, 50e-6,
                           "10 Gb/s Ethernet = 1.25 GB/s; 50 us per message"),
}
# Preset keys that results.json files written before a rename carry, and their names now.
RENAMED_PRESETS = {"ib800": "ib_xdr800"}  # the same numbers: 800 Gb/s is XDR, not NDR


def collective_time(kind: str, operand_bytes: float, group_size: int,
                    link: Interconnect) -> float:
  """Alpha-beta time of one collective over a ring of g = `group_size` devices.

  `bytes` is what one device puts in: its operands, or for all-gather one of the g shards.

    all-reduce             2(g-1)/g * bytes / bandwidth + 2(g-1) * latency
    reduce-scatter          (g-1)/g * bytes / bandwidth +  (g-1) * latency
    all-gather              (g-1)   * bytes / bandwidth +  (g-1) * latency
    all-to-all              (g-1)/g * bytes / bandwidth +  (g-1) * latency
    collective-permute                bytes / bandwidth +          latency
    collective-broadcast              bytes / bandwidth +  (g-1) * latency (a pipelined chain)
  """
  g = group_size
  if g <= 1:
    return 0.0
  beta, alpha = operand_bytes / link.bandwidth, link.latency
  if kind == "all-reduce":
    return 2 * (g - 1) / g * beta + 2 * (g - 1) * alpha
  if kind in ("reduce-scatter", "all-to-all"):
    return (g - 1) / g * beta + (g - 1) * alpha
  if kind == "all-gather":
    return (g - 1) * beta + (g - 1) * alpha
  if kind == "collective-permute":
    return beta + alpha
  if kind == "collective-broadcast":
    return beta + (g - 1) * alpha
  raise ValueError(f"no time model for collective {kind!r}; known: {hlo.COLLECTIVE_OPS}")


# The units a program's calls are counted in, and how many of each the model at a given
# step needed (`units_to`). An `unsynced_eval` is an eval at a step no outer step preceded:
# DiLoCo's model there needs an outer step of its own (at a sync step, the sync's serves).
UNITS = ("step", "eval", "unsynced_eval", "sync", "run")
# Programs that score a model rather than make it: the evaluations, the ensemble's full
# passes at the end (`final_eval`, `soup`), DiLoCo's averages formed to be scored
# (`deployable`, one of which forms the model at the target: that one is training).
EVALUATION_PROGRAMS = ("eval", "final_eval", "soup", "deployable")
EVALUATION_RULE = (
    "evaluations are off the critical path: it holds what making the model at the target "
    "costs (pool, steps, their collectives, outer steps, the average forming the model at "
    "the target); the evaluations up to the target (their compute and collectives, for "
    "every method alike) are reported beside it as `evaluation_s`")


@dataclasses.dataclass(frozen=True)
class ProgramCollective:
  """One collective of a method's compiled program.

  An entry of results.json's `cost.modelled.collectives`. Identical ones are merged and
  their `count` summed."""
  program: str  # the method's name for the program: train_step, eval, sync, ...
  per: str  # the unit `count` is per (UNITS): every step, eval, outer step, or once a run
  kind: str  # all-reduce, all-gather, ... (hlo.COLLECTIVE_OPS)
  bytes: int  # operand bytes one device puts in
  group_size: int  # devices in each replica group
  count: int  # executions per unit

  def seconds(self, link: Interconnect) -> float:
    """One execution's modelled time."""
    return collective_time(self.kind, self.bytes, self.group_size, link)

  def record(self) -> dict:
    """The results.json entry: the fields, and one execution's seconds per preset."""
    return {**dataclasses.asdict(self),
            "seconds": {name: self.seconds(link) for name, link in INTERCONNECTS.items()}}

  @classmethod
  def from_record(cls, record: dict) -> ProgramCollective:
    return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls)})


# The one pricing rule for every program, grids and projection alike: collectives as the
# target platform's compiler runs them. XLA's AllReduceCombiner (GPU and TPU) merges
# independent all-reduces up to this many operand bytes (kDefaultAllReduceCombineThreshold,
# xla/service/collective_utils.h; `--xla_gpu_all_reduce_combine_threshold_bytes`). The
# CPU compiler of jax 0.10.2 already emits them combined (tuple all-reduces), so on the
# programs read here the model changes nothing: a synchronised BatchNorm's statistic
# reductions depend on each other, layer after layer, and no combiner merges them.
ALL_REDUCE_COMBINE_THRESHOLD_BYTES = 30 * 1024 * 1024 + 7


def program_collectives(program: str, per: str, calls: int, hlo_text: str, num_devices: int,
                        combine_threshold: int = ALL_REDUCE_COMBINE_THRESHOLD_BYTES
                        ) -> list[ProgramCollective]:
  """The collectives of one compiled program, identical ones merged.

  Read from its optimized HLO on `num_devices`, independent all-reduces combined as XLA's
  GPU and TPU compilers would (`hlo.combined`, up to `combine_threshold` bytes; 0: as
  written); the program runs `calls` times per `per`."""
  if per not in UNITS:
    raise ValueError(f"program {program!r}: per={per!r} is not one of {UNITS}")
  read = (hlo.combined(hlo_text, combine_threshold) if combine_threshold
          else hlo.collectives(hlo_text))
  found = [ProgramCollective(program, per, c.op, c.operand_bytes,
                             c.group_size(num_devices), calls * c.executions)
           for c in read]
  return merged(found)


def merged(collectives: list[ProgramCollective]) -> list[ProgramCollective]:
  """Identical collectives (all fields but `count`) as one entry, in first-seen order."""
  counts: dict[ProgramCollective, int] = {}
  for c in collectives:
    key = dataclasses.replace(c, count=0)
    counts[key] = counts.get(key, 0) + c.count
  return [dataclasses.replace(k, count=n) for k, n in counts.items()]


@dataclasses.dataclass(frozen=True)
class Communication:
  """What a run communicates, and where that was read."""
  collectives: tuple[ProgramCollective, ...]
  source: str  # the compiled HLO on which mesh; "legacy, ..." where it was assumed


def legacy_devices(results: dict) -> int:
  """The device count D for results that do not record it.

  One device per worker of a stacked method's (its results carry `num_workers`), else one
  per data-parallel replica of the mesh."""
  if "num_workers" not in results:
    return results["mesh"].get("data", math.prod(results["mesh"].values()))
  return results.get("num_workers", 1)


# How the legacy model priced the records of the methods it priced, by the name results.json
# records (a stored fact of those records, not a capability): the units (`UNITS`) per which
# each all-reduces its fp32 parameters once. A method not here has no legacy price.
LEGACY_ALLREDUCES = {"data_parallel": ("step",), "diloco": ("sync", "run"), "ensemble": ()}


def legacy_communication(results: dict, devices: int, why: str) -> Communication:
  """The single-all-reduce model, for results without collectives read from HLO.

  `why` says why they lack them. Data-parallel pays a gradient all-reduce per step. DiLoCo
  pays a weight all-reduce per outer step before the model, and one for the model itself:
  the outer step a run stopping there takes. The ensemble pays nothing. Any other method
  raises: its costs are read from its compiled programs or not at all."""
  if results["method"] not in LEGACY_ALLREDUCES:
    raise ValueError(f"method {results['method']!r} has no legacy cost model (only "
                     f"{', '.join(LEGACY_ALLREDUCES)}): its costs must be read from its "
                     f"compiled programs ({why}).")
  param_bytes = 4 * results.get("num_params", results.get("num_params_per_worker", 0))

  def allreduce(per):
    return ProgramCollective("assumed", per, "all-reduce", param_bytes, devices, 1)

  collectives = tuple(allreduce(per) for per in LEGACY_ALLREDUCES[results["method"]])
  return Communication(collectives, f"legacy, not read from HLO ({why}): one ring "
                       "all-reduce of the fp32 parameters over the D devices per step "
                       "(data_parallel) or per outer step (diloco), none for the ensemble")


def recorded_communication(results: dict) -> Communication | None:
  """The communication a results.json's cost block carries (None: written before it)."""
  modelled = results.get("cost", {}).get("modelled", {})
  if "collectives" not in modelled or modelled["collectives_source"].startswith("legacy"):
    return None
  return Communication(tuple(ProgramCollective.from_record(r)
                             for r in modelled["collectives"]),
                       modelled["collectives_source"])


def split_count(c: ProgramCollective, units: dict[str, float]) -> tuple[float, float]:
  """(training, evaluation) executions of `c` to the target (`EVALUATION_RULE`)."""
  n = c.count * units.get(c.per, 0)
  if c.program not in EVALUATION_PROGRAMS:
    return n, 0.0
  if c.per == "unsynced_eval":  # the model at the target is formed by one of them
    training = c.count * min(1, units.get(c.per, 0))
    return training, n - training
  return 0.0, n


def units_to(steps: int, results: dict) -> dict[str, int]:
  """How many of each cost unit the model at `steps` needed.

  The units are its steps; the evals up to and at `steps`, since each decides whether to
  stop; those evals at a step without an outer step before it; the outer steps before
  `steps`; and the run, once. The outer step at `steps` comes after that step's eval, which
  scored the model without it, so it counts as an unsynced eval."""
  synced = {s for s in results.get("syncs", []) if s < steps}
  evals = [h["step"] for h in results.get("history", []) if h["step"] <= steps]
  return {"step": steps, "eval": len(evals),
          "unsynced_eval": sum(1 for s in evals if s not in synced),
          "sync": len(synced), "run": 1}


@dataclasses.dataclass
class Measured:
  """Measured on this host."""
  train_time_s: float
  step_time_s: float
  steps_to_target: int  # all steps trained when the target was not reached
  flops: float
  flops_to_target: float
  pool_build_time_s: float
  host_devices: int
  where: str
  # A knowledge-distillation teacher's training (results.json `teacher`), in `flops` and
  # `flops_to_target`: measured where the teacher ran.
  teacher_flops: float = 0.0


@dataclasses.dataclass
class Modelled:
  """Modelled for a cluster of `devices` devices, per interconnect preset."""
  devices: int
  device_step_time_s: float
  device_step_model: str
  collectives: list[dict]  # ProgramCollective.record() of each
  collectives_source: str
  units_to_target: dict[str, int]  # steps, evals, outer steps, run (units_to)
  communication_s: dict[str, float]  # to the target, per preset (0 on real devices)
  communication_model: str
  overlap: float
  critical_path_s: dict[str, float]  # to the target, per interconnect preset
  device_seconds: dict[str, float]
  # Beside the critical path (EVALUATION_RULE): the evaluations up to the target, their
  # compute (measured eval time, per device) plus their collectives, per preset.
  evaluation_s: dict[str, float]
  evaluation_compute_s: float
  evaluation_rule: str
  # The teacher's training time on its own cluster, per preset, on the critical path (it
  # trains before the students); its device-seconds are its own cluster's.
  teacher_s: dict[str, float] = dataclasses.field(default_factory=dict)


def _device_step(step_time_s: float, parallel: int, devices: int,
                 device_step_time_s: float) -> tuple[float, str]:
  """One device's step time on the modelled cluster, and how it was modelled.

  On a simulated mesh (`parallel` 1) one host did the work of all D devices one after
  another, so a device's step is the host's step / D. On real accelerators the measured
  step is already one device's, so it scales by mesh size / D. A `device_step_time_s` > 0
  replaces that estimate: the sweep's calibration times one model at the per-device batch
  on a quiet host, immune to whatever else shared the host during this run.
  """
  if device_step_time_s > 0:
    return device_step_time_s, ("calibrated: median step of one model at the per-device "
                                "batch, timed apart")
  return (step_time_s * parallel / devices,
          f"measured host step x {parallel} / {devices} devices")


def summary(results: dict, communication: Communication | None = None, devices: int = 0,
            overlap: float = 0.0, simulated: bool = True,
            device_step_time_s: float = 0.0) -> dict:
  """The `cost` block of results.json: what was measured here and what is modelled.

  `communication` holds the collectives of the run's programs on its cluster. If None,
  those the results' cost block records are used, else `legacy_communication`, labelled
  as such. `devices` (D) is the cluster the run stands for; 0 means the one the cost block
  records, else `legacy_devices`. `_device_step` says how one device's step is modelled.

  The critical path to the target is the same for every method. It is a teacher's training
  time (knowledge distillation: results.json `teacher`, `whole_run`), plus the pool's build
  time, plus steps x device step, plus each training collective's time x its count per
  unit x the units the model at the target needed (`units_to`), times (1 - overlap).
  Evaluations are beside it, not on it (`EVALUATION_RULE`, `split_count`). Communication
  is charged only when simulated; on real devices the measured step holds it.
  """
  recorded = results.get("cost", {}).get("modelled", {})
  devices = devices or recorded.get("devices") or legacy_devices(results)
  if communication is None:
    communication = recorded_communication(results) or legacy_communication(
        results, devices, "results written before collectives were read")
  target = results["target"]
  steps = target["reached_step"] if target["reached"] else results["steps"]
  distill = results.get("distill") or {}
  pool_time, pool_flops = distill.get("build_time_s", 0.0), distill.get("build_flops", 0.0)
  teacher = results.get("teacher") or {}
  teacher_flops, teacher_s = teacher.get("flops", 0.0), teacher.get("critical_path_s", {})
  mesh_devices = math.prod(results["mesh"].values())
  measured = Measured(
      train_time_s=results["train_time_s"], step_time_s=results["step_time_s"],
      steps_to_target=steps,
      flops=results["flops_per_step"] * results["steps"] + pool_flops + teacher_flops,
      flops_to_target=results["flops_per_step"] * steps + pool_flops + teacher_flops,
      pool_build_time_s=pool_time, host_devices=mesh_devices,
      where="one host: the simulated devices share its cores" if simulated else "real devices",
      teacher_flops=teacher_flops)
  device_step, how = _device_step(results["step_time_s"], 1 if simulated else mesh_devices,
                                  devices, device_step_time_s)
  augment = (distill.get("distillation") or {}).get("train_augmentation", "none")
  if device_step_time_s > 0 and augment != "none":  # a sweep's: cost_vs_time.augment_factor
    how += (f"; times the {augment} augmentation's cost on its synthetic examples (the "
            "augmented step over the plain one, timed side by side)")
  units = units_to(steps, results)
  counts = [(c, *split_count(c, units)) for c in communication.collectives]
  communication_s = {
      name: (1.0 - overlap) * sum(train * c.seconds(link) for c, train, _ in counts)
      if simulated else 0.0 for name, link in INTERCONNECTS.items()}
  critical = {name: teacher_s.get(name, 0.0) + pool_time + steps * device_step
              + communication_s[name] for name in INTERCONNECTS}
  # One eval's measured time on this host (all of its devices' work one after another when
  # simulated, as the step's), per device, times the evals to the target.
  evals_run = max(1, len(results.get("history", [])))
  eval_compute = (results.get("eval_time_s", 0.0) / evals_run * units["eval"]
                  * (1 if simulated else mesh_devices) / devices)
  evaluation_s = {
      name: eval_compute + ((1.0 - overlap) * sum(ev * c.seconds(link) for c, _, ev in counts)
                            if simulated else 0.0)
      for name, link in INTERCONNECTS.items()}
  modelled = Modelled(
      devices=devices, device_step_time_s=device_step, device_step_model=how,
      collectives=[c.record() for c in communication.collectives],
      collectives_source=communication.source, units_to_target=units,
      communication_s=communication_s,
      communication_model=("per collective, on a ring of its group's g devices: latency x "
                           "hops + bytes moved / bandwidth (costs.collective_time), times "
                           "(1 - overlap); presets: " + "; ".join(
                               f"{k}: {v.models}" for k, v in INTERCONNECTS.items())),
      overlap=overlap, critical_path_s=critical,
      # the teacher's time on its own cluster's devices, the rest on this run's
      device_seconds={k: devices * (v - teacher_s.get(k, 0.0))
                      + teacher.get("device_seconds", {}).get(k, 0.0)
                      for k, v in critical.items()},
      evaluation_s=evaluation_s, evaluation_compute_s=eval_compute,
      evaluation_rule=EVALUATION_RULE, teacher_s=teacher_s)
  return {"measured": dataclasses.asdict(measured), "modelled": dataclasses.asdict(modelled)}


def at_target(results: dict, value: float) -> dict | None:
  """`results` read at another rung of its ladder (results.json `targets`): that rung as its
  `target`, its `cost` priced to it as its own cost block prices the run (its devices,
  device step, collectives and overlap). None if the run did not track that rung."""
  rung = next((t for t in results.get("targets", [results["target"]])
               if math.isclose(t["value"], value, rel_tol=1e-9)), None)
  if rung is None:
    return None
  retargeted = {**results, "target": rung}
  return {**retargeted, "cost": repriced(retargeted)}


def whole_run(results: dict) -> dict:
  """What a finished run cost to train, all of its steps (not to its target): a teacher's
  charge. Its FLOPs, its critical-path time per preset and its device-seconds, priced as
  its own cost block prices it (its devices, device step, collectives and overlap)."""
  cost = repriced({**results, "target": {**results["target"], "reached": False}})
  return {"flops": cost["measured"]["flops_to_target"],
          "critical_path_s": cost["modelled"]["critical_path_s"],
          "device_seconds": cost["modelled"]["device_seconds"],
          "devices": results["cost"]["modelled"]["devices"]}


def repriced(results: dict) -> dict:
  """The run's `cost` block as `summary` makes it of the record now, priced as its own cost
  block prices it (its devices, device step, collectives and overlap)."""
  recorded = results["cost"]
  modelled = recorded["modelled"]
  return summary(results, devices=modelled["devices"], overlap=modelled["overlap"],
                 simulated=recorded["measured"]["where"].startswith("one host"),
                 device_step_time_s=modelled["device_step_time_s"])


def charged(results: dict, teacher_results: dict) -> dict:
  """`results` with its teacher's training (results.json `teacher`) charged as the teacher's
  own record `teacher_results` prices it now (`whole_run`), its cost block summed again
  with it; a run without a teacher as it is.

  The `teacher` block holds the price of the day the run trained: a teacher re-priced since
  (`--recost`) leaves it stale, so every report charges it from the teacher's record
  (`report.read_run`). Raises ValueError if that record is another run (other steps)."""
  teacher = results.get("teacher")
  if not teacher:
    return results
  if teacher_results["steps"] != teacher["steps"]:
    raise ValueError(
        f"the teacher {teacher['workdir']!r} taught this run after {teacher['steps']} steps; "
        f"its results.json now records {teacher_results['steps']}: another run, not the one "
        "to charge. Train the teacher again as it was, or the student with this teacher.")
  taught = {**results, "teacher": {**teacher, **whole_run(teacher_results)}}
  return {**taught, "cost": repriced(taught)}


def tuning_compute(runs: list[dict | None]) -> dict:
  """What a point's tuning runs cost together: training FLOPs and modelled critical-path time
  and device-seconds per interconnect preset, summed over the runs (one after another),
  plus each distilled pool once: one per tuning seed (the runs on one seed read the same
  pool). A teacher's training is in each taught run's critical path, so charged per run.
  Diverged runs (None) stopped early with no results: they are counted in `diverged`, not
  in the sums. The tuning record's `compute` (experiments/sweeps/tuning.py), summed again
  at report time from its runs' records (`report.read_run`)."""
  done = [r for r in runs if r is not None]
  presets = tuple(INTERCONNECTS)
  flops = sum(r["flops_per_step"] * r["steps"] for r in done)
  time_s = dict.fromkeys(presets, 0.0)
  device_s = dict.fromkeys(presets, 0.0)
  pools = {}  # seed -> (build seconds, build FLOPs)
  for r in done:
    pool = r["cost"]["measured"]["pool_build_time_s"]
    pools[r.get("config", {}).get("seed")] = (pool, (r.get("distill") or {}).get("build_flops",
                                                                                  0.0))
    devices = r["cost"]["modelled"]["devices"]
    for p in presets:
      train_s = r["cost"]["modelled"]["critical_path_s"][p] - pool
      time_s[p] += train_s
      device_s[p] += devices * train_s
  pool_s = sum(build for build, _ in pools.values())
  pool_flops = sum(build_flops for _, build_flops in pools.values())
  if done:
    devices = done[0]["cost"]["modelled"]["devices"]
    time_s = {p: t + pool_s for p, t in time_s.items()}
    device_s = {p: s + devices * pool_s for p, s in device_s.items()}
  return {"runs": len(runs), "diverged": len(runs) - len(done), "flops": flops + pool_flops,
          "time_s": time_s, "device_seconds": device_s, "pool_build_time_s": pool_s}
