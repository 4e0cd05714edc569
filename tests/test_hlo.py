"""Collectives read off optimized HLO text: kind, replica groups, operand bytes, and how
often each runs per call of its module."""
import pytest

from ensemble_jax import hlo

pytestmark = pytest.mark.unit

# A module as XLA prints it after optimization: a combined (tuple) all-reduce whose
# operands' types are on their defining instructions, bf16, an all-gather of a shard, and a
# BatchNorm-style all-reduce inside a while body that runs 3 times.
HLO = """\
HloModule jit_step, entry_computation_layout={(f32[16,10]{1,0})->f32[16,10]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%body (p: (s32[], f32[4]{0})) -> (s32[], f32[4]{0}) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %stats = f32[4]{0} get-tuple-element(%p), index=1
  %ar.2 = f32[4]{0} all-reduce(%stats), channel_id=3, replica_groups=[2,4]<=[8], to_apply=%add
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %ar.2)
}

%cond (c: (s32[], f32[4]{0})) -> pred[] {
  %c = (s32[], f32[4]{0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

ENTRY %main (g: f32[16,10], h: bf16[1024], s: f32[8,3]) -> f32[16,10] {
  %g = f32[16,10]{1,0} parameter(0)
  %h = bf16[1024]{0} parameter(1)
  %s = f32[8,3]{1,0} parameter(2)
  %ar = (f32[16,10]{1,0}, /*index=1*/bf16[1024]{0}) all-reduce(%g, %h), channel_id=1, \
replica_groups=mesh['axis_0'=8] {'axis_0'}, use_global_device_ids=true, to_apply=%add
  %ag = f32[64,3]{1,0} all-gather(%s), channel_id=2, replica_groups={}, dimensions={0}
  %init = (s32[], f32[4]{0}) tuple(%zero, %four)
  %w = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body, \
backend_config={"known_trip_count":{"n":"3"}}
  ROOT %out = f32[16,10]{1,0} get-tuple-element(%ar), index=0
}
"""


def test_collectives_read_kind_bytes_group_and_executions():
  ag, ar, body_ar = sorted(hlo.collectives(HLO), key=lambda c: (c.executions, c.op))
  assert (ar.op, ar.operand_bytes, ar.group_size(8), ar.executions) == (
      "all-reduce", 16 * 10 * 4 + 1024 * 2, 8, 1)
  assert (ag.op, ag.operand_bytes, ag.group_size(8), ag.executions) == (
      "all-gather", 8 * 3 * 4, 8, 1)  # empty replica_groups: all devices; a shard's bytes
  assert (body_ar.op, body_ar.operand_bytes, body_ar.group_size(8), body_ar.executions) == (
      "all-reduce", 16, 4, 3)
  assert hlo.shape_bytes("(pred[3], s4[4], f8e4m3fn[2,2], c64[])") == 3 + 2 + 4 + 8
  with pytest.raises(ValueError, match="unknown HLO element type"):
    hlo.dtype_bytes("q7")


def test_operand_types_written_in_the_operand_list():
  """Older HLO text types each operand in place; an async `-start` is read as its op."""
  [c] = hlo.collectives("%ag = f32[8]{0} all-gather-start(f32[2]{0} %x), "
                        "replica_groups=[2,4]<=[4,2]T(1,0)")
  assert (c.op, c.operand_bytes, c.group_size(8), c.executions) == ("all-gather", 8, 4, 1)
