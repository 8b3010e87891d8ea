"""The jitted, sharded train step: sharded == unsharded, SFT learns, NaN
skip."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rspo_jax import models, sharding, train_step as ts
from rspo_jax.learner import Learner
from rspo_jax.models import windows
from rspo_jax.types import Batch

RULES = sharding.DEFAULT_RULES


def tiny_cfg():
  return models.get_model_config(
      "tiny",
      vocab_size=128,
      num_layers=1,
      hidden_size=64,
      intermediate_size=128,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
  )


def make_batch(rows=8, length=32, seed=0, offpolicy=True, padded_row=True):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, 128, size=(rows, length)).astype(np.int32)
  attn = np.ones((rows, length), np.int32)
  if padded_row:
    attn[1, 20:] = 0  # a right-padded row
  loss_mask = np.zeros((rows, length), np.float32)
  loss_mask[:, 16:] = 1.0
  loss_mask *= attn
  positions = np.maximum(np.cumsum(attn, 1) - 1, 0).astype(np.int32)
  adv = rng.normal(size=(rows, 1)).astype(np.float32) * loss_mask
  old = (-4.0 + 0.1 * rng.normal(size=(rows, length))).astype(np.float32)
  beh = old + 0.05 * rng.normal(size=(rows, length)).astype(np.float32)
  off = np.zeros(rows, bool)
  if offpolicy:
    off[-2:] = True
  beh = np.where(off[:, None], beh, old)
  return Batch(
      tokens=tokens,
      positions=positions,
      attention_mask=attn,
      loss_mask=loss_mask,
      advantages=adv,
      old_logp=old,
      ref_logp=old - 0.01,
      behavior_logp=beh,
      returns=np.zeros_like(old),
      old_values=np.zeros_like(old),
      is_offpolicy=off,
  )


def policy_learner(mesh_shape, micro_batch_rows=0):
  mesh = sharding.make_mesh(mesh_shape)
  module = models.create_model(tiny_cfg(), seed=0)
  loss = ts.make_policy_loss(
      ts.PolicyLossConfig(alpha=0.25, kl_coef=0.01, entropy_coef=0.001)
  )
  tx = ts.make_optimizer(1e-3)
  return Learner(
      module,
      tx,
      loss,
      mesh=mesh,
      rules=RULES,
      micro_batch_rows=micro_batch_rows,
  )


def run_steps(learner, batch, n=2):
  metrics = []
  for i in range(n):
    metrics.append(learner.train(batch, jax.random.key(i)))
  return metrics, jax.device_get(learner.params)


def test_sharded_step_equals_unsharded():
  assert len(jax.devices()) == 8
  batch = make_batch()
  m1, p1 = run_steps(policy_learner((1, 1, 1)), batch)
  m8, p8 = run_steps(policy_learner((2, 2, 2)), batch)
  for a, b in zip(m1, m8):
    np.testing.assert_allclose(a["loss"], b["loss"], atol=1e-5, rtol=1e-5)
  # Adam divides by sqrt(v): an element whose gradient is a near-cancelled
  # sum keeps float32 reduction-order noise as a relative error of its
  # update, up to a few % of lr (1e-3) after two steps. A sharding bug moves
  # elements by whole steps (~lr), far outside 5 % of one.
  for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=5e-5)


def test_params_are_sharded_on_mesh():
  learner = policy_learner((2, 2, 2))
  specs = {str(x.sharding.spec) for x in jax.tree.leaves(learner.params)}
  assert any("fsdp" in s for s in specs), specs
  assert any("tensor" in s for s in specs), specs


def test_micro_batches_equal_full_batch():
  """Micro-batches sum to the whole batch's objective (whole-batch token
  counts and weights), even with replayed rows last and a padded row: the
  loss and the parameters after two Adam steps agree. (Before, the step
  averaged per-micro-batch objectives and agreed only on equal halves.)"""
  batch = make_batch()
  full = policy_learner((1, 1, 1))
  micro = policy_learner((1, 1, 1), micro_batch_rows=3)
  assert micro.n_micro(8) == 3  # 3 + 3 + 2 rows (one zero-mask pad row)
  mf, pf = run_steps(full, batch)
  mm, pm = run_steps(micro, batch)
  for a, b in zip(mf, mm):
    for k in a:
      np.testing.assert_allclose(a[k], b[k], atol=1e-5, rtol=1e-5, err_msg=k)
  for x, y in zip(jax.tree.leaves(pf), jax.tree.leaves(pm)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)


def test_split_micro_is_strided_and_padded():
  x = np.arange(10).reshape(5, 2)
  micro = np.asarray(ts.split_micro({"x": x}, 2)["x"])
  # micro-batch i = rows i, i + 2, i + 4; a zero row pads to 6 rows.
  np.testing.assert_array_equal(micro[0], x[[0, 2, 4]])
  np.testing.assert_array_equal(micro[1], [x[1], x[3], [0, 0]])
  with pytest.raises(ValueError, match="does not split"):
    ts.split_micro({"x": x}, 2, pad=False)


def test_loss_without_totals_keeps_equal_micro_batches():
  """A loss not marked summed_over_micro_batches is averaged over equal
  micro-batches: rows / m of them when m divides the rows, else one."""
  plain = lambda model, batch, rng: ts.sft_loss(model, batch, rng)
  assert ts.batch_totals_of(plain) is None
  assert ts.batch_totals_of(ts.sft_loss) is not None
  mesh = sharding.make_mesh((1, 1, 1))
  learner = Learner(
      models.create_model(tiny_cfg(), seed=0),
      ts.make_optimizer(1e-3),
      plain,
      mesh=mesh,
      rules=RULES,
      micro_batch_rows=3,
  )
  assert learner.n_micro(16) == 1 and learner.n_micro(12) == 4
  learner.micro_batch_rows = 0
  assert learner.n_micro(16) == 1


def test_two_sft_steps_reduce_supervised_loss():
  mesh = sharding.make_mesh((-1, 1, 1))
  module = models.create_model(tiny_cfg(), seed=0)
  learner = Learner(
      module, ts.make_optimizer(3e-3), ts.sft_loss, mesh=mesh, rules=RULES
  )
  batch = make_batch(offpolicy=False)
  before = learner.train(batch, jax.random.key(0))["nll"]
  learner.train(batch, jax.random.key(1))
  after = learner.train(batch, jax.random.key(2))["nll"]
  assert after < before - 0.01, (before, after)


def test_nonfinite_update_is_skipped_and_params_stay_finite():
  learner = policy_learner((1, 1, 1))
  batch = make_batch()
  before = jax.device_get(learner.params)
  bad = batch._replace(advantages=np.full_like(batch.advantages, np.nan))
  m = learner.train(bad, jax.random.key(0))
  assert m["skipped"] == 1.0
  assert learner.step == 0
  for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(learner.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  m = learner.train(batch, jax.random.key(1))
  assert m["skipped"] == 0.0 and learner.step == 1


def test_copy_is_independent_and_sharded_alike():
  learner = policy_learner((2, 2, 2))
  b = learner.copy(copy_opt_state=False)
  b.train(make_batch(), jax.random.key(0))
  moved = any(
      not np.array_equal(np.asarray(x), np.asarray(y))
      for x, y in zip(
          jax.tree.leaves(learner.params), jax.tree.leaves(b.params)
      )
  )
  assert moved
  assert learner.step == 0 and b.step == 1
  for x, y in zip(jax.tree.leaves(learner.params), jax.tree.leaves(b.params)):
    assert x.sharding == y.sharding


def test_logprob_fn_matches_direct_forward():
  learner = policy_learner((1, 1, 1))
  batch = make_batch()
  lp = learner.apply(batch)
  model = learner.module()
  logits, _, _ = model(
      jnp.asarray(batch.tokens),
      jnp.asarray(batch.positions),
      jnp.asarray(batch.attention_mask),
  )
  ref = np.asarray(models.token_logprobs(logits, jnp.asarray(batch.tokens)))
  # Equal on the response window (where the loss counts), 0 elsewhere.
  np.testing.assert_allclose(lp[:, 16:], ref[:, 16:], atol=1e-5)
  np.testing.assert_array_equal(lp[:, :16], 0.0)


# ------------------------------------------------------- response window


def ragged_batch(rows=8, length=48, seed=1):
  """Rows with different prompt lengths (response starts 9..30) and
  right padding, as records_to_batch builds them; row 3 has no response."""
  rng = np.random.default_rng(seed)
  base = make_batch(rows, length, seed, offpolicy=True, padded_row=False)
  attn = np.zeros((rows, length), np.int32)
  loss_mask = np.zeros((rows, length), np.float32)
  for b in range(rows):
    p = 9 + 3 * b
    n = min(int(rng.integers(4, 15)), length - p)
    attn[b, : p + n] = 1
    if b != 3:
      loss_mask[b, p : p + n] = 1.0
  positions = np.maximum(np.cumsum(attn, 1) - 1, 0).astype(np.int32)
  return base._replace(
      attention_mask=attn,
      loss_mask=loss_mask,
      positions=positions,
      advantages=base.advantages[:, :1] * 0
      + rng.normal(size=(rows, 1)).astype(np.float32) * loss_mask,
  )


def test_response_window_by_hand():
  m = np.zeros((3, 40), np.float32)
  m[0, 10:14] = 1  # span 4
  m[1, 20:37] = 1  # span 17 -> bucket 24
  assert ts.response_window(m) == 24
  assert ts.response_window(m[:1]) == 16
  assert ts.response_window(np.zeros((2, 40))) == 0  # nothing counts
  # The on-device reduction used for multi-host global arrays agrees.
  on_device = ts._global_max_span  # pylint: disable=protected-access
  assert int(on_device(jnp.asarray(m))) == 17
  m[2, 1:40] = 1  # span 39 -> bucket 48 >= T - 1: no window
  assert ts.response_window(m) == 0
  starts = windows.window_starts(jnp.asarray(m[:2]), 24)
  np.testing.assert_array_equal(np.asarray(starts), [10, 16])  # 16 = 40 - 24


def test_take_and_put_window_by_hand():
  x = jnp.arange(12).reshape(2, 6)
  s = jnp.array([1, 3])
  w = windows.take_window(x, s, 2)
  np.testing.assert_array_equal(np.asarray(w), [[1, 2], [9, 10]])
  back = windows.put_window(w, s, 6)
  np.testing.assert_array_equal(
      np.asarray(back), [[0, 1, 2, 0, 0, 0], [0, 0, 0, 9, 10, 0]]
  )


def _no_window(loss_fn):
  """The same loss without the ``window`` keyword: full computation."""
  return lambda model, batch, rng: loss_fn(model, batch, rng)


@pytest.mark.parametrize("which", ["policy", "sft"])
def test_windowed_loss_and_grads_equal_full_computation(which):
  batch = jax.tree.map(jnp.asarray, ragged_batch())
  window = ts.response_window(batch.loss_mask)
  assert 0 < window < batch.tokens.shape[1] - 1
  model = models.create_model(tiny_cfg(), seed=0)
  graphdef, params, rest = ts.split_trainable(model)
  loss_fn = (
      ts.make_policy_loss(
          ts.PolicyLossConfig(alpha=0.25, kl_coef=0.01, entropy_coef=0.01)
      )
      if which == "policy"
      else ts.sft_loss
  )

  def value_and_grad(w):
    def f(p):
      return loss_fn(nnx.merge(graphdef, p, rest), batch, None, window=w)

    return jax.value_and_grad(f, has_aux=True)(params)

  (l_full, m_full), g_full = value_and_grad(0)
  (l_win, m_win), g_win = value_and_grad(window)
  np.testing.assert_allclose(l_win, l_full, atol=1e-5, rtol=1e-5)
  for k in m_full:
    np.testing.assert_allclose(m_win[k], m_full[k], atol=1e-5, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_win)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)
  if which == "policy":
    assert m_full["entropy"] > 0  # the entropy term took part


def test_windowed_logprobs_equal_full_on_counted_tokens():
  batch = jax.tree.map(jnp.asarray, ragged_batch())
  model = models.create_model(tiny_cfg(), seed=0)
  window = ts.response_window(batch.loss_mask)
  args = (
      model,
      batch.tokens,
      batch.positions,
      batch.attention_mask,
      batch.loss_mask,
  )
  full, _ = ts.policy_forward(*args, window=0)
  win, _ = ts.policy_forward(*args, window=window)
  full, win = np.asarray(full), np.asarray(win)
  mask = np.asarray(batch.loss_mask) > 0
  np.testing.assert_allclose(win[mask], full[mask], atol=1e-5)
  inside = win != 0
  np.testing.assert_allclose(win[inside], full[inside], atol=1e-5)
  assert inside.sum(axis=1).max() == window  # R positions per row, 0 outside


def test_sharded_windowed_learner_equals_unsharded_full_learner():
  batch = ragged_batch()
  cfg = ts.PolicyLossConfig(alpha=0.25, kl_coef=0.01, entropy_coef=0.001)
  full = policy_learner((1, 1, 1))
  full.loss_fn = _no_window(ts.make_policy_loss(cfg))
  full._windowed = False  # pylint: disable=protected-access
  windowed = policy_learner((2, 2, 2))
  np.testing.assert_allclose(
      windowed.apply(batch) * batch.loss_mask,
      full.apply(batch) * batch.loss_mask,
      atol=1e-5,
  )
  m1, p1 = run_steps(full, batch)
  m8, p8 = run_steps(windowed, batch)
  for a, b in zip(m1, m8):
    np.testing.assert_allclose(a["loss"], b["loss"], atol=1e-5, rtol=1e-5)
  for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)


def test_sft_prompt_loss_by_hand():
  """make_sft_loss(w) = nll(response) + w * nll(prompt), each a mean over its
  own tokens; a row's first token and padding are in neither."""
  module = models.create_model(tiny_cfg(), seed=0)
  batch = make_batch()
  logits, _, _ = module(
      jnp.asarray(batch.tokens),
      jnp.asarray(batch.positions),
      jnp.asarray(batch.attention_mask),
  )
  logp = np.asarray(jax.nn.log_softmax(logits[:, :-1], -1))
  tok_logp = np.zeros(batch.tokens.shape, np.float32)
  tok_logp[:, 1:] = np.take_along_axis(logp, batch.tokens[:, 1:, None], -1)[
      ..., 0
  ]
  resp = batch.loss_mask > 0
  prompt = (batch.attention_mask > 0) & ~resp
  prompt[:, 0] = False
  want_resp = -tok_logp[resp].mean()
  want_prompt = -tok_logp[prompt].mean()
  loss, m = ts.make_sft_loss(0.5)(module, batch, None)
  np.testing.assert_allclose(m["nll"], want_resp, rtol=1e-5)
  np.testing.assert_allclose(m["prompt_nll"], want_prompt, rtol=1e-5)
  np.testing.assert_allclose(loss, want_resp + 0.5 * want_prompt, rtol=1e-5)
  assert ts.make_sft_loss(0.0) is ts.sft_loss
  with pytest.raises(ValueError, match="prompt_weight"):
    ts.make_sft_loss(-1.0)
