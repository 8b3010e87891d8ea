"""HostBatches.apply by length (rspo_jax/host_batches.py) equals one pass
over the whole batch wherever the loss reads it."""

from types import SimpleNamespace

import jax
import numpy as np

from rspo_jax import batching, host_batches, models, sharding, train_step as ts
from rspo_jax import warm_start
from rspo_jax.learner import Learner
from rspo_jax.types import StepRecord
from train_step_test import RULES, tiny_cfg

CFG = SimpleNamespace(
    train=SimpleNamespace(micro_batch_rows=0),
    rollout=SimpleNamespace(max_prompt_tokens=200, max_new_tokens=16),
)


def records(n=37, seed=0):
  """Prompts of 4 to 180 tokens, replies of 2 to 12."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    p, r = int(rng.integers(4, 181)), int(rng.integers(2, 13))
    out.append(
        StepRecord(
            task_id=i,
            group_id=i,
            traj_id=i,
            step_idx=0,
            prompt_ids=rng.integers(1, 128, p).astype(np.int32),
            response_ids=rng.integers(1, 128, r).astype(np.int32),
            behavior_logp=np.zeros(r, np.float32),
        )
    )
  return out


def test_apply_by_length_equals_one_pass_on_the_loss_mask():
  learner = Learner(
      models.create_model(tiny_cfg(), seed=0),
      ts.make_optimizer(1e-3),
      ts.make_policy_loss(ts.PolicyLossConfig()),
      mesh=sharding.make_mesh((-1, 1, 1)),
      rules=RULES,
  )
  recs = records()
  grouped = host_batches.HostBatches(CFG, False, apply_group_rows=8)
  whole = host_batches.HostBatches(CFG, False, apply_group_rows=0)
  batch = whole.build(recs, np.ones(len(recs)), np.zeros(len(recs), bool))
  assert batch.tokens.shape == (48, 192)  # 37 rows -> 48; 192 = 1.5 x 128
  calls = []
  apply = learner.apply
  learner.apply = lambda b, params=None: calls.append(b.tokens.shape) or (
      apply(b, params=params)
  )
  got = grouped.apply(learner, batch)
  want = whole.apply(learner, batch)
  # 37 rows with tokens: 5 length-sorted chunks of 7-8 rows (padded to 8),
  # each cut to its own length bucket; the 11 padding rows are not run.
  assert len(calls) == 6 and calls[-1] == (48, 192)
  widths = [w for _, w in calls[:5]]
  assert all(r == 8 for r, _ in calls[:5]) and widths == sorted(widths)
  assert widths[0] < 192
  mask = batch.loss_mask > 0
  assert got.shape == want.shape
  np.testing.assert_allclose(got[mask], want[mask], atol=1e-5)
  np.testing.assert_array_equal(got[37:], 0.0)
  assert np.all(np.isfinite(got[mask])) and np.any(got[mask] != 0)


def test_apply_chunks_are_not_padded_to_the_micro_batch():
  """With ``micro_batch_rows = 32`` (training batches padded to 32 rows)
  the by-length chunks of 16 rows run as 16 rows, not 32 (the training
  batch's multiple doubled the forward's work), and still equal one pass."""
  learner = Learner(
      models.create_model(tiny_cfg(), seed=0),
      ts.make_optimizer(1e-3),
      ts.make_policy_loss(ts.PolicyLossConfig()),
      mesh=sharding.make_mesh((-1, 1, 1)),
      rules=RULES,
      micro_batch_rows=32,
  )
  cfg = SimpleNamespace(
      train=SimpleNamespace(micro_batch_rows=32), rollout=CFG.rollout
  )
  recs = records(n=37, seed=1)
  grouped = host_batches.HostBatches(cfg, False, apply_group_rows=16)
  whole = host_batches.HostBatches(cfg, False, apply_group_rows=0)
  batch = whole.build(recs, np.ones(len(recs)), np.zeros(len(recs), bool))
  assert batch.tokens.shape[0] == 48  # batching.length_bucket(37, 32)
  calls = []
  apply = learner.apply
  learner.apply = lambda b, params=None: calls.append(b.tokens.shape) or (
      apply(b, params=params)
  )
  got = grouped.apply(learner, batch)
  # 37 rows with tokens: 3 chunks of 12-13 rows, each padded to 16.
  assert [r for r, _ in calls] == [16, 16, 16]
  want = whole.apply(learner, batch)
  mask = batch.loss_mask > 0
  np.testing.assert_allclose(got[mask], want[mask], atol=1e-5)


def test_batches_divide_over_a_mesh_whose_row_ways_do_not_divide_8():
  """A 6-way data mesh: 5 records bucket to 8 rows, which 6 devices cannot
  split (jax raises IndivisibleError on the sharded input), so ``build``
  pads them to 12 (zero-mask rows); the step's loss, gradient norm and
  log-probs equal those of one device on the same rows."""

  def learner(mesh):
    return Learner(
        models.create_model(tiny_cfg(), seed=0),
        ts.make_optimizer(1e-3),
        ts.make_policy_loss(ts.PolicyLossConfig()),
        mesh=mesh,
        rules=RULES,
    )

  six = learner(sharding.make_mesh((6, 1, 1)))
  one = learner(sharding.make_mesh((1, 1, 1)))
  assert six.row_ways == 6
  recs = records(n=5, seed=2)
  adv = np.linspace(-1.0, 1.0, 5)
  off = np.zeros(5, bool)
  batch = host_batches.HostBatches(CFG, False, row_ways=6).build(recs, adv, off)
  assert batch.tokens.shape[0] == 12
  np.testing.assert_array_equal(batch.loss_mask[5:], 0)
  ref = host_batches.HostBatches(CFG, False).build(recs, adv, off)
  assert ref.tokens.shape[0] == 8
  mask = ref.loss_mask > 0
  np.testing.assert_allclose(
      six.apply(batch)[:8][mask], one.apply(ref)[mask], atol=1e-5
  )
  rng = jax.random.key(0)
  got, want = six.train(batch, rng), one.train(ref, rng)
  for k in ("loss", "grad_norm"):
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
  # A bucket that is not a multiple of its own minimum: 20 rows bucket to
  # 24 with row_multiple 16, which 16 devices cannot split: 32.
  assert batching.length_bucket(20, 16) == 24
  assert (
      batching.records_to_batch(
          records(n=20), np.zeros(20), row_multiple=16, row_ways=16
      ).tokens.shape[0]
      == 32
  )
  # Behaviour cloning's batches (warm_start.train_sft) divide over 6 too.
  sft = Learner(
      models.create_model(tiny_cfg(), seed=0),
      ts.make_optimizer(1e-3),
      ts.make_sft_loss(0.0),
      mesh=sharding.make_mesh((6, 1, 1)),
      rules=RULES,
  )
  curve = warm_start.train_sft(
      sft, recs, steps=1, batch_rows=5, seed=0, progress=False
  )
  assert len(curve) == 1 and np.isfinite(curve[0])


def test_critic_reads_and_learns_the_value_before_each_response_token():
  """Row s with prompt length p and n response tokens: the critic's value
  of token j's state is read at position p + j - 1 (verl's ``values[:,
  -R - 1:-1]``), and ``value_batch`` regresses exactly those positions to
  the row's return, with the step's values as the clip centre; per-token
  advantages land on the response tokens."""
  recs = records(3, seed=1)
  adv = [
      np.arange(len(r.response_ids), dtype=np.float32) + 10 * i
      for i, r in enumerate(recs)
  ]
  batch = batching.records_to_batch(recs, adv, max_len=216)
  b, t = batch.tokens.shape
  x = np.arange(b * t, dtype=np.float32).reshape(b, t)
  got = batching.before_response_tokens(batch, x, 3)
  returns = np.array([1.5, -2.0, 3.0], np.float32)
  vb = host_batches.value_batch(batch, returns, got)
  for i, r in enumerate(recs):
    p, n = len(r.prompt_ids), len(r.response_ids)
    np.testing.assert_array_equal(got[i], x[i, p - 1 : p + n - 1])
    np.testing.assert_array_equal(batch.advantages[i, p : p + n], adv[i])
    want_mask = np.zeros(t, np.float32)
    want_mask[p - 1 : p + n - 1] = 1.0
    np.testing.assert_array_equal(vb.loss_mask[i], want_mask)
    np.testing.assert_array_equal(vb.returns[i], want_mask * returns[i])
    np.testing.assert_array_equal(vb.old_values[i], want_mask * x[i])
  assert not vb.loss_mask[3:].any()  # padding rows stay out
