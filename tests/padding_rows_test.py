"""No zero-length row reaches an attention kernel (issue 37, item 2).

Every path that adds all-zero padding rows -- ``records_to_batch`` (rows
up to a bucket), the train step's ``split_micro`` (rows up to a multiple of
the micro-batches), the log-prob pass's ``chunked`` (rows up to whole
chunks) and ``host_batches.empty_batch`` (a host without rows) -- is run
through a learner whose ``jax.nn.dot_product_attention`` behaves as cuDNN's
fused kernel has before 9.25 (cudnn-frontend issue 943): a row given
``key_value_seq_lengths = 0`` comes back NaN. The lengths the kernel
receives are recorded (all >= 1), and the log-probs of the real rows, the
loss, the metrics and the update equal those of the 'plain' attention path
(scores from einsums and a dense mask, no kernel): what the kernel path
gave before the clamp, padding rows counting nothing either way.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rspo_jax import batching, host_batches, models, sharding
from rspo_jax import train_step as ts
from rspo_jax.learner import Learner
from rspo_jax.types import StepRecord

RULES = sharding.DEFAULT_RULES
LOSS = ts.PolicyLossConfig(alpha=0.25, kl_coef=0.01, entropy_coef=0.001)
CFG = models.get_model_config(
    "tiny",
    vocab_size=128,
    num_layers=2,
    hidden_size=64,
    intermediate_size=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
)


@pytest.fixture
def nan_kernel(monkeypatch):
  """``jax.nn.dot_product_attention`` as cuDNN's before 9.25: NaN rows for
  a zero length. Returns the list of every call's smallest length."""
  real = jax.nn.dot_product_attention
  seen = []

  def kernel(q, k, v, *args, key_value_seq_lengths=None, **kw):
    out = real(
        q, k, v, *args, key_value_seq_lengths=key_value_seq_lengths, **kw
    )
    lengths = key_value_seq_lengths
    jax.debug.callback(lambda n: seen.append(int(np.min(n))), lengths)
    return jnp.where((lengths == 0)[:, None, None, None], jnp.nan, out)

  monkeypatch.setattr(jax.nn, "dot_product_attention", kernel)
  return seen


def learner(attention, micro_batch_rows=0):
  cfg = dataclasses.replace(CFG, attention=attention)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  return Learner(
      models.create_model(cfg, seed=0),
      optax.sgd(1.0),
      ts.make_policy_loss(LOSS),
      mesh=mesh,
      rules=RULES,
      micro_batch_rows=micro_batch_rows,
  )


def records(n, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    p, r = 5 + 3 * i, 4 + i
    out.append(
        StepRecord(
            task_id=0,
            group_id=0,
            traj_id=i,
            step_idx=0,
            prompt_ids=rng.integers(1, 128, p).astype(np.int32),
            response_ids=rng.integers(1, 128, r).astype(np.int32),
            behavior_logp=(-4.0 + 0.1 * rng.normal(size=r)).astype(np.float32),
        )
    )
  return out


def batch_of(n_records, row_multiple):
  batch = batching.records_to_batch(
      records(n_records),
      np.linspace(-1.0, 1.0, n_records),
      is_offpolicy=[i % 2 == 1 for i in range(n_records)],
      length_multiple=16,
      row_multiple=row_multiple,
  )
  # pi_old near the behaviour: ratios near 1, gradients not all clipped.
  return batch._replace(
      old_logp=batch.behavior_logp - 0.02, ref_logp=batch.behavior_logp - 0.05
  )


def update(learner_, batch, apply=True):
  """(log-probs or None, metrics, parameter change) of one apply (if
  ``apply``) and one SGD step."""
  logp = learner_.apply(batch) if apply else None
  before = jax.device_get(learner_.params)
  metrics = learner_.train(batch, jax.random.key(0))
  after = jax.device_get(learner_.params)
  delta = jax.tree.map(
      lambda a, b: np.asarray(a) - np.asarray(b), after, before
  )
  return logp, metrics, delta


# (records, batch rows bucket, micro_batch_rows, run the log-prob pass):
# which padding each adds. (One compiled program fewer where another path
# covers it: the tests compile 2 x 2 or 2 x 1 programs.)
PATHS = {
    # 3 rows bucketed to 8: 5 padding rows in one train step.
    "records_to_batch": (3, 8, 0, False),
    # 3 rows, micro-batches of 2: split_micro pads a 4th row, and the
    # log-prob pass runs 2 chunks (chunked pads likewise).
    "split_micro_and_chunked": (3, 1, 2, True),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_padding_rows_reach_kernels_with_length_one(path, nan_kernel):
  n, row_multiple, micro, apply = PATHS[path]
  batch = batch_of(n, row_multiple)
  logp, metrics, delta = update(learner("xla", micro), batch, apply)
  assert nan_kernel and min(nan_kernel) >= 1, nan_kernel
  want_logp, want_metrics, want_delta = update(
      learner("plain", micro), batch, apply
  )
  assert metrics["skipped"] == 0.0
  if apply:
    np.testing.assert_allclose(logp[:n], want_logp[:n], atol=1e-5)
  assert set(metrics) == set(want_metrics)
  for k, v in want_metrics.items():
    np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
  for a, b in zip(jax.tree.leaves(delta), jax.tree.leaves(want_delta)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_empty_batch_updates_nothing(nan_kernel):
  """A host without rows feeds padding only: a finite step (not skipped)
  that changes nothing."""
  batch = host_batches.empty_batch(8, 16)
  _, metrics, delta = update(learner("xla"), batch, apply=False)
  assert nan_kernel and min(nan_kernel) >= 1, nan_kernel
  assert metrics["skipped"] == 0.0 and metrics["loss"] == 0.0
  for leaf in jax.tree.leaves(delta):
    assert not np.any(leaf)
