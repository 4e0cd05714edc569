"""A method's programs compiled for the cluster its run stands for: here, when this host
has the devices, or in a child process with simulated ones (the sweeps' one-device host)."""
import copy
import dataclasses

import jax

from ensemble_jax import communication, costs, train
from ensemble_jax.data import samplers


def test_a_child_process_reads_the_same_collectives_as_this_one(tiny_config, tmp_path):
  tiny_config.cost.devices = 2  # trained on 8 devices, priced as a 2-device cluster
  s = train.set_up(tiny_config, str(tmp_path))
  pool = samplers.Pool(s.method.sampler(len(s.data.train), 0), None)
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
  pool = samplers.Pool(s.method.sampler(len(s.data.train), 0), None)
  train_batches, eval_batches = train._streams(tiny_config, s, pool)
  for mesh in ("data:-1", [("data", -1)]):
    tiny_config.mesh = mesh
    req = communication.request(tiny_config, s.method, num_classes=s.data.num_classes,
                                init_input=s.data.init_input, num_steps=s.num_steps,
                                steps_per_epoch=s.steps_per_epoch,
                                train_batches=train_batches, eval_batches=eval_batches)
    assert req.mesh == {"data": 8}
