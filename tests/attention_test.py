"""Attention kernels equal the plain einsum path: outputs and gradients.

``model.attention`` = xla / cudnn (``jax.nn.dot_product_attention``, causal,
padding as per-row lengths) and splash (Pallas splash attention, in
Pallas's interpreter off TPU) against 'plain' (scores from einsums, a [B,
T, S] mask) on a GQA model (4 query heads share 2 key/value heads) with
right-padded rows, in float32, within 1e-5. cuDNN runs only on a GPU.
Splash also runs under ``shard_map`` on a (2, 1, 4) mesh of CPU devices
(rows over 'data', heads over 'tensor': each kv head repeated twice) on
256 tokens in 128-token tiles.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rspo_jax import models, sharding
from rspo_jax.models import splash
from rspo_jax.models import transformer as tfm
from rspo_jax.models import windows

CFG = models.get_model_config(
    "tiny",
    vocab_size=96,
    num_layers=2,
    hidden_size=64,
    intermediate_size=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
)
T = 12
LENGTHS = (12, 7, 1)  # a full row, a right-padded one, a lone token


# The mesh test: 256 tokens in 128-token tiles (tiles above the diagonal
# skipped; rows ending inside the second tile, in the first, at token 1).
MESH_T = 256
MESH_LENGTHS = (256, 200, 100, 1)


def kernels():
  out = ["xla", "auto", "splash"]
  if jax.default_backend() == "gpu":
    out.append("cudnn")
  return out


def batch(lengths=LENGTHS, t=T):
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, (len(lengths), t))
  mask = np.arange(t)[None, :] < np.asarray(lengths)[:, None]
  tokens = np.where(mask, tokens, 0).astype(np.int32)
  weights = rng.normal(size=(len(lengths), t, CFG.vocab_size))
  return (
      jnp.asarray(tokens),
      tfm.positions_from_mask(jnp.asarray(mask)),
      jnp.asarray(mask, jnp.int32),
      jnp.asarray(weights * mask[..., None], jnp.float32),
  )


def model_with(attention, dtype="float32"):
  cfg = dataclasses.replace(CFG, attention=attention, dtype=dtype)
  state = nnx.state(models.create_model(CFG, seed=1))
  # Weights x 2: attention far from uniform, so a wrong mask shows.
  state = jax.tree.map(lambda x: x * 2.0, state)
  graphdef = nnx.graphdef(
      nnx.eval_shape(lambda: tfm.Transformer(cfg, rngs=nnx.Rngs(0)))
  )
  return graphdef, state


def placed(attention, dtype="float32", data=None, mesh=None):
  """(graphdef, state, batch), state and batch on ``mesh`` if given."""
  graphdef, state = model_with(attention, dtype)
  data = data or batch()
  if mesh is not None:
    rules = sharding.DEFAULT_RULES
    state = jax.device_put(state, sharding.state_shardings(mesh, state, rules))
    rows = lambda x: jax.device_put(
        x, sharding.batch_sharding(mesh, rules, x.ndim)
    )
    data = tuple(map(rows, data))
  return graphdef, state, data


def logits_and_grads(attention, dtype="float32", data=None, mesh=None):
  graphdef, state, (tokens, positions, mask, weights) = placed(
      attention, dtype, data, mesh
  )

  def loss(st):
    logits, _, _ = nnx.merge(graphdef, st)(tokens, positions, mask)
    return jnp.sum(logits * weights), logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
  return np.asarray(logits), jax.tree.map(np.asarray, grads)


@pytest.fixture(scope="module")
def plain():
  return logits_and_grads("plain")


def count_kernel_calls(monkeypatch) -> list:
  """Records each call of a kernel (``jax.nn.dot_product_attention``'s
  implementation, or 'splash'); the kernels still run."""
  calls = []
  real_dpa, real_splash = jax.nn.dot_product_attention, splash.attention

  def dpa(*args, **kw):
    calls.append(kw["implementation"])
    return real_dpa(*args, **kw)

  def splash_attention(*args, **kw):
    calls.append("splash")
    return real_splash(*args, **kw)

  monkeypatch.setattr(jax.nn, "dot_product_attention", dpa)
  monkeypatch.setattr(splash, "attention", splash_attention)
  return calls


def assert_equal_to_plain(got, want):
  """Logits within 1e-5; gradients within 1e-5 of their scale, the largest
  entry (~140; float32 sums of that size differ by ~1e-5 in absolute terms
  with the order of summation; measured: at most 4.4e-7 of the scale)."""
  (logits, grads), (want_logits, want_grads) = got, want
  # Every position agrees, pads included: with right padding a pad query
  # sees the row's real tokens under both masks.
  np.testing.assert_allclose(logits, want_logits, atol=1e-5, rtol=1e-5)
  flat = dict(nnx.to_flat_state(grads))
  want = dict(nnx.to_flat_state(want_grads))
  scale = max(np.abs(g.get_value()).max() for g in want.values())
  assert scale > 10.0
  for path, w in want.items():
    err = np.abs(flat[path].get_value() - w.get_value()).max()
    assert err <= 1e-5 * scale, ("/".join(map(str, path)), err, scale)


def test_auto_is_xla_on_cpu_and_plain_is_none():
  if jax.default_backend() != "cpu":
    pytest.skip("CPU selection")
  assert tfm.attention_implementation(CFG) == "xla"
  assert (
      tfm.attention_implementation(dataclasses.replace(CFG, dtype="bfloat16"))
      == "xla"
  )
  assert (
      tfm.attention_implementation(dataclasses.replace(CFG, attention="plain"))
      is None
  )
  assert (
      tfm.attention_implementation(dataclasses.replace(CFG, attention="splash"))
      == "splash"
  )
  assert splash.interpret_mode()  # off TPU: Pallas's interpreter
  with pytest.raises(ValueError, match="attention"):
    dataclasses.replace(CFG, attention="flash")


def test_splash_tiles_and_kv_repeats():
  """Sequences padded to 128-token tiles, blocks the largest of 512 / 256 /
  128 dividing them; kv heads repeated the least that splits them over the
  heads' mesh axes."""
  assert [splash.padded_length(t) for t in (1, 128, 129, 4608)] == [
      128,
      128,
      256,
      4608,
  ]
  assert [splash.block_size(t) for t in (128, 256, 384, 1024, 4608)] == [
      128,
      256,
      128,
      512,
      512,
  ]
  # (kv heads, query heads per kv head, ways) -> r
  assert splash.kv_repeats(2, 6, 1) == 1  # Qwen2.5-1.5B, no tensor axis
  assert splash.kv_repeats(2, 6, 2) == 1
  assert splash.kv_repeats(2, 6, 4) == 2  # 4 kv heads of 3 queries each
  assert splash.kv_repeats(2, 6, 3) == 3
  assert splash.kv_repeats(4, 7, 8) is None  # 7B on 8: heads replicated


def test_splash_kernel_serves_several_programs():
  """The kernel built (and cached) while tracing one program serves the
  next: its tables are constants, not that trace's values."""
  q = jnp.ones((1, T, 2, 16))
  lengths = jnp.asarray([5])
  run = lambda q: splash.attention(q, q, q, lengths, tfm.NO_SHARDING)
  first = jax.jit(run)(q)
  second = jax.jit(lambda q: run(q) * 2.0)(q)  # raised UnexpectedTracerError
  np.testing.assert_allclose(second, 2.0 * first)
  np.testing.assert_allclose(first, 1.0)  # the mean of equal values


@pytest.mark.parametrize("attention", kernels())
def test_kernel_equals_plain_path(attention, plain, monkeypatch):
  calls = count_kernel_calls(monkeypatch)
  got = logits_and_grads(attention)
  assert len(calls) == CFG.num_layers  # every layer through the kernel
  assert_equal_to_plain(got, plain)


def test_splash_on_a_mesh_equals_plain_path(monkeypatch):
  """Under ``shard_map`` on (data 2, fsdp 1, tensor 4): 2 rows a device
  pair, 4 heads over 'tensor' (2 kv heads repeated to 4, one query head
  each), two 128-token tiles; equal to the plain path on one device."""
  mesh = sharding.make_mesh((2, 1, 4))
  data = batch(MESH_LENGTHS, MESH_T)
  want = logits_and_grads("plain", data=data)
  monkeypatch.setattr(splash, "MAX_BLOCK", 128)
  calls = count_kernel_calls(monkeypatch)
  got = logits_and_grads("splash", data=data, mesh=mesh)
  assert calls == ["splash"] * CFG.num_layers
  assert_equal_to_plain(got, want)
  graphdef, state, (tokens, positions, mask, _) = placed(
      "splash", data=data, mesh=mesh
  )
  program = str(
      jax.make_jaxpr(
          lambda st: nnx.merge(graphdef, st)(tokens, positions, mask)[0]
      )(state)
  )
  assert program.count("shard_map[") == CFG.num_layers
  assert "pallas_call" in program


def test_padding_shows_at_pad_positions(plain):
  """Without the padding (causal only) the pad positions' logits move by
  far more than the tolerance: the comparison above checks the lengths."""
  graphdef, state = model_with("plain")
  tokens, positions, mask, _ = batch()
  causal_only, _, _ = nnx.merge(graphdef, state)(
      tokens, positions, jnp.ones_like(mask)
  )
  pad = ~np.asarray(mask, bool)
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(
      np.asarray(causal_only)[real], plain[0][real], atol=1e-5, rtol=1e-5
  )
  assert np.abs(np.asarray(causal_only)[pad] - plain[0][pad]).max() > 1e-2


@pytest.fixture(scope="module")
def plain_bfloat16():
  return logits_and_grads("plain", "bfloat16")[0]


@pytest.mark.parametrize("attention", ["xla", "splash"])
def test_kernel_matches_plain_in_bfloat16(attention, plain_bfloat16):
  """Within 2e-2 of the logits' scale (measured: xla 0, splash 1.0e-2 --
  splash multiplies v by float32 probabilities, the plain path by
  probabilities rounded to bfloat16)."""
  logits, _ = logits_and_grads(attention, "bfloat16")
  scale = np.abs(plain_bfloat16).max()
  assert np.abs(logits - plain_bfloat16).max() <= 2e-2 * scale


@pytest.mark.parametrize("attention", ["xla", "splash"])
def test_window_and_cache_paths_stay_plain(attention, monkeypatch):
  """The response window's last block and the KV cache need offsets the
  kernels do not take: they run the plain path (and agree with the full
  forward)."""
  calls = count_kernel_calls(monkeypatch)
  graphdef, state = model_with(attention)
  model = nnx.merge(graphdef, state)
  tokens, positions, mask, _ = batch()
  full, _, _ = model(tokens, positions, mask)
  assert len(calls) == 2
  starts, r = jnp.asarray([4, 2, 1], jnp.int32), 4
  win, _, _ = model(tokens, positions, mask, window=(starts, r))
  assert len(calls) == 3  # the first block only
  np.testing.assert_allclose(
      win, windows.take_window(full, starts, r), atol=1e-5, rtol=1e-5
  )
  cache = tfm.init_cache(CFG, 3, T)
  step, _, _ = model(tokens, positions, mask, cache=cache)
  assert len(calls) == 3
  np.testing.assert_allclose(step, full, atol=1e-5, rtol=1e-5)
