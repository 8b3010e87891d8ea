"""B's distance from A on replayed tokens (update.replay_divergence), by
hand: mean, max, median, the k3 estimate of KL(pi_B || pi_old) and the
share of tokens with |log c| > 0.2."""

import math

import numpy as np
import pytest

from rspo_jax import update
from rspo_jax.types import Batch


def _batch(old, behavior, loss_mask, off):
  z = np.zeros_like(np.asarray(old, np.float32))
  return Batch(
      tokens=z.astype(np.int32),
      positions=z.astype(np.int32),
      attention_mask=np.ones_like(z),
      loss_mask=np.asarray(loss_mask, np.float32),
      advantages=z,
      old_logp=np.asarray(old, np.float32),
      ref_logp=z,
      behavior_logp=np.asarray(behavior, np.float32),
      returns=z,
      old_values=z,
      is_offpolicy=np.asarray(off, bool),
  )


def test_gaps_are_replayed_response_tokens_only():
  """Row 0 replayed (tokens 0-2 counted, 3 padding), row 1 fresh: only
  row 0's three counted tokens, g = behaviour - old."""
  old = [[-1.0, -2.0, -0.5, -9.0], [-1.0, -1.0, -1.0, -1.0]]
  beh = [[-0.5, -2.5, -0.5, 0.0], [-3.0, -3.0, -3.0, -3.0]]
  mask = [[1, 1, 1, 0], [1, 1, 1, 1]]
  g = update._behavior_gaps(_batch(old, beh, mask, [True, False]))
  np.testing.assert_allclose(g, [0.5, -0.5, 0.0])


def test_divergence_hand_values():
  """g = (0.5, -0.5, 0, 1.0): mean 0.25, max 1.0, median 0.25, big |g| >
  0.2 on 3 of 4; k3 = mean(exp(-g) - 1 + g)."""
  g = np.array([0.5, -0.5, 0.0, 1.0])
  m = update.replay_divergence(g)
  k3 = (
      (math.exp(-0.5) - 1 + 0.5)
      + (math.exp(0.5) - 1 - 0.5)
      + 0.0
      + (math.exp(-1.0) - 1 + 1.0)
  ) / 4
  assert m == pytest.approx(
      {
          "replay_logp_b_minus_old": 0.25,
          "replay_logp_b_minus_old_max": 1.0,
          "replay_logp_b_minus_old_median": 0.25,
          "replay_kl_b_old_k3": k3,
          "replay_log_c_big_frac": 0.75,
      }
  )
  assert k3 == pytest.approx(0.15578, abs=1e-5)  # (0.1065+0.1487+0+0.3679)/4


def test_k3_is_zero_only_when_b_equals_a_and_clamps():
  """B = A on every token: every metric 0. A huge gap is clamped at 20
  nats in k3 (exp(20) - 1 - 20 per such token), the raw max kept."""
  assert update.replay_divergence(np.zeros(5))["replay_kl_b_old_k3"] == 0.0
  m = update.replay_divergence(np.array([-50.0]))
  assert m["replay_kl_b_old_k3"] == pytest.approx(math.exp(20) - 21)
  assert m["replay_logp_b_minus_old_max"] == -50.0


def test_no_replayed_tokens_gives_no_metrics():
  assert update.replay_divergence(np.zeros(0)) == {}
