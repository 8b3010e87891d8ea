"""Scanned layers (``ModelConfig.scan_layers``) are a layout, not a model:

  scanned(seed)  = stack(unrolled(seed))          value for value
  f_scanned(x)   = f_unrolled(x)                  logits, float32, 1e-5
  grad_scanned   = stack(grad_unrolled)           float32, 1e-5 of scale

with and without remat, with the response window and through the KV cache;
HF files of a scanned model are the unrolled model's, tensor for tensor,
and load back into either layout; the rollout engine gets the unrolled
layout (``build.inference_model`` / ``engine_params``) and generates the
same tokens; XLA compiles one block however many layers there are.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from rspo_jax import build, models, sharding, train_step as ts
from rspo_jax.learner import Learner
from rspo_jax.models import hf_io
from rspo_jax.models import transformer as tfm
from rspo_jax.models import windows
from rspo_jax.rollout.engine import SamplingParams
from rspo_jax.rollout.jax_engine import JaxEngine
from rspo_jax.types import Batch

CFG = models.get_model_config(
    "tiny",
    vocab_size=96,
    num_layers=3,
    hidden_size=64,
    intermediate_size=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
)
T = 12
LENGTHS = (12, 7, 1)  # a full row, a right-padded one, a lone token


def pair(**kw):
  """(unrolled, scanned) models of CFG with ``kw``, same seed; weights x 2
  so attention is far from uniform."""
  cfg = dataclasses.replace(CFG, **kw)
  scfg = dataclasses.replace(cfg, scan_layers=True)
  un = models.create_model(cfg, seed=1)
  sc = models.create_model(scfg, seed=1)
  double = lambda m: nnx.update(m, jax.tree.map(lambda x: 2 * x, nnx.state(m)))
  double(un)
  double(sc)
  return un, sc


def batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, (len(LENGTHS), T))
  mask = np.arange(T)[None, :] < np.asarray(LENGTHS)[:, None]
  tokens = np.where(mask, tokens, 0).astype(np.int32)
  weights = rng.normal(size=(len(LENGTHS), T, CFG.vocab_size))
  return (
      jnp.asarray(tokens),
      tfm.positions_from_mask(jnp.asarray(mask)),
      jnp.asarray(mask, jnp.int32),
      jnp.asarray(weights * mask[..., None], jnp.float32),
  )


def flat(state) -> dict:
  return {
      "/".join(map(str, p)): np.asarray(v.get_value())
      for p, v in nnx.to_flat_state(state)
  }


def params(model):
  return nnx.state(model, nnx.Param)


def assert_close_to_scale(got: dict, want: dict, tol=1e-5):
  """|got - want| <= tol * max(1, max |want|) per leaf, same keys."""
  assert got.keys() == want.keys()
  for k in want:
    scale = max(1.0, float(np.max(np.abs(want[k]))))
    np.testing.assert_allclose(
        got[k], want[k], rtol=0, atol=tol * scale, err_msg=k
    )


# --------------------------------------------------------------- layout


def test_scanned_init_is_the_stacked_unrolled_init():
  un, sc = pair()
  assert sc.layers.attn.q.get_value().shape == (3, 64, 4, 16)
  assert sc.layers.attn.q.get_metadata()["out_sharding"] == (
      None,
      "embed",
      "heads",
      "head_dim",
  )
  got = flat(tfm.unrolled_state(params(sc)))
  want = flat(params(un))
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  back = flat(tfm.scanned_state(params(un)))
  for k, v in flat(params(sc)).items():
    np.testing.assert_array_equal(back[k], v, err_msg=k)
  # The conversion keeps the pytree structure the engine compares.
  assert jax.tree.structure(
      tfm.unrolled_state(params(sc))
  ) == jax.tree.structure(params(un))


# ------------------------------------------------ outputs and gradients


def logits_and_grads(model, window=None):
  graphdef, state = nnx.split(model)
  tokens, positions, mask, weights = batch()
  if window is not None:
    weights = windows.take_window(weights, window[0], window[1])

  def loss(st):
    logits, _, _ = nnx.merge(graphdef, st)(
        tokens, positions, mask, window=window
    )
    return jnp.sum(logits * weights), logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
  return np.asarray(logits), grads


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("attention", ["auto", "plain"])
def test_scanned_equals_unrolled_outputs_and_gradients(remat, attention):
  un, sc = pair(remat=remat, attention=attention)
  want_logits, want_grads = logits_and_grads(un)
  got_logits, got_grads = logits_and_grads(sc)
  np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=1e-5)
  assert_close_to_scale(flat(tfm.unrolled_state(got_grads)), flat(want_grads))


@pytest.mark.parametrize("remat", [False, True])
def test_scanned_equals_unrolled_in_the_response_window(remat):
  un, sc = pair(remat=remat)
  window = (jnp.asarray([3, 1, 1], jnp.int32), 5)
  want_logits, want_grads = logits_and_grads(un, window)
  got_logits, got_grads = logits_and_grads(sc, window)
  assert got_logits.shape == (3, 5, CFG.vocab_size)
  np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=1e-5)
  assert_close_to_scale(flat(tfm.unrolled_state(got_grads)), flat(want_grads))


def test_scanned_kv_cache_path_equals_unrolled():
  """Prefill 8 tokens into a cache, then decode one: same logits and the
  same cache (the scanned model runs its cache path block by block)."""
  un, sc = pair()
  tokens, positions, mask, _ = batch()
  outs = []
  for model in (un, sc):
    cache = tfm.init_cache(CFG, 3, 16)
    fwd = nnx.jit(lambda m, t, p, a, c: m(t, p, a, cache=c))
    lg1, _, cache = fwd(
        model, tokens[:, :8], positions[:, :8], mask[:, :8], cache
    )
    lg2, _, cache = fwd(
        model, tokens[:, 8:9], positions[:, 8:9], mask[:, 8:9], cache
    )
    outs.append((lg1, lg2, cache))
  for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
    np.testing.assert_allclose(
        np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=0, atol=1e-5
    )


# ----------------------------------------------------------- training


def sft_batch(rows=8, length=16):
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, CFG.vocab_size, (rows, length)).astype(np.int32)
  loss_mask = np.zeros((rows, length), np.float32)
  loss_mask[:, 6:] = 1.0
  z = np.zeros((rows, length), np.float32)
  return Batch(
      tokens=tokens,
      positions=np.tile(np.arange(length, dtype=np.int32), (rows, 1)),
      attention_mask=np.ones((rows, length), np.int32),
      loss_mask=loss_mask,
      advantages=z,
      old_logp=z,
      ref_logp=z,
      behavior_logp=z,
      returns=z,
      old_values=z,
      is_offpolicy=np.zeros(rows, bool),
  )


def test_sharded_train_step_is_the_same_in_both_layouts():
  """One AdamW step of the Learner (FSDP over 4 CPU devices, 2 micro-
  batches, remat) from equal weights: equal loss and new weights within 5 %
  of one step (Adam's g / sqrt(v) turns float32 reduction-order noise on a
  near-zero gradient into up to a whole step; seen: 1.5 %); the stacks
  split over 'fsdp' on their width, never on the layer axis."""
  mesh = sharding.make_mesh((1, 4, 1), devices=jax.devices()[:4])
  b = sft_batch()
  out, lr = [], 1e-3
  for model in pair(remat=True):
    learner = Learner(
        model,
        ts.make_optimizer(lr),
        ts.make_sft_loss(0.0),
        mesh=mesh,
        rules=sharding.DEFAULT_RULES,
        micro_batch_rows=4,
    )
    m = learner.train(b, jax.random.key(0))
    out.append((m["loss"], learner.params))
  (loss_u, p_u), (loss_s, p_s) = out
  assert loss_s == pytest.approx(loss_u, rel=1e-6)
  got, want = flat(tfm.unrolled_state(p_s)), flat(p_u)
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_allclose(
        got[k], want[k], rtol=0, atol=0.05 * lr, err_msg=k
    )
  q = p_s["layers"]["attn"]["q"].get_value()
  assert q.sharding.spec[:2] == (None, "fsdp")


# ------------------------------------------------------------- HF files


def test_hf_files_are_the_unrolled_models_and_load_either_way(tmp_path):
  un, sc = pair()
  scfg = dataclasses.replace(CFG, scan_layers=True)
  hf_io.save_hf_model(un, CFG, str(tmp_path / "un"))
  hf_io.save_hf_model(sc, scfg, str(tmp_path / "sc"))
  a = load_file(str(tmp_path / "un" / hf_io.SAFE_SINGLE))
  b = load_file(str(tmp_path / "sc" / hf_io.SAFE_SINGLE))
  assert list(a) == list(b)  # same names, same order
  assert "model.layers.2.mlp.down_proj.weight" in b
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  # Back into the scanned layout (sharded over 8 devices) and unrolled.
  mesh = sharding.make_mesh((1, 8, 1))
  cfg2, loaded = hf_io.load_hf_model(
      str(tmp_path / "sc"), mesh=mesh, scan_layers=True
  )
  assert cfg2.scan_layers
  for k, v in flat(params(sc)).items():
    np.testing.assert_array_equal(flat(params(loaded))[k], v, err_msg=k)
  spec = loaded.layers.mlp.up.get_value().sharding.spec
  assert spec[:2] == (None, "fsdp")
  _, unrolled = hf_io.load_hf_model(str(tmp_path / "sc"))
  for k, v in flat(params(un)).items():
    np.testing.assert_array_equal(flat(params(unrolled))[k], v, err_msg=k)


# -------------------------------------------------------------- engine


def test_engine_runs_the_unrolled_copy_of_a_scanned_policy():
  un, sc = pair()
  scfg = dataclasses.replace(CFG, scan_layers=True)
  sampling = SamplingParams(temperature=0.0, max_new_tokens=6, seed=0)
  prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [20, 21]]
  kw = dict(pad_id=0, eos_ids=(), batch_buckets=(4,), prompt_buckets=(8,))
  want = JaxEngine(build.inference_model(un, CFG), CFG, **kw)
  eng = JaxEngine(
      build.inference_model(sc, scfg), build.engine_config(scfg), **kw
  )
  assert not build.engine_config(scfg).scan_layers
  for w, g in zip(
      want.generate(prompts, sampling), eng.generate(prompts, sampling)
  ):
    np.testing.assert_array_equal(g.token_ids, w.token_ids)
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=0, atol=1e-5)
  # A sync pushes the scanned learner's params, unrolled: same shapes.
  eng.update_weights(build.engine_params(params(sc), scfg), 1)
  host = jax.tree.map(np.asarray, params(sc))
  eng.update_weights(build.engine_params(host, scfg), 2)
  assert eng.weight_version == 2


# ------------------------------------------------------------- compile


def dots_in_compiled_forward(num_layers: int, scan: bool) -> int:
  cfg = dataclasses.replace(
      CFG, num_layers=num_layers, scan_layers=scan, remat=True
  )
  graphdef, state = nnx.split(
      nnx.eval_shape(lambda: tfm.Transformer(cfg, rngs=nnx.Rngs(0)))
  )
  tokens, positions, mask, weights = batch()

  def loss(st):
    logits, _, _ = nnx.merge(graphdef, st)(tokens, positions, mask)
    return jnp.sum(logits * weights)

  text = jax.jit(jax.grad(loss)).lower(state).as_text()
  return text.count("dot_general")


def test_scanned_program_has_one_block_whatever_the_depth():
  """Forward + backward: the scanned program's size does not grow with L,
  the unrolled one's does (one block's dots per layer)."""
  assert dots_in_compiled_forward(2, True) == dots_in_compiled_forward(6, True)
  grow = dots_in_compiled_forward(6, False) - dots_in_compiled_forward(2, False)
  assert grow > 0 and grow % 4 == 0


# ------------------------------------------------- sharding of the scan


@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (1, 4, 2)], ids=str)
@pytest.mark.parametrize("name", ["train_step", "logprob"])
def test_scanned_programs_move_no_activation_sized_collective(name, mesh_shape):
  """tests/hlo_sharding_test.py's check on the scanned layout (1.5B widths,
  remat): no all-gather / all-reduce / reduce-scatter of an activation
  beyond one device's share, temporaries within the same budget. One
  layer's weights, gathered inside the loop, are parameter-shaped."""
  import hlo_sharding_test as check  # pylint: disable=import-outside-toplevel
  from rspo_jax import hlo  # pylint: disable=import-outside-toplevel

  cfg = check.model_cfg(scan_layers=True, remat=True)
  mesh = sharding.make_mesh(mesh_shape)
  c = check.COMPILERS[name](mesh, cfg)
  assert "while" in c.hlo  # the layers stay a loop
  unrolled = hlo.abstract_model(dataclasses.replace(cfg, scan_layers=False))
  bound = hlo.activation_bound(c, mesh_shape, cfg.hidden_size)
  bad = hlo.activation_collectives(
      c.hlo, [c.params, unrolled[1]], mesh_shape, bound
  )
  assert not bad, (name, mesh_shape, bound, bad[:5])
  temp = c.memory["temp"]
  assert temp <= check._temp_bound(c, mesh_shape, cfg), temp
