"""cuDNN attention compiles on every shipped mesh (issue 51 items 1 and 2).

``model.attention=cudnn`` is compiled -- never run -- on the 8 fake CPU
devices with jax's own cuDNN code above the kernel (custom_vjp,
custom_partitioning and its partition callbacks) and only the kernels'
lowering stubbed (``models/cudnn_stub.py``). The train step (remat, scanned
layers, 32 rows of 64 tokens) and the log-prob pass, for

  meshes (1, 8, 1), (2, 4, 1), (1, 4, 2) x 1, 2, 4 micro-batches x LoRA off
  and on (rank 8),

and, with more devices on 'tensor' than kv heads (item 2), (1, 2, 4) with
12 heads over 2 kv heads (Qwen2.5-1.5B's) and (1, 1, 8) with 28 over 4
(Qwen2.5-7B's). Before the fix (cuDNN left to its own partitioner) the
train step failed on (2, 4, 1) with 2 micro-batches: ``'GSPMDSharding'
object has no attribute 'spec'``. The default suite compiles a subset
(``DEFAULT``); ``pytest -m slow`` the whole grid. The stubbed kernel
computes attention, so the sharded call also runs and equals XLA's
attention on one device (``test_sharded_equals_xla``).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rspo_jax import hlo
from rspo_jax import sharding as shd
from rspo_jax.models import cudnn_attention, cudnn_stub
from rspo_jax.models.config import get_model_config

MESHES = ((1, 8, 1), (2, 4, 1), (1, 4, 2))
N_MICRO = (1, 2, 4)
LORA_RANKS = (0, 8)
ROWS, LENGTH = 32, 64
# (mesh, micro-batches, LoRA rank) the default suite compiles; the rest slow.
DEFAULT = {
    ((2, 4, 1), 2, 0),
    ((2, 4, 1), 4, 8),
    ((1, 8, 1), 2, 8),
    ((1, 4, 2), 2, 0),
}
# tensor > kv heads: (mesh, heads, kv heads)
TENSOR_OVER_KV = (((1, 2, 4), 12, 2), ((1, 1, 8), 28, 4))


def model_cfg(lora_rank=0, heads=4, kv_heads=2, **kw):
  """2 scanned layers of width 128 (heads of 32), as a paper run's flags:
  float32 masters, bfloat16 compute, full remat."""
  fields = dict(
      num_layers=2,
      vocab_size=512,
      hidden_size=128,
      intermediate_size=256,
      num_heads=heads,
      num_kv_heads=kv_heads,
      head_dim=32,
      dtype="bfloat16",
      param_dtype="float32",
      remat="full",
      scan_layers=True,
      attention="cudnn",
      lora_rank=lora_rank,
  )
  return get_model_config("tiny", **{**fields, **kw})


@pytest.fixture(scope="module", autouse=True)
def stub():
  cudnn_stub.install()


def _lowered():
  return dict(cudnn_stub.lowered)


def _compile_step(mesh_shape, n_micro, lora_rank, **kw):
  """Compiles the train step; asserts the stub's forward and backward were
  lowered (cuDNN ran, not XLA's attention)."""
  before = _lowered()
  hlo.compile_train_step(
      shd.make_mesh(mesh_shape),
      model_cfg(lora_rank, **kw),
      ROWS,
      LENGTH,
      n_micro=n_micro,
      donate=False,
  )
  after = _lowered()
  assert after["fwd"] > before["fwd"] and after["bwd"] > before["bwd"]


def _compile_logprob(mesh_shape, lora_rank, **kw):
  before = _lowered()
  hlo.compile_logprob(
      shd.make_mesh(mesh_shape), model_cfg(lora_rank, **kw), ROWS, LENGTH
  )
  assert _lowered()["fwd"] > before["fwd"]


def _grid(default: bool):
  out = []
  for case in itertools.product(MESHES, N_MICRO, LORA_RANKS):
    if (case in DEFAULT) == default:
      out.append(case)
  return out


def _ids(case):
  mesh, n_micro, rank = case
  return f"{mesh}-micro{n_micro}-lora{rank}"


@pytest.mark.parametrize("case", _grid(True), ids=_ids)
def test_train_step_compiles(case):
  _compile_step(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", _grid(False), ids=_ids)
def test_train_step_compiles_full_grid(case):
  _compile_step(*case)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_logprob_compiles(mesh_shape):
  _compile_logprob(mesh_shape, 0)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_logprob_compiles_lora(mesh_shape):
  _compile_logprob(mesh_shape, LORA_RANKS[1])


@pytest.mark.parametrize(
    "mesh_shape,heads,kv_heads", TENSOR_OVER_KV, ids=lambda x: str(x)
)
def test_tensor_over_kv_heads_compiles(mesh_shape, heads, kv_heads):
  _compile_step(mesh_shape, 2, 0, heads=heads, kv_heads=kv_heads)
  _compile_logprob(mesh_shape, 0, heads=heads, kv_heads=kv_heads)


@pytest.mark.parametrize(
    "mesh_shape,heads,kv_heads",
    (((1, 2, 4), 12, 2), ((1, 1, 8), 28, 4), ((2, 4, 1), 4, 2)),
    ids=str,
)
def test_sharded_equals_xla(mesh_shape, heads, kv_heads):
  """The stubbed cuDNN attention on the mesh (kv heads repeated to
  'tensor', or whole on each device) equals XLA's on one device: random
  bfloat16 q, k, v of 8 rows with 64, 40, 1 and 1 real tokens (twice); the
  stub accumulates in float32, XLA in bfloat16: within 2 % of the largest
  output at the real queries."""
  keys = jax.random.split(jax.random.key(0), 3)
  shape = (8, LENGTH, heads, 32)
  q = jax.random.normal(keys[0], shape, jnp.bfloat16)
  k, v = (
      jax.random.normal(key, shape[:2] + (kv_heads, 32), jnp.bfloat16)
      for key in keys[1:]
  )
  lengths = jnp.array([64, 40, 1, 1] * 2, jnp.int32)
  expected = jax.nn.dot_product_attention(
      q,
      k,
      v,
      is_causal=True,
      key_value_seq_lengths=lengths,
      implementation="xla",
  )
  shard = shd.ActivationSharding(shd.make_mesh(mesh_shape))
  got = jax.jit(lambda *x: cudnn_attention.attention(*x, shard))(
      q, k, v, lengths
  )
  real = np.arange(LENGTH)[None] < np.asarray(lengths)[:, None]
  got = np.asarray(got, np.float32)[real]
  expected = np.asarray(expected, np.float32)[real]
  err = np.abs(got - expected).max() / np.abs(expected).max()
  assert err < 0.02, f"{mesh_shape}: max |cudnn - xla| / max |xla| = {err}"
