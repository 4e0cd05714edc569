"""ResNet-18 (small stem) on CIFAR-10 from TFDS (`tfds build cifar10 --file_format=array_record`).

  python -m ensemble_jax.main --config=experiments/configs/cifar10_resnet18.py --workdir=/tmp/c10

SGD + Nesterov, batch 512, peak lr 0.4 (0.1 per 128), 200 epochs cosine, random crop
(pad 4) + flip. Target 95% test accuracy, the usual figure for this recipe.
"""
from ensemble_jax.config_lib import base_config


def get_config(arg: str = ""):
  c = base_config()
  c.data.dataset = "cifar10"
  c.data.source = "tfds"
  c.data.image_size = 32
  c.data.train_augment = "crop_flip"
  c.data.crop_padding = 4
  c.data.mean, c.data.std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
  c.model.name, c.model.width, c.model.stem = "resnet18", 64, "small"
  c.optim.name = "sgd"
  c.optim.learning_rate, c.optim.base_batch_size = 0.1, 128
  c.optim.weight_decay = 5e-4
  c.optim.warmup_epochs = 2.0
  c.train.batch_size = 512
  c.train.num_epochs = 200.0
  c.eval.batch_size = 1000
  c.eval.target_metric, c.eval.target_value = "accuracy", 0.95
  c.checkpoint.every_steps = 2000
  if arg:
    raise ValueError(f"unknown variant {arg!r} of cifar10_resnet18.py")
  return c
