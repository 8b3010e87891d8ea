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

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from rspo_jax import sharding as shd
from rspo_jax import train_step as ts
from rspo_jax.models.config import get_model_config
from rspo_jax.models import transformer as tfm
from rspo_jax.models.transformer import Transformer
from rspo_jax.rollout import jax_engine
from rspo_jax.types import Batch

RULES = shd.DEFAULT_RULES
MESHES = ((1, 8, 1), (2, 4, 1), (1, 4, 2))
ROWS, LENGTH, N_MICRO = 32, 1024, 2  # train / log-prob batch
PREFILL_ROWS, PROMPT, NEW = 16, 1024, 32  # engine: rows, prompt bucket, new


def model_cfg(**kw):
  """Qwen2.5-1.5B widths, 2 layers, a 4 k vocabulary."""
  return get_model_config(
      "qwen2.5-1.5b", num_layers=2, vocab_size=4096, dtype="bfloat16", **kw
  )


# ------------------------------------------------------------ HLO reading

_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s"
                  r"([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b[a-z]+[0-9]*\[([0-9,]*)\]")
_KINDS = ("all-gather", "all-reduce", "reduce-scatter")


def _shapes(text: str) -> list[tuple]:
  return [tuple(int(d) for d in dims.split(",") if d)
          for dims in _ARRAY.findall(text)]


def collectives(hlo: str) -> list[tuple[str, tuple]]:
  """(kind, shape) of every array a collective produces or takes (operand
  shapes looked up by name when the HLO text omits them)."""
  defs, found = {}, []
  for line in hlo.splitlines():
    m = _DEF.match(line)
    if not m:
      continue
    name, result, op, args = m.groups()
    defs[name] = _shapes(result)
    kind = op[:-len("-start")] if op.endswith("-start") else op
    if kind in _KINDS:
      found.append((kind, result, args.split("), ")[0]))
  out = []
  for kind, result, args in found:
    shapes = _shapes(result)
    for operand in re.findall(r"%([\w.\-]+)", args):
      shapes += defs.get(operand, [])
    shapes += _shapes(re.sub(r"%[\w.\-]+", "", args))  # inline types
    out += [(kind, s) for s in shapes]
  return out


def param_shapes(params, mesh_size: int) -> set:
  """Each parameter's shape and its shards (a dim divided by a divisor of
  the device count), with size-1 dims dropped."""
  shapes = set()
  divisors = [d for d in range(1, mesh_size + 1) if mesh_size % d == 0]
  for leaf in jax.tree.leaves(params):
    variants = [()]
    for dim in leaf.shape:
      variants = [v + (dim // d,) for v in variants for d in divisors
                  if dim % d == 0]
    shapes.update(tuple(x for x in v if x != 1) for v in variants)
  return shapes


def activation_collectives(hlo, params, mesh_size, bound):
  """Collectives of non-parameter arrays with more than ``bound`` elements:
  [(kind, shape, elements)]."""
  skip = param_shapes(params, mesh_size)
  bad = []
  for kind, shape in collectives(hlo):
    n = math.prod(shape)
    if n > bound and tuple(d for d in shape if d != 1) not in skip:
      bad.append((kind, shape, n))
  return bad


# ------------------------------------------------------- abstract inputs


def abstract_model(cfg):
  """(graphdef, params, rest) with ShapeDtypeStruct leaves."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  return nnx.split(model, nnx.Param, ...)


def sds(shape, dtype, sharding=None):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=sharding)


def rows_sharding(mesh, ndim):
  return shd.named_sharding(mesh, ("batch",) + (None,) * (ndim - 1), RULES)


def abstract_batch(mesh, rows, length):
  f32 = lambda: sds((rows, length), jnp.float32, rows_sharding(mesh, 2))
  i32 = lambda: sds((rows, length), jnp.int32, rows_sharding(mesh, 2))
  return Batch(
      tokens=i32(), positions=i32(), attention_mask=i32(), loss_mask=f32(),
      advantages=f32(), old_logp=f32(), ref_logp=f32(), behavior_logp=f32(),
      returns=f32(), old_values=f32(),
      is_offpolicy=sds((rows,), jnp.bool_, rows_sharding(mesh, 1)),
  )


def abstract_state(mesh, params, tx):
  """(abstract TrainState, its shardings), as create_train_state builds."""
  param_sh = shd.state_shardings(mesh, params, RULES)
  opt = jax.eval_shape(tx.init, params)
  opt_sh = optax.tree_map_params(
      tx, lambda _, s: s, opt, param_sh,
      transform_non_params=lambda _: shd.replicated(mesh),
  )
  opt_sh = jax.tree.map(
      lambda s: s if isinstance(s, NamedSharding) else shd.replicated(mesh),
      opt_sh)
  state = ts.TrainState(step=sds((), jnp.int32), params=params,
                        opt_state=opt)
  state_sh = ts.TrainState(step=shd.replicated(mesh), params=param_sh,
                           opt_state=opt_sh)
  return state, state_sh


# ------------------------------------------------------------- compiling


@dataclasses.dataclass
class Compiled:
  name: str
  hlo: str
  temp_bytes: int
  rows: int  # rows one instance computes
  length: int  # sequence (or cache) length


def compile_train_step(mesh, cfg):
  graphdef, params, rest = abstract_model(cfg)
  tx = ts.make_optimizer(1e-6)
  state, state_sh = abstract_state(mesh, params, tx)
  batch = abstract_batch(mesh, ROWS, LENGTH)
  loss = ts.make_policy_loss(ts.PolicyLossConfig(alpha=0.25, kl_coef=0.01))
  step = ts.make_train_step(
      graphdef, rest, loss, tx, mesh=mesh, state_shardings=state_sh,
      batch_sharding_tree=jax.tree.map(lambda x: x.sharding, batch),
      n_micro=N_MICRO, donate=False,
  )
  out = step.lower(state, batch, jax.random.key(0)).compile()
  return Compiled("train_step", out.as_text(),
                  out.memory_analysis().temp_size_in_bytes,
                  ROWS // N_MICRO, LENGTH), params


def compile_logprob(mesh, cfg):
  cfg = dataclasses.replace(cfg, param_dtype=cfg.inference_dtype)
  graphdef, params, rest = abstract_model(cfg)
  param_sh = shd.state_shardings(mesh, params, RULES)
  fn = ts.make_logprob_fn(graphdef, rest, mesh=mesh, param_shardings=param_sh,
                          rules=RULES)
  x = sds((ROWS, LENGTH), jnp.int32, rows_sharding(mesh, 2))
  out = fn.lower(params, x, x, x, x).compile()
  return Compiled("logprob", out.as_text(),
                  out.memory_analysis().temp_size_in_bytes,
                  ROWS, LENGTH), params


def _engine_inputs(mesh, cfg):
  cfg = dataclasses.replace(cfg, param_dtype=cfg.inference_dtype)
  graphdef, params, rest = abstract_model(cfg)
  psh = shd.state_shardings(mesh, params, shd.inference_rules(RULES))
  params = jax.tree.map(lambda x, s: sds(x.shape, x.dtype, s), params, psh)
  static = jax_engine._Static(graphdef=graphdef, cfg=cfg, mesh=mesh,
                              rules=RULES, pad_id=0)
  return cfg, params, rest, static


def compile_prefill(mesh, cfg):
  cfg, params, rest, static = _engine_inputs(mesh, cfg)
  x = sds((PREFILL_ROWS, PROMPT - 1), jnp.int32, rows_sharding(mesh, 2))
  m = sds((PREFILL_ROWS, PROMPT - 1), jnp.bool_, rows_sharding(mesh, 2))
  row_map = sds((PREFILL_ROWS,), jnp.int32)
  out = jax_engine._prefill.lower(
      params, rest, x, x, m, row_map, cache_len=PROMPT + NEW, static=static
  ).compile()
  return Compiled("prefill", out.as_text(),
                  out.memory_analysis().temp_size_in_bytes,
                  PREFILL_ROWS, PROMPT), params


def compile_decode(mesh, cfg):
  cfg, params, rest, static = _engine_inputs(mesh, cfg)
  cache = jax.eval_shape(lambda: tfm.init_cache(cfg, PREFILL_ROWS,
                                                 PROMPT + NEW))

  def placed(x, logical):
    spec = shd.logical_to_mesh_spec(logical, RULES)
    return sds(x.shape, x.dtype, NamedSharding(
        mesh, shd.fit_spec_to_shape(mesh, spec, x.shape)))

  kv = lambda xs: tuple(placed(x, jax_engine._CACHE_AXES) for x in xs)
  cache = tfm.KVCache(
      k=kv(cache.k), v=kv(cache.v),
      key_mask=placed(cache.key_mask, ("batch", "cache_length")),
      index=placed(cache.index, ()))
  row = lambda dt: sds((PREFILL_ROWS,), dt, rows_sharding(mesh, 1))
  rows = jax_engine._Rows(last_tok=row(jnp.int32), last_pos=row(jnp.int32),
                          active=row(jnp.bool_), row_ids=row(jnp.int32))
  knobs = jax_engine._Knobs(
      seed=sds((), jnp.uint32), temperature=sds((), jnp.float32),
      top_p=sds((), jnp.float32), max_new=sds((), jnp.int32),
      stop_mask=sds((cfg.vocab_size,), jnp.bool_))
  out = jax_engine._decode.lower(
      params, rest, cache, rows, knobs, slots=NEW, static=static).compile()
  return Compiled("decode", out.as_text(),
                  out.memory_analysis().temp_size_in_bytes,
                  PREFILL_ROWS, PROMPT + NEW), params


COMPILERS = {
    "train_step": compile_train_step,
    "logprob": compile_logprob,
    "prefill": compile_prefill,
    "decode": compile_decode,
}


# ------------------------------------------------------------- the bounds


def _batch_ways(mesh_shape, rows):
  ways = mesh_shape[0] * mesh_shape[1]
  return ways if rows % ways == 0 else 1


def activation_bound(c: Compiled, mesh_shape, cfg) -> int:
  """rows / (data * fsdp) * length * hidden_size (module docstring)."""
  return c.rows // _batch_ways(mesh_shape, c.rows) * c.length * cfg.hidden_size


def _temp_bound(c: Compiled, mesh_shape, cfg) -> int:
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
  c, params = COMPILERS[name](mesh, cfg)
  bound = activation_bound(c, mesh_shape, cfg)
  bad = activation_collectives(c.hlo, params, mesh.size, bound)
  return c, bound, bad, _temp_bound(c, mesh_shape, cfg)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("name", list(COMPILERS))
def test_no_activation_collectives_and_bounded_temps(name, mesh_shape, cfg):
  assert len(jax.devices()) == 8
  c, bound, bad, temp_bound = check(name, mesh_shape, cfg)
  assert not bad, (
      f"{name} on {mesh_shape}: collectives of activations above"
      f" {bound} elements: {bad[:8]}")
  assert c.temp_bytes <= temp_bound, (
      f"{name} on {mesh_shape}: {c.temp_bytes / 2**20:.1f} MiB of"
      f" temporaries per device > {temp_bound / 2**20:.1f} MiB")


def test_collectives_parser():
  hlo = (
      "  %x = bf16[2,256,1536]{2,1,0} parameter(0)\n"
      "  %ag = bf16[16,256,1536]{2,1,0} all-gather(%x), channel_id=1,"
      " replica_groups=[1,8]<=[8], dimensions={0}\n"
      "  %rs = f32[4]{0} reduce-scatter(%y), dimensions={0}\n"
      "  %ar = (f32[4]{0}, f32[2,3]{1,0}) all-reduce-start(f32[4]{0} %a,"
      " f32[2,3]{1,0} %b), to_apply=%add\n"
      "  ROOT %add.1 = f32[4]{0} add(f32[4]{0} %a, f32[4]{0} %b)\n"
  )
  assert collectives(hlo) == [
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
            f" temp {c.temp_bytes/2**20:8.1f} MiB (bound {tb/2**20:8.1f})"
            f" activation collectives {len(bad):3d} (largest {worst}, bound"
            f" {bound})", flush=True)
      for b in sorted(set(bad), key=lambda x: -x[2])[:4]:
        print("    ", b)
