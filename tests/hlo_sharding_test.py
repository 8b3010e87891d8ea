"""What the partitioned programs communicate and hold, read from their HLO.

The train step, the log-prob pass and the engine's prefill and decode of a
model of Qwen2.5-1.5B *width* (2 layers, small vocabulary) are compiled --
never run -- for three meshes on the 8 fake CPU devices, and their
optimised, SPMD-partitioned HLO is checked:

  * no all-gather, all-reduce or reduce-scatter moves an activation bigger
    than one device's share of one [rows, length, width] activation:

        bound = rows / (data * fsdp) * length * hidden_size   (elements)

    ``rows`` the rows one program instance computes (a micro-batch in the
    train step), ``length`` its sequence length (the KV-cache length in
    decode). A tensor-parallel all-reduce of the local [rows_local, T, D]
    partial sums is exactly the bound, and allowed; an all-gather of the
    batch (every device computing every row) is (data * fsdp) times it.
    Collectives shaped like a parameter (a shard of it, for FSDP's gather
    and the gradients' reduce-scatter) are not activations and are skipped.
  * per-device temporaries (``memory_analysis().temp_size_in_bytes``)
    stay under a budget computed from the sharded shapes (``_temp_bound``).

Run as a script to print every function's numbers.
"""

from __future__ import annotations

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
        mesh, cfg, ROWS, LENGTH, n_micro=N_MICRO, donate=False),
    "logprob": lambda mesh, cfg: hlo.compile_logprob(
        mesh, cfg, ROWS, LENGTH, param_dtype=cfg.inference_dtype),
    "prefill": lambda mesh, cfg: hlo.compile_prefill(
        mesh, cfg, PREFILL_ROWS, PROMPT, NEW),
    "decode": lambda mesh, cfg: hlo.compile_decode(
        mesh, cfg, PREFILL_ROWS, PROMPT, NEW),
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
  per_layer = rows * t * 2 * (
      8 * cfg.hidden_size + 3 * cfg.intermediate_size // tensor
  ) + 2 * rows * cfg.num_heads // tensor * t * s * 4
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
  bad = hlo.activation_collectives(c.hlo, c.params, mesh.size, bound)
  return c, bound, bad, _temp_bound(c, mesh_shape, cfg)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("name", list(COMPILERS))
def test_no_activation_collectives_and_bounded_temps(name, mesh_shape, cfg):
  assert len(jax.devices()) == 8
  c, bound, bad, temp_bound = check(name, mesh_shape, cfg)
  assert not bad, (
      f"{name} on {mesh_shape}: collectives of activations above"
      f" {bound} elements: {bad[:8]}")
  assert c.memory["temp"] <= temp_bound, (
      f"{name} on {mesh_shape}: {c.memory['temp'] / 2**20:.1f} MiB of"
      f" temporaries per device > {temp_bound / 2**20:.1f} MiB")


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
      ("all-gather", (16, 256, 1536)), ("all-gather", (2, 256, 1536)),
      ("reduce-scatter", (4,)), ("all-reduce", (4,)), ("all-reduce", (2, 3)),
      ("all-reduce", (4,)), ("all-reduce", (2, 3)),
  ]


def test_share_prompts_keeps_each_shards_prompts_on_it():
  """Decode rows of shard j read prompts of shard j only (so the prefill's
  row gather stays on the device), deduplicated within the shard."""
  rows = [[1, 2], [1, 2], [3], [1, 2], [4, 5]]
  unique, row_map = jax_engine.share_prompts(
      rows, bb=8, shards=4, buckets=(1, 2, 4, 8), pad_id=0)
  assert unique == [[1, 2], [0], [3], [1, 2], [4, 5], [0], [0], [0]]
  np.testing.assert_array_equal(row_map, [0, 0, 2, 3, 4, 4, 6, 6])
  unique, row_map = jax_engine.share_prompts(
      rows, bb=8, shards=1, buckets=(1, 2, 4, 8), pad_id=0)
  assert unique == [[1, 2], [3], [4, 5], [0]]
  np.testing.assert_array_equal(row_map, [0, 0, 1, 0, 2, 0, 0, 0])
  x = jnp.arange(16).reshape(8, 2)
  for shards in (1, 4):
    got = jax.jit(jax_engine._gather_rows, static_argnums=2)(
        x, jnp.asarray([0, 0, 2, 3, 4, 4, 6, 6]), shards)
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
      print(f"{name:10s} {str(mesh_shape):10s} compile {time.time()-t0:5.1f}s"
            f" temp {c.memory['temp']/2**20:8.1f} MiB (bound {tb/2**20:8.1f})"
            f" activation collectives {len(bad):3d} (largest {worst}, bound"
            f" {bound})", flush=True)
      for b in sorted(set(bad), key=lambda x: -x[2])[:4]:
        print("    ", b)
