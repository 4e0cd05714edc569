"""ensemble_jax: independent short runs vs data-parallel training, measured honestly.

Shape suffixes name a tensor's axes (`logits_NxBxC`: workers, batch, classes), one letter
per axis, the same letter for the same meaning everywhere:

  B  batch (examples of one step)     T  time: tokens of a window, or attention's keys
  C  classes (logits' last axis)      V  vocabulary (logits of a language model)
  N  workers (the stacked axis)       M  models: proxies or other members, not workers
  E  examples of a whole split        K  clusters (k-means centroids)
  D  feature / embedding dimension    F  filters or hidden features inside a model
  S  a subset of examples (picks)     H, W  image height and width
  I, O  a layer's input and output channels (an image's channels are I)
  R  a convolution kernel's side      P  an image's values, flattened (PCA's input)
  A  attention heads                  Z  one attention head's width
  Q  confidence bins (ECE)
  x  an axis the code does not fix (`logits_Nx`: [N, ...])

A digit multiplies an axis (`qkv_BxTx3D`). A lower-case letter is that axis after a stride
(`dy_BxhxwxO`).
"""
