"""ResNet-50 on ImageNet (TFDS imagenet2012 as array_record in config.data.data_dir).

  python -m ensemble_jax.main --config=experiments/configs/imagenet_resnet50.py \
      --workdir=/ckpt/rn50 --config.data.data_dir=/data/tensorflow_datasets

Prepare the data once: `tfds build imagenet2012 --manual_dir=DIR_WITH_TARS
--data_dir=DATA_DIR --file_format=array_record`. The classic recipe: batch 1024,
SGD + Nesterov momentum 0.9, peak lr 0.1 * batch/256 (= 0.4), 5 warmup epochs, cosine
over 90 epochs, weight decay 1e-4 (not on BN/bias), label smoothing 0.1, Inception crop
at 224. Target: 75% top-1 on the validation split. One step at batch 8 takes ~2 s on a
CPU core, so this config is for accelerators (a v3-8 runs it in about a day).
"""
from ensemble_jax.config_lib import base_config


def get_config(arg: str = ""):
  c = base_config()
  c.data.dataset = "imagenet2012"
  c.data.source = "tfds"
  c.data.image_size = 224
  c.data.train_augment = "inception"
  c.data.eval_resize = 256
  c.data.mean, c.data.std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
  c.data.num_threads = 16
  c.data.prefetch = 4
  c.model.name, c.model.width, c.model.stem = "resnet50", 64, "imagenet"
  c.model.dtype = "bfloat16"
  c.optim.name = "sgd"
  c.optim.learning_rate, c.optim.base_batch_size = 0.1, 256  # linear scaling rule
  c.optim.momentum, c.optim.nesterov = 0.9, True
  c.optim.weight_decay = 1e-4
  c.optim.warmup_epochs = 5.0
  c.optim.label_smoothing = 0.1
  c.train.batch_size = 1024
  c.train.num_epochs = 90.0
  c.train.log_every_steps = 100
  c.eval.split = "validation"
  c.eval.batch_size = 1024
  c.eval.target_metric, c.eval.target_value = "accuracy", 0.75
  c.checkpoint.every_steps = 2000
  if arg:
    raise ValueError(f"unknown variant {arg!r} of imagenet_resnet50.py")
  return c


IMAGENET_TRAIN_EXAMPLES = 1_281_167


def critical_batch_grid(name: str = "full") -> dict:
  """Data-parallel's critical batch, for experiments/sweeps/critical_batch.py.

  ResNet-50 at global batch B = 1,024 .. 65,536 images, 128 per device (D = 8 .. 512):
  the recipe keeps its 90-epoch accuracy up to B = 8,192 with the linear rule (Goyal et
  al., 2017), and Shallue et al. (2018) saw its steps to target stop halving somewhere
  between 8,192 and 65,536, so the range brackets the knee. 128 images per device keep an
  accelerator busy (one H100 in bf16 runs batch 256 at 5,213 images/s,
  experiments/results/bench/h100/).

  The recipe's rules, per point: peak lr 0.1 B / 256 (SGD + Nesterov), tuned around it
  with the smaller B's choice as warm start (linear scaling overshoots past the knee);
  warm-up 5 of the 90 epochs, as a fraction of the point's budget. Budget: the recipe's
  90 epochs, at least 2,000 steps (90 epochs at B = 65,536 are 1,760). Runs stop at 75%
  top-1, evaluated every 2% of the budget and every 5% of the steps near it; a
  checkpoint every 2% bounds what a preempted run loses. About 6 device-hours per
  90-epoch run at the measured H100 rate, before stopping at the target.
  """
  if name != "full":
    raise ValueError(f"unknown critical-batch grid {name!r} of imagenet_resnet50.py; choose "
                     "full")
  return {"variant": "", "per_device": 128, "batches": tuple(1024 * 2**i for i in range(7)),
          "budget_examples": 90 * IMAGENET_TRAIN_EXAMPLES, "min_steps": 2000,
          "warmup_fraction": 5 / 90, "evals_per_budget": 50, "checkpoints_per_budget": 50,
          "overrides": {"eval.target_resolution": 0.05, "tune.stop_losers": True}}
