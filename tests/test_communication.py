"""A method's programs compiled for the cluster its run stands for: here, when this host
has the devices, or in a child process with simulated ones (the sweeps' one-device host)."""
import copy
import dataclasses

import jax
import pytest

from ensemble_jax import communication, costs, train
from ensemble_jax.distill import pool as pool_lib

pytestmark = pytest.mark.integration


@pytest.mark.subprocess
def test_a_child_process_reads_the_same_collectives_as_this_one(tiny_config, tmp_path):
  tiny_config.cost.devices = 2  # trained on 8 devices, priced as a 2-device cluster
  s = train.set_up(tiny_config, str(tmp_path))
  pool = pool_lib.Pool(s.method.sampler(len(s.data.train), 0), None)
  train_batches, eval_batches = train._streams(tiny_config, s, pool)
  req = communication.request(tiny_config, s.method, num_classes=s.data.num_classes,
                              init_input=s.data.init_input, num_steps=s.num_steps,
                              steps_per_epoch=s.steps_per_epoch, train_batches=train_batches,
                              eval_batches=eval_batches)
  assert req.mesh == {"data": 2} and req.eval_batches == eval_batches.num_batches == 2
  here = communication.for_cluster(s.method, req)
  assert here.source.endswith("a {'data': 2} mesh of this host's devices")
  assert any(c.program == "train_step" and c.kind == "all-reduce" and c.group_size == 2
             for c in here.collectives)
  child = communication._read_in_child(req, 2)  # what a one-device host does
  assert costs.merged(child) == list(here.collectives)
  # A sweep point's tuning runs and seeds share one reading: the learning rate is a
  # constant of the programs, not part of what they exchange.
  other = dataclasses.replace(req, config=copy.deepcopy(req.config))
  other.config["seed"] += 1
  other.config["optim"]["learning_rate"] *= 4
  assert other.key() == req.key()
  assert costs.merged(communication.read(communication.build(other, jax.devices()[:2]),
                                         other)) == list(here.collectives)
  other.config["train"]["batch_size"] *= 2
  assert other.key() != req.key()


def test_a_request_keeps_the_mesh_in_the_form_the_config_holds(tiny_config, tmp_path):
  """Config files may hold the mesh as a list, the command line as a string: both are
  requests (a list-form config once fell back to the legacy model: type-safe field)."""
  s = train.set_up(tiny_config, str(tmp_path))
  pool = pool_lib.Pool(s.method.sampler(len(s.data.train), 0), None)
  train_batches, eval_batches = train._streams(tiny_config, s, pool)
  for mesh in ("data:-1", [("data", -1)]):
    tiny_config.mesh = mesh
    req = communication.request(tiny_config, s.method, num_classes=s.data.num_classes,
                                init_input=s.data.init_input, num_steps=s.num_steps,
                                steps_per_epoch=s.steps_per_epoch,
                                train_batches=train_batches, eval_batches=eval_batches)
    assert req.mesh == {"data": 8}


def _eval_seconds(config, eval_rows: int, eval_batches: int, link: str = "eth10g") -> dict:
  """The modelled communication of one evaluation of `eval_batches` x `eval_rows` windows,
  program by program, read as a run reads it at its end (`communication.read`)."""
  n, t = config.method.num_workers, config.data.context
  config.eval.batch_size = eval_rows
  req = communication.Request(
      config=config.to_dict(), num_classes=256, init_input=((1, t), "int32"), num_steps=4,
      steps_per_epoch=10, train_batch={"tokens": ([n, 8, t + 1], "int32")},
      eval_batch={"tokens": ([eval_rows, t + 1], "int32"), "mask": ([eval_rows], "float32")},
      eval_batches=eval_batches)
  found = communication.read(communication.build(req, jax.devices()[:n]), req)
  seconds = {}
  for c in costs.merged(found):
    if c.per in ("eval", "run") and c.program != "train_step":
      seconds[c.program] = seconds.get(c.program, 0.0) + c.count * c.seconds(
          costs.INTERCONNECTS[link])
  return seconds


def test_evaluations_are_priced_per_example_whatever_their_batch_size():
  """Halving eval.batch_size (twice the batches) is a memory setting: the same examples
  are scored and the modelled communication of an evaluation does not change."""
  from experiments.configs import pydocs_gpt2

  config = pydocs_gpt2.get_config("ensemble,tiny")
  config.method.num_workers, config.mesh = 4, [("worker", 4), ("data", 1)]
  whole = _eval_seconds(config, 16, 2)
  assert whole["eval"] > 0 and whole["final_eval"] > 0
  assert _eval_seconds(config, 8, 4) == pytest.approx(whole, rel=1e-9)
