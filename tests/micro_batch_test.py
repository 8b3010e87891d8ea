"""One optimizer update = one whole-batch objective (issue 15, items 2-3).

    loss = -[w_on sum_on f / N_on + w_off sum_off f / N_off] - coef_H H

with N_src and the weights from the whole update's counts, whatever the
micro-batch size, the row order, padding rows or the mesh; and a replayed
token whose ratio has left [c - eps, c + eps] at a later update of the same
step has zero gradient and is counted by clip_frac_off_{low,high}.

The learners here use plain SGD with lr 1 and no clipping, so an update's
parameter change is minus the gradient exactly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rspo_jax import models, sharding, train_step as ts
from rspo_jax.learner import Learner
from train_step_test import RULES, make_batch, tiny_cfg

LOSS = ts.PolicyLossConfig(alpha=0.25, kl_coef=0.01, entropy_coef=0.001)


def sgd_learner(mesh_shape, loss_fn, micro_batch_rows=0):
  return Learner(
      models.create_model(tiny_cfg(), seed=0),
      optax.sgd(1.0),
      loss_fn,
      mesh=sharding.make_mesh(mesh_shape),
      rules=RULES,
      micro_batch_rows=micro_batch_rows,
  )


def gradient_and_metrics(learner, batch):
  """(-(params after - params before), metrics) of one update."""
  before = jax.device_get(learner.params)
  metrics = learner.train(batch, jax.random.key(0))
  after = jax.device_get(learner.params)
  grads = jax.tree.map(
      lambda a, b: np.asarray(b) - np.asarray(a), after, before
  )
  return grads, metrics


def real_rows():
  """12 rows: 9 fresh, 3 replayed (rows 2, 6, 11); row 1 right-padded."""
  batch = make_batch(rows=12, seed=3)
  off = np.zeros(12, bool)
  off[[2, 6, 11]] = True
  rng = np.random.default_rng(4)
  beh = batch.old_logp + 0.3 * rng.normal(size=batch.old_logp.shape)
  return batch._replace(
      is_offpolicy=off,
      behavior_logp=np.where(off[:, None], beh, batch.old_logp).astype(
          np.float32
      ),
  )


def with_padding_shuffled(batch, seed=0):
  """The rows plus 4 padding rows (two with real tokens and an empty loss
  mask, two all zero), in a random order: 16 rows."""
  filler = make_batch(rows=4, seed=9)
  filler = filler._replace(
      loss_mask=np.zeros_like(filler.loss_mask),
      is_offpolicy=np.array([False, True] * 2),
  )
  filler = jax.tree.map(lambda x: x.copy(), filler)
  for field in filler._fields:
    getattr(filler, field)[2:] = 0
  rows = jax.tree.map(lambda a, b: np.concatenate([a, b]), batch, filler)
  order = np.random.default_rng(seed).permutation(len(rows.tokens))
  return jax.tree.map(lambda x: x[order], rows)


def assert_same_update(got, want, atol=1e-5):
  (g_got, m_got), (g_want, m_want) = got, want
  assert set(m_got) == set(m_want)
  for k in m_want:
    np.testing.assert_allclose(
        m_got[k], m_want[k], atol=atol, rtol=1e-5, err_msg=k
    )
  for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want)):
    np.testing.assert_allclose(a, b, atol=atol)


@pytest.fixture(scope="module")
def reference_update():
  """Whole batch at once, one device, no padding, the rows in order."""
  learner = sgd_learner((1, 1, 1), ts.make_policy_loss(LOSS))
  return gradient_and_metrics(learner, real_rows())


@pytest.mark.parametrize("mesh_shape", [(1, 1, 1), (1, 8, 1)])
@pytest.mark.parametrize("micro_batch_rows", [0, 1, 3, 8])
def test_update_is_independent_of_micro_batches_order_padding_mesh(
    reference_update, mesh_shape, micro_batch_rows
):
  batch = with_padding_shuffled(real_rows(), seed=micro_batch_rows)
  learner = sgd_learner(mesh_shape, ts.make_policy_loss(LOSS), micro_batch_rows)
  # 16 rows in micro-batches of <= 3 rows: 6 of them, 2 rows of padding.
  want_micro = {0: 1, 1: 16, 3: 6, 8: 2}[micro_batch_rows]
  assert learner.n_micro(16) == want_micro
  got = gradient_and_metrics(learner, batch)
  assert_same_update(got, reference_update)
  m = got[1]
  assert m["n_tokens_off"] == 3 * 16 and m["n_rows_off"] == 3
  assert m["n_tokens_on"] == 8 * 16 + 4  # row 1 counts 4 tokens
  assert m["w_on"] == 0.75 and m["w_off"] == 0.25
  assert m["entropy"] > 0 and m["kl_off"] != 0  # all terms took part


@pytest.mark.parametrize("mesh_shape", [(2, 4, 1), (2, 2, 2)], ids=str)
def test_data_local_micro_batches_give_the_same_update(
    reference_update, mesh_shape
):
  """A mesh with 'data' in micro-batches: each data shard loops over its
  own rows and the shards' sums are reduced once (train_step._data_local).
  (2, 2, 2): 'fsdp' and 'tensor' partitioned inside the loop -- a gather
  of the targets' logits there crashed XLA (transformer.target_logprobs)."""
  learner = sgd_learner(mesh_shape, ts.make_policy_loss(LOSS), 3)
  assert learner.n_micro(16) == 6
  got = gradient_and_metrics(learner, with_padding_shuffled(real_rows(), 2))
  assert_same_update(got, reference_update)


def test_seq_mean_update_is_independent_of_micro_batches():
  """agg = seq_mean_token_mean: row means over the whole update's count of
  rows with counted tokens, per source."""
  loss = ts.make_policy_loss(
      ts.PolicyLossConfig(
          alpha=0.25,
          kl_coef=0.01,
          entropy_coef=0.001,
          loss_agg="seq_mean_token_mean",
      )
  )
  want = gradient_and_metrics(sgd_learner((1, 1, 1), loss), real_rows())
  got = gradient_and_metrics(
      sgd_learner((1, 8, 1), loss, 3),
      with_padding_shuffled(real_rows(), seed=5),
  )
  assert_same_update(got, want)


def test_sft_update_is_independent_of_micro_batches():
  """Response and prompt token means over the whole batch (padding rows'
  attention zeroed: a row with real tokens would add prompt tokens)."""
  loss = ts.make_sft_loss(0.5)
  want = gradient_and_metrics(sgd_learner((1, 1, 1), loss), real_rows())
  batch = with_padding_shuffled(real_rows(), seed=1)
  empty = batch.loss_mask.sum(1) == 0
  batch = batch._replace(
      attention_mask=np.where(empty[:, None], 0, batch.attention_mask).astype(
          np.int32
      )
  )
  for m in (0, 3):
    got = gradient_and_metrics(sgd_learner((1, 1, 1), loss, m), batch)
    assert_same_update(got, want)
  assert want[1]["n_tokens"] == 11 * 16 + 4
  assert want[1]["n_prompt_tokens"] == 12 * 15


def test_centre_cap_update_is_independent_of_micro_batches():
  """rspo.centre_cap through make_policy_loss (mask mode, binding on some of
  the replayed tokens, c = exp(-0.3 z)): the same whole-batch update in
  micro-batches of 3 rows on an 8-device mesh, padding and order mixed."""
  loss = ts.make_policy_loss(
      ts.PolicyLossConfig(
          alpha=0.25,
          kl_coef=0.01,
          entropy_coef=0.001,
          centre_cap=1.2,
          centre_cap_mode="mask",
      )
  )
  want = gradient_and_metrics(sgd_learner((1, 1, 1), loss), real_rows())
  assert 0 < want[1]["centre_cap_frac_off"] < 1
  got = gradient_and_metrics(
      sgd_learner((1, 8, 1), loss, 3),
      with_padding_shuffled(real_rows(), seed=2),
  )
  assert_same_update(got, want)


# ------------------------------------------------- clip at the second update


def test_replayed_token_out_of_its_window_gets_zero_gradient():
  """c = pi_old / pi_B = 2 on the replayed row 7 (window [1.8, 2.2]). At the
  first update r = c: nothing clips. After it, tokens whose ratio has left
  the window on their advantage's side contribute exactly zero gradient at
  the second update, and clip_frac_off_{low,high} count them."""
  cfg = ts.PolicyLossConfig(alpha=0.25, clip_eps=0.2)  # no KL, no entropy
  loss_fn = ts.make_policy_loss(cfg)
  learner = Learner(
      models.create_model(tiny_cfg(), seed=0),
      ts.make_optimizer(8e-4, grad_clip=0.0),
      loss_fn,
      mesh=sharding.make_mesh((1, 1, 1)),
      rules=RULES,
      micro_batch_rows=3,
  )
  batch = make_batch(offpolicy=False, padded_row=False)
  off = np.arange(8) == 7
  adv = batch.loss_mask.copy()
  adv[:, 24:] *= -1.0  # A = +1 on response tokens 16-23, -1 on 24-31
  old = learner.apply(batch)  # pi_old: the policy at the step's start
  beh = np.where(off[:, None], old - np.log(2.0), old).astype(np.float32)
  batch = batch._replace(
      old_logp=old,
      behavior_logp=beh,
      ref_logp=old,
      advantages=adv,
      is_offpolicy=off,
  )

  first = learner.train(batch, jax.random.key(0))
  for src in ("on", "off"):
    assert first[f"clip_frac_{src}"] == 0.0  # r = 1 and r = c: inside

  # The ratios at the second update, by hand.
  logp = learner.apply(batch)
  counted = batch.loss_mask > 0
  r = np.exp(logp - beh)
  c = np.exp(old - beh)
  high = counted & (r > c + 0.2) & (adv > 0)
  low = counted & (r < c - 0.2) & (adv < 0)
  clipped_off = (high | low)[7]
  assert 0 < clipped_off.sum() < 16, np.round(r[7], 2)  # some in, some out

  graphdef, params, rest = ts.split_trainable(learner.module())
  totals = ts.batch_totals_of(loss_fn)(jax.tree.map(jnp.asarray, batch))

  def grad_without(token):
    """Gradient with the replayed row's token ``token`` out of the mask
    (the normalisers kept: those of the full batch)."""
    mask = batch.loss_mask.copy()
    if token is not None:
      mask[7, token] = 0.0
    b = jax.tree.map(jnp.asarray, batch._replace(loss_mask=mask))
    f = lambda p: loss_fn(nnx.merge(graphdef, p, rest), b, None, totals=totals)[
        0
    ]
    return jax.tree.leaves(jax.grad(f)(params))

  full = grad_without(None)
  out_token = np.flatnonzero(clipped_off)[0]
  in_token = np.flatnonzero(counted[7] & ~clipped_off)[0]
  for a, b in zip(full, grad_without(out_token)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(
      not np.array_equal(np.asarray(a), np.asarray(b))
      for a, b in zip(full, grad_without(in_token))
  )

  second = learner.train(batch, jax.random.key(1))
  n_off = counted[7].sum()
  n_on = counted[:7].sum()
  expected = {
      "clip_frac_off_high": high[7].sum() / n_off,
      "clip_frac_off_low": low[7].sum() / n_off,
      "clip_frac_off": clipped_off.sum() / n_off,
      "clip_frac_on_high": high[:7].sum() / n_on,
      "clip_frac_on_low": low[:7].sum() / n_on,
  }
  for k, v in expected.items():
    np.testing.assert_allclose(second[k], v, atol=1e-6, err_msg=k)
  assert second["clip_frac_off"] > 0
