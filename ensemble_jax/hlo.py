"""Reading collectives and their replica groups off compiled HLO text.

Used to prove what the stacked engine promises: no collective spans two workers.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                  "collective-permute", "collective-broadcast")
# `%name = <type> op(` where the type may be a tuple: the op is the first ` op(` after `=`.
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=.*?\s(" + "|".join(COLLECTIVE_OPS)
                 + r")(?:-start)?\(")
_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_EXPLICIT = re.compile(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}")
_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")


@dataclasses.dataclass
class Collective:
  op: str
  groups: list[list[int]]  # device (or replica) ids that talk to each other
  line: str


def _groups(line: str) -> list[list[int]]:
  if m := _MESH.search(line):
    # mesh['a'=4,'b'=2] {'b'}: devices laid out on the mesh in order; each group is the
    # set of devices that differ only along the listed axes.
    axes = [(n.strip().strip("'"), int(v)) for n, v in
            (kv.split("=") for kv in m.group(1).split(","))]
    names = [n for n, _ in axes]
    listed = [names.index(n.strip().strip("'")) for n in m.group(2).split(",") if n.strip()]
    ids = np.arange(int(np.prod([v for _, v in axes]))).reshape([v for _, v in axes])
    rest = [d for d in range(len(axes)) if d not in listed]
    size = int(np.prod([axes[d][1] for d in listed])) if listed else 1
    return ids.transpose(rest + listed).reshape(-1, size).tolist()
  if m := _IOTA.search(line):
    num_groups, size = int(m.group(1)), int(m.group(2))
    dims = [int(d) for d in m.group(3).split(",")]
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if m.group(4):
      ids = ids.transpose([int(p) for p in m.group(4).split(",")])
    return ids.reshape(num_groups, size).tolist()
  if m := _EXPLICIT.search(line):
    return [[int(x) for x in g.split(",") if x.strip()]
            for g in re.findall(r"\{([\d,\s]*)\}", m.group(1))]
  if m := _PAIRS.search(line):
    return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", m.group(1))]
  return []  # empty replica_groups: one group of all devices


def collectives(hlo_text: str) -> list[Collective]:
  """Every collective op in an HLO module's text (async `-start` forms included)."""
  found = []
  for line in hlo_text.splitlines():
    if m := _OP.search(line):
      found.append(Collective(m.group(1), _groups(line), line.strip()))
  return found


def spanning(colls: list[Collective], device_to_group: dict[int, int],
             num_devices: int) -> list[Collective]:
  """The collectives whose replica groups contain devices of two different groups."""
  bad = []
  for c in colls:
    groups = c.groups or [list(range(num_devices))]
    if any(len({device_to_group[d] for d in g}) > 1 for g in groups):
      bad.append(c)
  return bad
