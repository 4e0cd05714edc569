"""The communication model against hand-computed values, the critical path priced from a
program's collectives, and old results.json files priced as before."""
import json
import os

import pytest

from ensemble_jax import costs
from tests.conftest import REPO
from tests.test_hlo import HLO

pytestmark = pytest.mark.unit

LINK = costs.Interconnect("test", bandwidth=1e9, latency=1e-5, models="a 1 GB/s test link")


@pytest.mark.parametrize("kind,operand_bytes,seconds", [
    # 8 devices, 100 MB per device: 2*7/8 * 0.1 s + 14 * 10 us
    ("all-reduce", 100e6, 0.175 + 14e-5),
    ("reduce-scatter", 100e6, 0.0875 + 7e-5),  # 7/8 of the buffer leaves, 7 hops
    ("all-gather", 12.5e6, 0.0875 + 7e-5),  # a 12.5 MB shard in, 100 MB gathered
    ("all-to-all", 100e6, 0.0875 + 7e-5),  # 7/8 of the buffer to 7 peers
    ("collective-permute", 100e6, 0.1 + 1e-5),  # one send, all devices at once
    ("collective-broadcast", 100e6, 0.1 + 7e-5),  # a pipelined chain of 8
])
def test_alpha_beta_time_by_hand(kind, operand_bytes, seconds):
  assert costs.collective_time(kind, operand_bytes, 8, LINK) == pytest.approx(seconds)
  assert costs.collective_time(kind, operand_bytes, 1, LINK) == 0.0  # alone: no link


def test_alpha_beta_latency_bound_and_unknown_kinds():
  # 33 BatchNorm reductions of 256 bytes over 8 devices on 10 GbE cost ~35x one's latency
  # sum, not nothing: 33 * (14 * 50 us + 2*7/8 * 256 B / 1.25 GB/s)
  eth = costs.INTERCONNECTS["eth10g"]
  assert 33 * costs.collective_time("all-reduce", 256, 8, eth) == pytest.approx(
      33 * (14 * 50e-6 + 1.75 * 256 / 1.25e9))
  with pytest.raises(ValueError, match="no time model"):
    costs.collective_time("all-reduce-scatter-gather", 1, 2, eth)


def test_presets_name_what_they_model():
  # 800 Gb/s InfiniBand is XDR (NDR is 400 Gb/s): the preset says so in its name.
  assert "ib800" not in costs.INTERCONNECTS and costs.RENAMED_PRESETS["ib800"] == "ib_xdr800"
  xdr = costs.INTERCONNECTS["ib_xdr800"]
  assert xdr.bandwidth == 800e9 / 8 and "XDR" in xdr.models and "NDR is 400" in xdr.models
  for name, link in costs.INTERCONNECTS.items():  # each states its latency
    assert link.name == name and link.latency > 0
    assert f"{link.latency * 1e6:g} us" in link.models, link.models


def test_program_collectives_count_calls_and_merge_identical_ones():
  ar = next(line for line in HLO.splitlines() if line.startswith("  %ar ="))
  twice = HLO.replace(ar, ar + "\n" + ar.replace("%ar =", "%ar.9 ="))
  found = costs.program_collectives("eval", "eval", 5, twice, 8, combine_threshold=0)
  by_kind = {(c.kind, c.bytes): c for c in found}
  assert len(found) == 3  # the second gradient all-reduce merged into its twin
  assert by_kind["all-reduce", 2688].count == 2 * 5
  assert by_kind["all-reduce", 16].count == 5 * 3 and by_kind["all-reduce", 16].group_size == 4
  assert all(c.program == "eval" and c.per == "eval" for c in found)
  with pytest.raises(ValueError, match="per='epoch'"):
    costs.program_collectives("eval", "epoch", 1, HLO, 8)


# Three BatchNorm-like statistic all-reduces of 256 bytes on 8 devices: %a and %b
# independent, %c computed from %a's result (the next layer's statistics need the last's).
CHAIN = """\
ENTRY %main (x: f32[64], y: f32[64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  %y = f32[64]{0} parameter(1)
  %a = f32[64]{0} all-reduce(%x), channel_id=1, replica_groups=[1,8]<=[8], to_apply=%add
  %b = f32[64]{0} all-reduce(%y), channel_id=2, replica_groups=[1,8]<=[8], to_apply=%add
  %n = f32[64]{0} multiply(%a, %x)
  %c = f32[64]{0} all-reduce(%n), channel_id=3, replica_groups=[1,8]<=[8], to_apply=%add
  ROOT %r = f32[64]{0} add(%c, %b)
}
"""


def test_independent_all_reduces_are_priced_combined_and_dependent_ones_apart():
  """One pricing rule, as the target platform's compiler runs a program: XLA's combiner
  (GPU and TPU) merges independent all-reduces up to its byte threshold; one that needs
  another's result (a synchronised BatchNorm's next layer) stays apart."""
  assert costs.ALL_REDUCE_COMBINE_THRESHOLD_BYTES == 30 * 1024 * 1024 + 7
  found = costs.program_collectives("train_step", "step", 1, CHAIN, 8)
  assert sorted((c.bytes, c.count) for c in found) == [(256, 1), (512, 1)]  # a+b, then c
  eth = costs.INTERCONNECTS["eth10g"]
  combined = sum(c.count * c.seconds(eth) for c in found)
  apart = sum(c.count * c.seconds(eth) for c in costs.program_collectives(
      "train_step", "step", 1, CHAIN, 8, combine_threshold=0))
  assert combined == pytest.approx(apart - 14 * eth.latency)  # one latency-bound ring fewer
  # past the threshold nothing combines
  assert [(c.bytes, c.count) for c in costs.program_collectives(
      "train_step", "step", 1, CHAIN, 8, combine_threshold=300)] == [(256, 3)]


def _results(method, **extra):
  return {"method": method, "mesh": {"data": 1}, "train_time_s": 40.0, "step_time_s": 0.4,
          "eval_time_s": 2.0,
          "steps": 100, "flops_per_step": 1e9, "num_params": 1e6,
          "history": [{"step": s} for s in (20, 40, 60, 80, 100)],
          "target": {"reached": True, "reached_step": 60}, **extra}


def test_summary_prices_each_collective_by_its_unit():
  eth = costs.INTERCONNECTS["eth10g"]
  grad = costs.ProgramCollective("train_step", "step", "all-reduce", 4_000_000, 4, 1)
  norm = costs.ProgramCollective("train_step", "step", "all-reduce", 256, 4, 20)
  logits = costs.ProgramCollective("eval", "eval", "all-gather", 10_000, 4, 2)
  outer = costs.ProgramCollective("sync", "sync", "all-reduce", 4_000_000, 4, 1)
  once = costs.ProgramCollective("soup", "run", "all-reduce", 4_000_000, 4, 1)
  comm = costs.Communication((grad, norm, logits, outer, once), "hand-written")
  results = _results("any", syncs=[20, 40, 60, 100])
  s = costs.summary(results, comm, devices=4)
  m = s["modelled"]
  # to step 60: 60 steps, the evals at 20, 40 and 60, the outer steps at 20 and 40 (the one
  # at 60 follows that step's eval), the run once
  assert m["units_to_target"] == {"step": 60, "eval": 3, "unsynced_eval": 1, "sync": 2,
                                  "run": 1}
  t = costs.collective_time
  # One rule: what makes the model is on the critical path; the evaluations (the eval
  # program's gathers and the soup pass, compute and collectives) are reported beside it.
  comm_s = (60 * (t("all-reduce", 4e6, 4, eth) + 20 * t("all-reduce", 256, 4, eth))
            + 2 * t("all-reduce", 4e6, 4, eth))
  assert m["communication_s"]["eth10g"] == pytest.approx(comm_s)
  # The host did 4 devices' work per step: one device's step is 0.1 s.
  assert m["critical_path_s"]["eth10g"] == pytest.approx(60 * 0.1 + comm_s)
  assert m["device_seconds"]["eth10g"] == pytest.approx(4 * (60 * 0.1 + comm_s))
  # 2 s of host eval time over the run's 5 evals: 0.4 s each, 0.1 s per device, 3 to target
  assert m["evaluation_compute_s"] == pytest.approx(3 * 0.1)
  assert m["evaluation_s"]["eth10g"] == pytest.approx(
      3 * 0.1 + 3 * 2 * t("all-gather", 10_000, 4, eth) + t("all-reduce", 4e6, 4, eth))
  assert m["evaluation_rule"] == costs.EVALUATION_RULE
  assert m["collectives"][1] == {**vars(norm), "seconds": {
      k: t("all-reduce", 256, 4, link) for k, link in costs.INTERCONNECTS.items()}}
  assert m["collectives_source"] == "hand-written"
  half = costs.summary(results, comm, devices=4, overlap=0.5)["modelled"]
  assert half["communication_s"]["eth10g"] == pytest.approx(comm_s / 2)
  real = costs.summary(results, comm, devices=4, simulated=False)["modelled"]
  # On real devices the measured step is one device's and already holds the communication.
  assert real["critical_path_s"]["eth10g"] == pytest.approx(60 * 0.4 / 4)
  pool = costs.summary({**results, "distill": {"build_time_s": 3.0, "build_flops": 5e9}},
                       costs.Communication((), "none"), devices=8)
  assert pool["modelled"]["critical_path_s"]["nvlink"] == pytest.approx(3.0 + 60 * 0.05)
  assert pool["measured"]["flops_to_target"] == 65e9 and pool["measured"]["flops"] == 105e9


def test_an_outer_step_at_an_eval_is_charged_once():
  """DiLoCo evaluates at every eval the model a stop would deploy: at a sync step, the
  sync's own outer step. Its weight all-reduce is charged once there, not also for the
  eval (regression: every eval was charged one besides the syncs')."""
  eth = costs.INTERCONNECTS["eth10g"]
  ring = costs.collective_time("all-reduce", 4e6, 4, eth)
  comm = costs.Communication((
      costs.ProgramCollective("deployable", "unsynced_eval", "all-reduce", 4_000_000, 4, 1),
      costs.ProgramCollective("sync", "sync", "all-reduce", 4_000_000, 4, 1)), "hand-written")
  # H = 40, evals every 20 steps, reached at 60: outer steps at 40 and (after its eval) 60.
  results = _results("diloco", syncs=[40, 60])
  m = costs.summary(results, comm, devices=4)["modelled"]
  assert m["units_to_target"] == {"step": 60, "eval": 3, "unsynced_eval": 2, "sync": 1,
                                  "run": 1}
  # The run to step 60 all-reduces its workers' weights three times: for the evals at 20 and
  # 60, and at the sync at 40, whose outer step the eval at 40 scores. The one at 40 and
  # the one forming the model at 60 make the model; the one at 20 only scored one.
  assert m["communication_s"]["eth10g"] == pytest.approx(2 * ring)
  assert m["evaluation_s"]["eth10g"] - m["evaluation_compute_s"] == pytest.approx(ring)


def test_calibrated_device_step_replaces_the_host_estimate():
  comm = costs.Communication((), "none")
  dp = costs.summary(_results("data_parallel"), comm, devices=4, device_step_time_s=0.08)
  assert dp["modelled"]["device_step_time_s"] == 0.08
  assert dp["modelled"]["device_step_model"].startswith("calibrated")
  assert dp["modelled"]["critical_path_s"]["nvlink"] == pytest.approx(60 * 0.08)
  assert "augmentation" not in dp["modelled"]["device_step_model"]


def test_a_calibrated_step_says_it_prices_the_synthetic_augmentation():
  """Distilled runs' steps augment their synthetic examples (DSA); a sweep prices them at a
  plain calibrated step times the augmented step over the plain one
  (`cost_vs_time.augment_factor`): the record says so. A run priced at its own measured
  step holds the augmentation: nothing to say."""
  comm = costs.Communication((), "none")
  results = _results("ensemble", num_workers=4)
  results["distill"] = {"distillation": {"train_augmentation": "dsa"}}
  how = costs.summary(results, comm, devices=4, device_step_time_s=0.08)["modelled"][
      "device_step_model"]
  assert how.startswith("calibrated") and "times the dsa augmentation's cost" in how
  assert "augmentation" not in costs.summary(results, comm, devices=4)["modelled"][
      "device_step_model"]


def test_results_without_collectives_keep_the_old_single_allreduce_model():
  eth = costs.INTERCONNECTS["eth10g"]
  ring = costs.collective_time("all-reduce", 4e6, 4, eth)
  dp = costs.summary(_results("data_parallel"), devices=4)["modelled"]
  assert dp["collectives_source"].startswith("legacy, not read from HLO")
  assert dp["critical_path_s"]["eth10g"] == pytest.approx(60 * (0.1 + ring))
  ens = costs.summary(_results("ensemble", num_workers=8))["modelled"]
  assert ens["devices"] == 8 and ens["critical_path_s"]["eth10g"] == pytest.approx(60 * 0.05)
  # DiLoCo reached at 50 (H = 20): outer steps at 20, 40 and the deployable one at 50.
  dl = costs.summary(_results("diloco", mesh={"worker": 1, "data": 1}, num_workers=4,
                              sync_every=20, syncs=[20, 40, 50],
                              target={"reached": True, "reached_step": 50}))["modelled"]
  assert dl["devices"] == 4
  assert dl["critical_path_s"]["eth10g"] == pytest.approx(50 * 0.1 + 3 * ring)


@pytest.mark.parametrize("point", ["data_parallel_D4", "diloco_H50", "ensemble_N4_L300"])
def test_committed_results_are_priced_as_they_were(point):
  """A results.json measured before collectives were read (seed 0 of three points of the
  Fashion-MNIST grid before issue 13's re-run, kept under tests/data), re-priced as
  `--recost` does: the stored critical paths again (its `ib800` is now `ib_xdr800`),
  labelled legacy."""
  path = os.path.join(REPO, "tests", "data", "legacy_results", f"{point}.json")
  with open(path) as f:
    results = json.load(f)
  cost = results["config"]["cost"]
  again = costs.summary(results, None, cost["devices"], cost["overlap"],
                        device_step_time_s=cost["device_step_time_s"])["modelled"]
  assert again["collectives_source"].startswith("legacy")
  stored = results["cost"]["modelled"]["critical_path_s"]
  for old, seconds in stored.items():
    assert again["critical_path_s"][costs.RENAMED_PRESETS.get(old, old)] == pytest.approx(
        seconds, rel=1e-12)
