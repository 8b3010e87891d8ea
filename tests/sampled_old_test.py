"""pi_old of fresh rows from the in-process engine's sampling log-probs
(``algo.recompute_old_logprobs=False``, update.py): equal to the learner's
recomputed pi_old within numerics, on 1 and on 8 devices alike; replayed
rows keep the learner's pass.

Three toy runs of the base algorithm from the same random start, one A
step each, built once for the module: one device with pi_old from
sampling (the default) and recomputed (the key), and 8 fake devices
(data x 8) from sampling."""

import dataclasses

import numpy as np
import pytest

from configs import toy_grpo
from rspo_e2e_test import MICRO
from rspo_jax import build, update
from rspo_jax.types import POLICY_A

TOY = (
    MICRO + ",rspo=0,steps=1,sft.enabled=False,train.batch_tasks=2,"
    "env.max_steps=2,rollout.max_new_tokens=8,train.lr=1e-3"
)
# |sampled - recomputed| on a response token: float32 on CPU, the engine's
# KV-cache attention against the learner's full-sequence pass.
NUMERICS = 2e-5


def _build(tmp_dir, shape, extra=""):
  cfg = toy_grpo.get_config(TOY + extra)
  with cfg.unlocked():
    cfg.mesh.shape = shape
  return build.build_run(cfg, str(tmp_dir), progress=False)


def _one_a_step(run):
  """A's first step; (its metrics, [(batch, metrics)] of its updates)."""
  t = run.trainer
  seen, train = [], t.a.train

  def spy(batch, rng):
    m = train(batch, rng)
    seen.append((batch, m))
    return m

  t.a.train = spy
  t.state.phase = "A"
  return t.a_step(), seen


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  made = {}
  try:
    for name, shape, extra in (
        ("sampled", (1, 1, 1), ""),
        ("recomputed", (1, 1, 1), ",algo.recompute_old_logprobs=True"),
        ("sharded", (-1, 1, 1), ""),
    ):
      run = _build(tmp_path_factory.mktemp(name), shape, extra)
      made[name] = (run, *_one_a_step(run))
    yield made
  finally:
    for run, _, _ in made.values():
      run.close()


def _fresh(batch):
  return (np.asarray(batch.loss_mask) > 0) & ~np.asarray(
      batch.is_offpolicy, bool
  )[:, None]


def test_the_key_defaults_to_sampling_with_the_in_process_engine():
  cfg = toy_grpo.get_config()
  assert cfg.algo.recompute_old_logprobs is False
  assert cfg.rollout.engine == "jax"


def test_sampled_pi_old_is_the_recomputed_one_within_numerics(runs):
  """The same collection (same start, same seeds) trains on 1 device with
  pi_old from sampling and recomputed: the first update's pi_old agrees
  on every fresh token, its ratio pi_theta / pi_old is 1 within numerics,
  and only the recomputing run ran the pass (old_logp_recomputed_frac)."""
  (_, m_s, seen_s), (_, m_r, seen_r) = runs["sampled"], runs["recomputed"]
  (a, first_s), (b, _) = seen_s[0], seen_r[0]
  np.testing.assert_array_equal(a.tokens, b.tokens)
  mask = _fresh(a)
  assert mask.sum() > 10
  old_s, old_r = np.asarray(a.old_logp), np.asarray(b.old_logp)
  np.testing.assert_array_equal(old_s[mask], np.asarray(a.behavior_logp)[mask])
  np.testing.assert_allclose(old_s[mask], old_r[mask], atol=NUMERICS)
  assert (m_s["old_logp_recomputed_frac"], m_r["old_logp_recomputed_frac"]) == (
      0.0,
      1.0,
  )
  assert abs(first_s["ratio_mean_on"] - 1) < NUMERICS


def test_sharded_equals_unsharded(runs):
  """8 devices (engine and learner rows over 'data'): the same tokens and
  the same pi_old from sampling as one device, within numerics."""
  a, b = runs["sampled"][2][0][0], runs["sharded"][2][0][0]
  np.testing.assert_array_equal(a.tokens, b.tokens)
  mask = _fresh(a)
  np.testing.assert_allclose(
      np.asarray(a.old_logp)[mask], np.asarray(b.old_logp)[mask], atol=NUMERICS
  )
  assert runs["sharded"][0].trainer.a.mesh.size == 8


def test_replayed_and_cut_rows_keep_the_learners_pass(runs):
  """Rows marked replayed, and a row longer than the learner's length,
  get the learner's pi_old; the others their sampling log-probs."""
  run = runs["sampled"][0]
  t = run.trainer
  records, _ = t.collect_groups(t.a, 1, POLICY_A)
  n = len(records)
  off = np.arange(n) % 2 == 1
  rows = update.Rows(records, off, np.zeros(n, np.float32), None)
  updater = t.updater
  np.testing.assert_array_equal(updater.needs_old_pass(rows), off)
  idx = np.arange(n)
  batch = t.batches.build(records, np.zeros(n), off)
  full = t.batches.apply(t.a, batch)
  got = updater._old_logp(
      t.a,
      rows,
      idx,
      batch,  # pylint: disable=protected-access
      updater.needs_old_pass(rows),
      True,
  )
  mask = np.asarray(batch.loss_mask) > 0
  for i in range(n):
    want = full[i] if off[i] else np.asarray(batch.behavior_logp)[i]
    tol = 1e-6 if off[i] else NUMERICS
    np.testing.assert_allclose(got[i][mask[i]], want[mask[i]], atol=tol)
    np.testing.assert_allclose(got[i][mask[i]], full[i][mask[i]], atol=NUMERICS)
  long = dataclasses.replace(
      records[0], prompt_ids=np.zeros(updater.max_len, np.int32)
  )  # + its response: cut to max_len
  cut = update.Rows(
      [long, records[0]], np.zeros(2, bool), np.zeros(2, np.float32), None
  )
  assert updater.needs_old_pass(cut).tolist() == [True, False]
