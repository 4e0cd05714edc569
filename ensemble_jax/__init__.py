"""ensemble_jax: independent short runs vs data-parallel training, measured honestly.

Shape suffixes name a tensor's axes (`logits_NxBxC`: workers, batch, classes), one letter
per axis, the same letter for the same meaning everywhere:

  B  batch (examples of one step)     T  time (tokens of a window)
  C  classes (logits' last axis)      V  vocabulary (logits of a language model)
  N  workers (the stacked axis)       M  models: proxies or other members, not workers
  E  examples of a whole split        K  clusters (k-means centroids)
  D  feature / embedding dimension    F  filters or hidden features inside a model
  S  a subset of examples (picks)     H, W  image height and width
  x  an axis the code does not fix (`logits_Nx`: [N, ...])
"""
