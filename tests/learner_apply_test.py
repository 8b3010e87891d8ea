"""Learner.apply in chunks of at most train.micro_batch_rows rows (issue 16
item 6): equal to one pass over the whole batch, with bounded rows a call."""

import numpy as np
import pytest
from flax import nnx

from rspo_jax import learner as learner_lib
from rspo_jax import models, sharding, train_step as ts
from rspo_jax.learner import Learner
from train_step_test import RULES, make_batch, policy_learner, tiny_cfg


@pytest.mark.parametrize(
    "rows,max_rows,ways,expected",
    [
        (32, 0, 8, 1),  # no bound: one call
        (32, 32, 8, 1),  # the bound holds all rows
        (32, 8, 8, 4),  # 4 rows a device, 1 each call: 4 calls of 8 rows
        (48, 16, 8, 3),  # 6 a device: 3 calls of 16
        (40, 16, 8, 5),  # 5 a device (prime): 5 calls of 8 rows
        (32, 4, 8, 4),  # bound below one row a device: calls of 8 rows
        (12, 5, 8, 3),  # rows that do not split over the devices: 3 calls of 4
        (8, 3, 1, 4),  # one device: 4 calls of 2 rows
        (643, 32, 1, 21),  # a prime: 21 calls of 31 rows (8 padding), not 643
        (623, 32, 1, 20),  # 7 x 89: 20 padded calls of 32, not 89 calls of 7
        (640, 32, 1, 20),  # divides: 20 calls of 32, no padding
        (44, 12, 4, 4),  # 11 a device (prime): 4 calls of 12 (4 padding)
        (148, 30, 4, 6),  # 37 a device: 6 calls of 28 (<= 30), not 5 of 32
    ],
)
def test_apply_chunks_by_hand(rows, max_rows, ways, expected):
  assert learner_lib.apply_chunks(rows, max_rows, ways) == expected


@pytest.mark.parametrize("ways", [1, 2, 4, 8])
def test_padded_calls_keep_the_row_bound(ways):
  """Every call of every batch that splits over the devices holds whole
  rows a device and at most max(max_rows, ways) rows, the padding less
  than a call: padded calls rounded up to whole rows a device once went
  over max_rows (148 rows over 4 devices, max_rows 30: calls of 32)."""
  for rows in range(ways, 300, ways):
    for max_rows in range(1, rows + 1):
      n = learner_lib.apply_chunks(rows, max_rows, ways)
      per = learner_lib.chunk_rows(rows, n, ways)
      assert per <= max(max_rows, ways) and per % ways == 0, (
          rows,
          max_rows,
          n,
          per,
      )
      assert (n - 1) * per < rows <= n * per, (rows, max_rows, n, per)


@pytest.mark.parametrize("mesh_shape", [(1, 1, 1), (2, 2, 2)], ids=str)
def test_chunked_apply_equals_one_pass(mesh_shape):
  """32 rows in calls of 8 (2 x 2 x 2: 4 calls, 2 rows a device each) give
  the log-probs of one call on all 32 rows, for the policy with its
  response window and for a value head."""
  batch = make_batch(rows=32)
  whole = policy_learner(mesh_shape)
  parts = policy_learner(mesh_shape, micro_batch_rows=8)
  assert parts.apply_chunks(32) == 4 and whole.apply_chunks(32) == 1
  want, got = whole.apply(batch), parts.apply(batch)
  assert got.shape == want.shape == (32, 32)
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert np.any(got[batch.loss_mask > 0] != 0)
  # params= another tree with the same shardings (pi_ref's frozen copy).
  ref = whole.frozen_params()
  np.testing.assert_allclose(parts.apply(batch, params=ref), want, atol=1e-6)
  # One compiled forward per (window, chunks), shared with copies.
  assert set(parts._applies) == {(16, 4)}
  assert parts.copy()._applies is parts._applies


@pytest.mark.parametrize(
    "mesh_shape,rows,max_rows",
    [((1, 1, 1), 13, 4), ((2, 2, 2), 44, 12)],
    ids=str,
)
def test_padded_chunks_equal_one_pass(mesh_shape, rows, max_rows):
  """Rows with no good divisor (13: a prime; 44 over 4 ways: 11 a device)
  run as 4 padded calls (chunk_rows 4, 12); the zero rows' outputs are
  dropped and the rest equal one pass."""
  batch = make_batch(rows=rows)
  whole = policy_learner(mesh_shape)
  parts = policy_learner(mesh_shape, micro_batch_rows=max_rows)
  assert parts.apply_chunks(rows) == 4
  ways = learner_lib._row_ways(parts.mesh, parts.rules)  # pylint: disable=protected-access
  assert learner_lib.chunk_rows(rows, 4, ways) * 4 > rows
  want, got = whole.apply(batch), parts.apply(batch)
  assert got.shape == want.shape == (rows, 32)
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert np.all(np.isfinite(got))


def test_chunked_value_apply_equals_one_pass():
  batch = make_batch(rows=16)

  def critic(m):
    module = models.ValueModel(tiny_cfg(), rngs=nnx.Rngs(0))
    return Learner(
        module,
        ts.make_optimizer(1e-3),
        ts.make_value_loss(0.2),
        mesh=sharding.make_mesh((1, 4, 1)),
        rules=RULES,
        kind="value",
        micro_batch_rows=m,
    )

  want, got = critic(0).apply(batch), critic(4).apply(batch)
  assert got.shape == (16, 32)
  np.testing.assert_allclose(got, want, atol=1e-6)


def test_compiled_logprob_counts_a_padded_calls_rows():
  """rspo_jax/hlo.py's compiled log-prob pass reports the rows one call
  computes (its activation bounds are per call): 44 rows over 4 devices in
  4 calls are calls of 12 rows (whole rows a device), not ceil(44 / 4) =
  11, which does not split over the devices and made the bound count every
  row on every device."""
  from rspo_jax import hlo

  c = hlo.compile_logprob(
      sharding.make_mesh((1, 4, 1)), tiny_cfg(), 44, 32, n_chunks=4, rules=RULES
  )
  assert c.rows == learner_lib.chunk_rows(44, 4, 4) == 12
