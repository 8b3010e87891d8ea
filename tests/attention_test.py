"""Attention kernels equal the plain einsum path: outputs and gradients.

``model.attention`` = xla / cudnn (``jax.nn.dot_product_attention``, causal,
padding as per-row lengths) against 'plain' (scores from einsums, a [B, T,
S] mask) on a GQA model (4 query heads share 2 key/value heads) with
right-padded rows, in float32, within 1e-5. cuDNN runs only on a GPU.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rspo_jax import models
from rspo_jax.models import transformer as tfm

CFG = models.get_model_config(
    "tiny", vocab_size=96, num_layers=2, hidden_size=64,
    intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16,
)
T = 12
LENGTHS = (12, 7, 1)  # a full row, a right-padded one, a lone token


def kernels():
  out = ["xla", "auto"]
  if jax.default_backend() == "gpu":
    out.append("cudnn")
  return out


def batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, (len(LENGTHS), T))
  mask = np.arange(T)[None, :] < np.asarray(LENGTHS)[:, None]
  tokens = np.where(mask, tokens, 0).astype(np.int32)
  weights = rng.normal(size=(len(LENGTHS), T, CFG.vocab_size))
  return (jnp.asarray(tokens), tfm.positions_from_mask(jnp.asarray(mask)),
          jnp.asarray(mask, jnp.int32),
          jnp.asarray(weights * mask[..., None], jnp.float32))


def model_with(attention, dtype="float32"):
  cfg = dataclasses.replace(CFG, attention=attention, dtype=dtype)
  state = nnx.state(models.create_model(CFG, seed=1))
  # Weights x 2: attention far from uniform, so a wrong mask shows.
  state = jax.tree.map(lambda x: x * 2.0, state)
  graphdef = nnx.graphdef(nnx.eval_shape(
      lambda: tfm.Transformer(cfg, rngs=nnx.Rngs(0))))
  return graphdef, state


def logits_and_grads(attention, dtype="float32"):
  graphdef, state = model_with(attention, dtype)
  tokens, positions, mask, weights = batch()

  def loss(st):
    logits, _, _ = nnx.merge(graphdef, st)(tokens, positions, mask)
    return jnp.sum(logits * weights), logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
  return np.asarray(logits), jax.tree.map(np.asarray, grads)


@pytest.fixture(scope="module")
def plain():
  return logits_and_grads("plain")


def test_auto_is_xla_on_cpu_and_plain_is_none():
  if jax.default_backend() != "cpu":
    pytest.skip("CPU selection")
  assert tfm.attention_implementation(CFG) == "xla"
  assert tfm.attention_implementation(
      dataclasses.replace(CFG, dtype="bfloat16")) == "xla"
  assert tfm.attention_implementation(
      dataclasses.replace(CFG, attention="plain")) is None
  with pytest.raises(ValueError, match="splash"):
    dataclasses.replace(CFG, attention="splash")


@pytest.mark.parametrize("attention", kernels())
def test_kernel_equals_plain_path(attention, plain, monkeypatch):
  calls = []
  real = jax.nn.dot_product_attention

  def counted(*args, **kw):
    calls.append(kw["implementation"])
    return real(*args, **kw)

  monkeypatch.setattr(jax.nn, "dot_product_attention", counted)
  logits, grads = logits_and_grads(attention)
  assert len(calls) == CFG.num_layers  # every layer through the kernel
  want_logits, want_grads = plain
  # Every position agrees, pads included: with right padding a pad query
  # sees the row's real tokens under both masks.
  np.testing.assert_allclose(logits, want_logits, atol=1e-5, rtol=1e-5)
  # Gradients within 1e-5 of their scale, the largest entry (~140; float32
  # sums of that size differ by ~1e-5 in absolute terms with the order of
  # summation; measured: at most 4.4e-7 of the scale).
  flat = dict(nnx.to_flat_state(grads))
  want = dict(nnx.to_flat_state(want_grads))
  scale = max(np.abs(g.get_value()).max() for g in want.values())
  assert scale > 10.0
  for path, w in want.items():
    err = np.abs(flat[path].get_value() - w.get_value()).max()
    assert err <= 1e-5 * scale, ("/".join(map(str, path)), err, scale)


def test_padding_shows_at_pad_positions(plain):
  """Without the padding (causal only) the pad positions' logits move by
  far more than the tolerance: the comparison above checks the lengths."""
  graphdef, state = model_with("plain")
  tokens, positions, mask, _ = batch()
  causal_only, _, _ = nnx.merge(graphdef, state)(
      tokens, positions, jnp.ones_like(mask))
  pad = ~np.asarray(mask, bool)
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(causal_only)[real], plain[0][real],
                             atol=1e-5, rtol=1e-5)
  assert np.abs(np.asarray(causal_only)[pad] - plain[0][pad]).max() > 1e-2


def test_kernel_matches_plain_in_bfloat16():
  logits, _ = logits_and_grads("xla", "bfloat16")
  want, _ = logits_and_grads("plain", "bfloat16")
  scale = np.abs(want).max()
  assert np.abs(logits - want).max() <= 2e-2 * scale


def test_window_and_cache_paths_stay_plain(monkeypatch):
  """The response window's last block and the KV cache need offsets the
  kernel does not take: they run the plain path (and agree with the full
  forward)."""
  calls = []
  real = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, "dot_product_attention",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  graphdef, state = model_with("xla")
  model = nnx.merge(graphdef, state)
  tokens, positions, mask, _ = batch()
  full, _, _ = model(tokens, positions, mask)
  assert len(calls) == 2
  starts, r = jnp.asarray([4, 2, 1], jnp.int32), 4
  win, _, _ = model(tokens, positions, mask, window=(starts, r))
  assert len(calls) == 3  # the first block only
  np.testing.assert_allclose(
      win, tfm.take_window(full, starts, r), atol=1e-5, rtol=1e-5)
  cache = tfm.init_cache(CFG, 3, T)
  step, _, _ = model(tokens, positions, mask, cache=cache)
  assert len(calls) == 3
  np.testing.assert_allclose(step, full, atol=1e-5, rtol=1e-5)
