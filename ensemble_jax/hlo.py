"""Reading collectives off compiled (optimized) HLO text: kind, replica groups, bytes.

Used to prove what the stacked engine promises (no collective spans two workers) and to
charge each method the communication its compiled programs really do (`costs.py`).
"""
from __future__ import annotations

import dataclasses
import math
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
# `%name = <type> <opcode>(`: the instruction's name and the text from its type on.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLEE = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)"
                     r"=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclasses.dataclass
class Collective:
  op: str  # the kind: one of COLLECTIVE_OPS (an async `-start` is read as its op)
  groups: list[list[int]]  # device (or replica) ids that talk to each other
  line: str
  operand_bytes: int = 0  # what one device puts in: the sum over the operands
  executions: int = 1  # per call of the program: > 1 inside a loop with a known trip count

  def group_size(self, num_devices: int) -> int:
    """Devices in each group (empty replica_groups: one group of all devices)."""
    return len(self.groups[0]) if self.groups else num_devices


def dtype_bytes(dtype: str) -> float:
  """Bytes of one element of an HLO type (`f32` 4, `bf16` 2, `s4` 0.5)."""
  if dtype == "pred":
    return 1
  if dtype == "token":
    return 0
  m = re.fullmatch(r"(?:s|u|f|bf|c)(\d+)(?:e\d+m\d+[a-z]*)?", dtype)  # f32 bf16 c64 f8e4m3fn
  if not m:
    raise ValueError(f"unknown HLO element type {dtype!r}")
  return int(m.group(1)) / 8


def shape_bytes(type_text: str) -> int:
  """Bytes of an HLO type: an array `f32[1024,10]{1,0}` or a tuple of them."""
  type_text = re.sub(r"/\*.*?\*/", "", type_text)  # `/*index=5*/` inside long tuples
  total = sum(math.prod(int(d) for d in dims.split(",") if d) * dtype_bytes(dtype)
              for dtype, dims in _ARRAY.findall(type_text))
  return int(math.ceil(total))


def _result_type(rest: str) -> str:
  """The type an instruction's text starts with; a tuple's runs to its balanced `)`."""
  if not rest.startswith("("):
    return rest.split(" ", 1)[0]
  depth = 0
  for i, ch in enumerate(rest):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if depth == 0:
      return rest[:i + 1]
  return rest


def _operands(line: str, op_end: int) -> str:
  """The text between an instruction's `op(` (ending at `op_end`) and its matching `)`."""
  depth = 1
  for i in range(op_end, len(line)):
    depth += {"(": 1, ")": -1}.get(line[i], 0)
    if depth == 0:
      return line[op_end:i]
  return line[op_end:]


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


def _executions(lines: list[str]) -> tuple[list[str | None], dict[str, int]]:
  """Each line's computation, and how often each computation runs per module call.

  ENTRY runs once. A while body runs `known_trip_count` times its caller, or once if the
  count is unknown. Fusions, calls and branches run as often as their caller."""
  owner, calls, entry, current = [], {}, None, None
  for line in lines:
    if m := _COMPUTATION.match(line):
      current = m.group(2)
      entry = current if m.group(1) else entry
    elif line.startswith("}"):
      current = None
    owner.append(current)
    if current is None or "=" not in line:
      continue
    trips = int(t.group(1)) if (t := _TRIP_COUNT.search(line)) else 1
    for role, callee in _CALLEE.findall(line):
      calls.setdefault(current, []).append((callee, trips if role == "body" else 1))
    if b := _BRANCHES.search(line):
      for callee in re.findall(r"%?([\w.\-]+)", b.group(1)):
        calls.setdefault(current, []).append((callee, 1))
  runs: dict[str, int] = {}

  def visit(comp: str, times: int, path: tuple) -> None:
    if comp in path:  # not expected in HLO; guards the walk
      return
    runs[comp] = runs.get(comp, 0) + times
    for callee, factor in calls.get(comp, ()):
      visit(callee, times * factor, path + (comp,))

  if entry is not None:
    visit(entry, 1, ())
  return owner, runs


def collectives(hlo_text: str) -> list[Collective]:
  """Every collective op in an HLO module's text, async `-start` forms included.

  Each comes with its operand bytes and how often it runs per module call. The bytes come
  from the operands' defining instructions, or from types written in the operand list."""
  lines = hlo_text.splitlines()
  types = {m.group(1): _result_type(m.group(2)) for line in lines
           if (m := _INSTRUCTION.match(line))}
  owner, runs = _executions(lines)
  found = []
  for line, comp in zip(lines, owner):
    if not (m := _OP.search(line)):
      continue
    operands = _operands(line, m.end())
    if _ARRAY.search(operands):  # older text: `all-reduce(f32[8]{0} %x)`
      nbytes = shape_bytes(operands)
    else:
      nbytes = sum(shape_bytes(types.get(name, "")) for name in
                   re.findall(r"%([\w.\-]+)", operands))
    executions = runs.get(comp, 1) if comp is not None else 1
    found.append(Collective(m.group(1), _groups(line), line.strip(), nbytes, executions))
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


def _operand_names(rest: str) -> list[str]:
  """The instruction names an instruction's text (after `=`) takes as operands."""
  body = rest[len(_result_type(rest)):]
  start = body.find("(")
  if start < 0:
    return []
  return re.findall(r"%([\w.\-]+)", _operands(body, start + 1))


def combined(hlo_text: str, threshold_bytes: int) -> list[Collective]:
  """The collectives as a compiler that combines all-reduces would run them: XLA's
  AllReduceCombiner (GPU and TPU) merges all-reduces of one computation with the same
  replica groups that do not depend on each other into one tuple all-reduce, up to
  `threshold_bytes` of operands (greedily, in program order); a dependent one (a
  synchronised BatchNorm's statistics feed the next layer's) starts a new group. Other
  collectives, and all-reduces in different computations, stay as they are."""
  lines = hlo_text.splitlines()
  owner, _ = _executions(lines)
  operands: dict[tuple, list[str]] = {}
  names = []  # the instruction name of each line (None: not an instruction)
  for line, comp in zip(lines, owner):
    m = _INSTRUCTION.match(line)
    names.append(m.group(1) if m and comp is not None else None)
    if names[-1] is not None:
      operands[comp, m.group(1)] = _operand_names(m.group(2))

  def ancestors(comp: str, name: str, memo: dict) -> set:
    if (comp, name) not in memo:
      memo[comp, name] = set()  # guards a cycle (none in HLO)
      found = set()
      for o in operands.get((comp, name), ()):
        found |= {o} | ancestors(comp, o, memo)
      memo[comp, name] = found
    return memo[comp, name]

  memo: dict = {}
  found = iter(collectives(hlo_text))
  out, open_groups = [], {}  # (computation, groups) -> [member names, Collective]
  for line, comp, name in zip(lines, owner, names):
    if not _OP.search(line):
      continue
    c = next(found)
    if c.op != "all-reduce" or name is None:
      out.append(c)
      continue
    key = (comp, repr(c.groups))
    group = open_groups.get(key)
    if group is not None and not (group[0] & ancestors(comp, name, memo)) and (
        group[1].operand_bytes + c.operand_bytes <= threshold_bytes):
      group[0].add(name)
      group[1].operand_bytes += c.operand_bytes
      continue
    c = dataclasses.replace(c)
    open_groups[key] = [{name}, c]
    out.append(c)
  return out
