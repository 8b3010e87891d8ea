"""What the partitioned programs communicate and hold, read from their HLO.

The train step, the log-prob pass and the engine's prefill and decode of a
model of Qwen2.5-1.5B *width* (2 layers, small vocabulary) are compiled --
never run -- for three meshes on the 8 fake CPU devices, and their
optimised, SPMD-partitioned HLO is checked:

  * no all-gather, all-reduce or reduce-scatter moves an activation as big
    as one device's share of one [rows, length, width] activation or more:

        bound = rows / (data * fsdp) * length * hidden_size   (elements)

    ``rows`` the rows one program instance computes (a micro-batch in the
    train step), ``length`` its sequence length (the KV-cache length in
    decode) -- except a tensor-parallel all-reduce (or reduce-scatter)
    over 'tensor' alone: the local [rows_local, T, D] partial sums, exactly
    the bound. The same all-reduce over 'data' or 'fsdp' sums rows of
    other devices and is flagged; an all-gather of the batch (every device
    computing every row) is (data * fsdp) times the bound. Collectives
    shaped like a parameter (a shard of it, for FSDP's gather and the
    gradients' reduce-scatter) are not activations and are skipped.
  * the gradients' reductions over 'data' / 'fsdp' are float32 and, on
    (2, 4, 1), the 'data' ones (across nodes) run once per update however
    many micro-batches (``test_gradients_*``, ``test_data_axis_*``).
  * per-device temporaries (``memory_analysis().temp_size_in_bytes``)
    stay under a budget computed from the sharded shapes (``_temp_bound``).

Run as a script to print every function's numbers.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rspo_jax import hlo  # compiling from abstract inputs, HLO reading
from rspo_jax import sharding as shd
from rspo_jax.models.config import get_model_config
from rspo_jax.rollout import jax_engine

RULES = shd.DEFAULT_RULES
MESHES = ((1, 8, 1), (2, 4, 1), (1, 4, 2))
ROWS, LENGTH, N_MICRO = 32, 1024, 2  # train / log-prob batch
PREFILL_ROWS, PROMPT, NEW = 16, 1024, 32  # engine: rows, prompt bucket, new


def model_cfg(**kw):
  """Qwen2.5-1.5B widths, 2 layers, a 4 k vocabulary."""
  return get_model_config(
      "qwen2.5-1.5b", num_layers=2, vocab_size=4096, dtype="bfloat16", **kw
  )


# ------------------------------------------------------------- compiling
# rspo_jax/hlo.py compiles each program from abstract inputs (nothing is
# allocated); the train step without donation, so its arguments stay
# apart from its outputs as the temporaries are read.

COMPILERS = {
    "train_step": lambda mesh, cfg: hlo.compile_train_step(
        mesh, cfg, ROWS, LENGTH, n_micro=N_MICRO, donate=False
    ),
    "logprob": lambda mesh, cfg: hlo.compile_logprob(
        mesh, cfg, ROWS, LENGTH, param_dtype=cfg.inference_dtype
    ),
    "prefill": lambda mesh, cfg: hlo.compile_prefill(
        mesh, cfg, PREFILL_ROWS, PROMPT, NEW
    ),
    "decode": lambda mesh, cfg: hlo.compile_decode(
        mesh, cfg, PREFILL_ROWS, PROMPT, NEW
    ),
}


# ------------------------------------------------------------- the bounds


def _batch_ways(mesh_shape, rows):
  ways = mesh_shape[0] * mesh_shape[1]
  return ways if rows % ways == 0 else 1


def _temp_bound(c: hlo.Compiled, mesh_shape, cfg) -> int:
  """Per-device temporaries allowed, in bytes: ``weights + acts``.

  weights: the parameters whole on a device, float32 (XLA:CPU widens
  bfloat16 collectives to float32): gathered and cast to the compute dtype
  in every function, plus the full-size gradient and its reduction in the
  train step -- 4 copies there, 2 elsewhere.
  acts: one device's activations from the sharded shapes, rows_local =
  rows / (data * fsdp), per layer 8 [rows_local, T, D] and 3
  [rows_local, T, F / tensor] in bf16, 2 float32 [rows_local, H / tensor,
  T, S] score arrays, plus 3 float32 [rows_local, T, V / tensor] logits;
  for decode (one token a step) T = 1.

  A program computing every row on every device needs (data * fsdp) times
  ``acts``.
  """
  _, _, tensor = mesh_shape
  rows = c.rows // _batch_ways(mesh_shape, c.rows)
  t = 1 if c.name == "decode" else c.length
  s = c.length
  copies = 4 if c.name == "train_step" else 2
  weights = copies * cfg.num_params() * 4
  per_layer = (
      rows * t * 2 * (8 * cfg.hidden_size + 3 * cfg.intermediate_size // tensor)
      + 2 * rows * cfg.num_heads // tensor * t * s * 4
  )
  logits = 3 * rows * t * cfg.vocab_size // tensor * 4
  return weights + cfg.num_layers * per_layer + logits


# --------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def cfg():
  return model_cfg()


def check(name, mesh_shape, cfg):
  mesh = shd.make_mesh(mesh_shape)
  c = COMPILERS[name](mesh, cfg)
  bound = hlo.activation_bound(c, mesh_shape, cfg.hidden_size)
  bad = hlo.activation_collectives(c.hlo, c.params, mesh_shape, bound)
  return c, bound, bad, _temp_bound(c, mesh_shape, cfg)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("name", list(COMPILERS))
def test_no_activation_collectives_and_bounded_temps(name, mesh_shape, cfg):
  assert len(jax.devices()) == 8
  c, bound, bad, temp_bound = check(name, mesh_shape, cfg)
  assert not bad, (
      f"{name} on {mesh_shape}: collectives of activations above"
      f" {bound} elements: {bad[:8]}"
  )
  assert c.memory["temp"] <= temp_bound, (
      f"{name} on {mesh_shape}: {c.memory['temp'] / 2**20:.1f} MiB of"
      f" temporaries per device > {temp_bound / 2**20:.1f} MiB"
  )


# ---------------------------------------------- the gradients' reductions
# Mesh (2, 4, 1), as two nodes of 4 devices: 'data' across nodes, 'fsdp'
# within. Small widths (compiles in seconds); rows that split over every
# device in each micro-batch, 2 or 4 of them.

GRAD_MESH, GRAD_ROWS, GRAD_LENGTH = (2, 4, 1), 32, 64


def grad_cfg():
  return get_model_config(
      "qwen2.5-1.5b",
      num_layers=1,
      vocab_size=512,
      hidden_size=128,
      intermediate_size=256,
      num_heads=4,
      num_kv_heads=2,
      head_dim=32,
      dtype="bfloat16",
  )


@pytest.fixture(scope="module")
def grad_steps():
  """{n_micro: Compiled} of the train step (2: with its partitioned HLO)."""
  mesh = shd.make_mesh(GRAD_MESH)
  return {
      n: hlo.compile_train_step(
          mesh,
          grad_cfg(),
          GRAD_ROWS,
          GRAD_LENGTH,
          n_micro=n,
          donate=False,
          partitioned=n == 2,
      )
      for n in (2, 4)
  }


def test_gradients_are_reduced_in_float32(grad_steps):
  """Every all-reduce / reduce-scatter over 'data' or 'fsdp' of a
  parameter-shaped array in the partitioned program is float32, with
  bfloat16 compute: the weight-gradient dots output float32
  (``ActivationSharding.einsum`` / ``apply``). Before: 20 of the 23 were
  bf16, each a bf16 gradient dot's, widened only after."""
  c = grad_steps[2]
  skip = hlo.param_shapes(c.params, 8)
  grads = [
      r
      for r in hlo.reductions(c.partitioned, GRAD_MESH, loops=False)
      if r.axes & {"data", "fsdp"}
      and r.shapes[0]
      and tuple(d for d in r.shapes[0] if d != 1) in skip
  ]
  n_params = len(jax.tree.leaves(c.params))
  assert len(grads) >= n_params, (len(grads), n_params)
  narrow = sorted(
      {
          (r.dtypes, r.shapes, tuple(sorted(r.axes)))
          for r in grads
          if set(r.dtypes) != {"f32"}
      }
  )
  assert not narrow, narrow


def test_data_axis_reduction_once_per_update(grad_steps):
  """The array reductions over 'data' (across nodes) run as often per
  update with 4 micro-batches as with 2, once per parameter: each data
  shard accumulates its own gradient and one all-reduce per tensor
  follows the loop (``train_step._data_local``). Before: 30 with 2, 60
  with 4 (14 parameters; inside the loop, once per micro-batch)."""

  def over_data(c):
    return sum(
        r.times * sum(1 for shape in r.shapes if shape)
        for r in hlo.reductions(c.hlo, GRAD_MESH)
        if "data" in r.axes
    )

  two, four = over_data(grad_steps[2]), over_data(grad_steps[4])
  assert two == four == len(jax.tree.leaves(grad_steps[2].params)), (two, four)


def test_compile_decode_takes_the_learners_remat_config():
  """The engine runs without remat (build.engine_config); compiling its
  decode from a remat / scanned learner config used to fail to trace."""
  cfg = dataclasses.replace(grad_cfg(), remat=True, scan_layers=True)
  c = hlo.compile_decode(shd.make_mesh((1, 8, 1)), cfg, 8, 32, 4)
  assert c.name == "decode" and c.memory["peak"] > 0


def test_collectives_parser():
  text = (
      "  %x = bf16[2,256,1536]{2,1,0} parameter(0)\n"
      "  %ag = bf16[16,256,1536]{2,1,0} all-gather(%x), channel_id=1,"
      " replica_groups=[1,8]<=[8], dimensions={0}\n"
      "  %rs = f32[4]{0} reduce-scatter(%y), dimensions={0}\n"
      "  %ar = (f32[4]{0}, f32[2,3]{1,0}) all-reduce-start(f32[4]{0} %a,"
      " f32[2,3]{1,0} %b), to_apply=%add\n"
      "  ROOT %add.1 = f32[4]{0} add(f32[4]{0} %a, f32[4]{0} %b)\n"
  )
  assert hlo.collectives(text) == [
      ("all-gather", (16, 256, 1536)),
      ("all-gather", (2, 256, 1536)),
      ("reduce-scatter", (4,)),
      ("all-reduce", (4,)),
      ("all-reduce", (2, 3)),
      ("all-reduce", (4,)),
      ("all-reduce", (2, 3)),
  ]


def test_replica_groups_and_their_mesh_axes():
  """XLA's three printed forms of device groups, read as mesh axes of
  (2, 4, 1) (device i at unravel_index(i, (2, 4, 1)))."""
  shape = (2, 4, 1)
  cases = {
      "replica_groups={{0,4},{1,5},{2,6},{3,7}}, x": {"data"},
      "replica_groups=[2,4]<=[8], x": {"fsdp"},
      "replica_groups=[4,2]<=[2,4]T(1,0), x": {"data"},
      "replica_groups=mesh['axis_0'=8,'axis_1'=1] {'axis_0'}, x": {
          "data",
          "fsdp",
      },
      "replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2],"
      " device_ids=([2,4]T(1,0)) {'axis_2'}, x": {"data"},
      "replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2],"
      " device_ids=([2,4]T(1,0)) {'axis_1'}, x": {"fsdp"},
      "replica_groups={}, x": {"data", "fsdp"},
  }
  for line, axes in cases.items():
    assert hlo.group_axes(hlo.replica_groups(line), shape) == axes, line
  assert hlo.replica_groups("replica_groups=[4,2]<=[2,4]T(1,0), x") == [
      [0, 4],
      [1, 5],
      [2, 6],
      [3, 7],
  ]


def test_activation_collectives_flag_a_per_device_activation():
  """A per-device activation [2, 64, 128] (= the bound) all-reduced over
  'fsdp' sums other devices' rows: flagged; over 'tensor' alone (partial
  sums of tensor parallelism) it is not; a parameter shard is skipped."""
  params = [jax.ShapeDtypeStruct((512, 128), jnp.float32)]
  shape, bound = (1, 4, 2), 2 * 64 * 128

  def line(op, dims, groups):
    return (
        f"  %{op}.1 = f32[{dims}]{{2,1,0}} {op}(f32[{dims}]{{2,1,0}}"
        f" %x), replica_groups={groups}, to_apply=%add\n"
    )

  text = (
      line("all-reduce", "2,64,128", "[2,4]<=[4,2]T(1,0)")  # fsdp
      + line("all-reduce", "2,64,128", "[4,2]<=[8]")  # tensor
      + line("all-gather", "128,128", "[2,4]<=[4,2]T(1,0)")
  )  # shard
  assert (
      hlo.activation_collectives(text, params, shape, bound)
      == [("all-reduce", (2, 64, 128), bound, ("fsdp",))] * 2
  )


def test_executions_follow_loop_trip_counts():
  text = (
      "%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {\n"
      "  %ar = f32[4]{0} all-reduce(f32[4]{0} %y), replica_groups=[1,8]<=[8],"
      " to_apply=%add\n"
      "}\n\n"
      "ENTRY %main (a: f32[4]) -> f32[4] {\n"
      "  %w = (s32[], f32[4]) while(%t), condition=%cond, body=%body,"
      ' backend_config={"known_trip_count":{"n":"3"}}\n'
      "  %ar2 = f32[4]{0} all-reduce(f32[4]{0} %a), replica_groups={},"
      " to_apply=%add\n"
      "}\n"
  )
  assert hlo.executions(text)["body"] == 3
  got = [
      (r.computation, r.times, r.dtypes)
      for r in hlo.reductions(text, (1, 8, 1))
  ]
  assert got == [("body", 3, ("f32",)), ("main", 1, ("f32",))]


def test_share_prompts_keeps_each_shards_prompts_on_it():
  """Decode rows of shard j read prompts of shard j only (so the prefill's
  row gather stays on the device), deduplicated within the shard."""
  rows = [[1, 2], [1, 2], [3], [1, 2], [4, 5]]
  unique, row_map = jax_engine.share_prompts(
      rows, bb=8, shards=4, buckets=(1, 2, 4, 8), pad_id=0
  )
  assert unique == [[1, 2], [0], [3], [1, 2], [4, 5], [0], [0], [0]]
  np.testing.assert_array_equal(row_map, [0, 0, 2, 3, 4, 4, 6, 6])
  unique, row_map = jax_engine.share_prompts(
      rows, bb=8, shards=1, buckets=(1, 2, 4, 8), pad_id=0
  )
  assert unique == [[1, 2], [3], [4, 5], [0]]
  np.testing.assert_array_equal(row_map, [0, 0, 1, 0, 2, 0, 0, 0])
  x = jnp.arange(16).reshape(8, 2)
  for shards in (1, 4):
    got = jax.jit(jax_engine._gather_rows, static_argnums=2)(
        x, jnp.asarray([0, 0, 2, 3, 4, 4, 6, 6]), shards
    )
    np.testing.assert_array_equal(got, x[np.array([0, 0, 2, 3, 4, 4, 6, 6])])


if __name__ == "__main__":
  import sys
  import time

  jax.config.update("jax_num_cpu_devices", 8)
  names = sys.argv[1:] or list(COMPILERS)
  cfg_ = model_cfg()
  for mesh_shape in MESHES:
    for name in names:
      t0 = time.time()
      c, bound, bad, tb = check(name, mesh_shape, cfg_)
      worst = max((n for _, _, n in bad), default=0)
      print(
          f"{name:10s} {str(mesh_shape):10s} compile {time.time()-t0:5.1f}s"
          f" temp {c.memory['temp']/2**20:8.1f} MiB (bound {tb/2**20:8.1f})"
          f" activation collectives {len(bad):3d} (largest {worst}, bound"
          f" {bound})",
          flush=True,
      )
      for b in sorted(set(bad), key=lambda x: -x[2])[:4]:
        print("    ", b)
