"""StepUpdater.mini_batches: how a step's rows are dealt to its updates."""

import numpy as np
import pytest

from configs import webshop_grpo
from rspo_jax import host_batches, update


def _updater(**train):
  cfg = webshop_grpo.get_config()
  with cfg.unlocked():
    for key, value in train.items():
      cfg.train[key] = value
  return update.StepUpdater(
      cfg,
      host_batches.HostBatches(cfg, multihost=False),
      lambda *keys: np.random.default_rng(keys),
  )


@pytest.mark.parametrize(
    "n_on, n_off, updates",
    [(112, 16, 4), (10, 2, 3), (1, 2, 3), (14, 3, 4), (20, 0, 4)],
)
def test_each_update_gets_the_steps_replayed_share(n_on, n_off, updates):
  """Stratified: every update holds floor or ceil of n_off / updates
  replayed rows (so the alpha of its objective weighs a fair sample of
  them), every row appears once per epoch, in the same mini-batches each
  epoch, and update sizes are np.array_split's. (A plain shuffle at this
  seed gives the first case 7, 3, 0 and 6 replayed rows.)"""
  off = np.array([False] * n_on + [True] * n_off)
  epochs = _updater(
      updates_per_step=updates, mini_batch_rows=0, ppo_epochs=2
  ).mini_batches(off, step_key=7)
  assert len(epochs) == 2 and len(epochs[0]) == updates
  for a, b in zip(*epochs):
    np.testing.assert_array_equal(a, b)
  rows = np.concatenate(epochs[0])
  np.testing.assert_array_equal(np.sort(rows), np.arange(n_on + n_off))
  per_update = np.array([off[idx].sum() for idx in epochs[0]])
  assert set(per_update) <= {n_off // updates, -(-n_off // updates)}
  assert [len(idx) for idx in epochs[0]] == [
      len(c) for c in np.array_split(np.arange(n_on + n_off), updates)
  ]


def test_the_deal_is_a_shuffle_and_follows_the_step_key():
  """Different steps deal different mini-batches; one step's deal is
  reproducible (resume redoes a step with the same updates); mini-batch
  rows m gives ceil(rows / m) updates."""
  off = np.zeros(20, bool)
  updater = _updater(mini_batch_rows=6, updates_per_step=0)
  first = updater.mini_batches(off, step_key=3)[0]
  assert len(first) == 4
  again = updater.mini_batches(off, step_key=3)[0]
  other = updater.mini_batches(off, step_key=4)[0]
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(first, other))
  assert not np.array_equal(
      np.concatenate(first), np.arange(20)
  )  # not in row order
