"""model.remat's policies (none | dots | full): what the forward keeps for
the backward, and the same loss and gradients from each."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals

from rspo_jax import models

POLICIES = ("none", "dots", "full")
SHAPE = dict(
    num_layers=2,
    hidden_size=64,
    intermediate_size=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    vocab_size=256,
)


def test_policies_keep_less_in_order_and_give_the_same_loss_and_grads():
  """A 2-block tiny model. Residual bytes none > dots > full in both
  layouts, under the paper's numerics (bfloat16 compute over float32
  masters: the weight einsums are custom_vjp calls, named for 'dots') and
  in float32 (plain dots), traced on abstract weights; equal loss and
  gradients from one set of weights (float32, scanned; one program)."""
  ids = jnp.asarray(np.random.RandomState(0).randint(0, 256, (2, 8)))
  pos = jnp.tile(jnp.arange(8, dtype=jnp.int32), (2, 1))
  mask = jnp.ones((2, 8), jnp.int32)

  def loss_of(policy, **kw):
    cfg = models.get_model_config("tiny", remat=policy, **SHAPE, **kw)
    graphdef, p, rest = nnx.split(
        nnx.eval_shape(lambda: models.Transformer(cfg, rngs=nnx.Rngs(0))),
        nnx.Param,
        ...,
    )

    def loss(p, rest=rest):
      logits = nnx.merge(graphdef, p, rest)(ids, pos, mask)[0]
      return models.token_logprobs(logits, ids).mean()

    return loss, p

  for scan, dtype in (
      (True, "bfloat16"),
      (False, "bfloat16"),
      (True, "float32"),
  ):
    kept = {}
    for policy in POLICIES:
      loss, p = loss_of(policy, scan_layers=scan, dtype=dtype)
      kept[policy] = sum(
          a.size * a.dtype.itemsize for a, _ in saved_residuals(loss, p)
      )
    assert kept["none"] > kept["dots"] > kept["full"], (scan, dtype, kept)
  losses = {policy: loss_of(policy, scan_layers=True)[0] for policy in POLICIES}
  model = models.create_model(
      models.get_model_config("tiny", scan_layers=True, **SHAPE), seed=1
  )
  _, params, rest = nnx.split(model, nnx.Param, ...)
  results = jax.jit(
      lambda p, r: {k: jax.value_and_grad(f)(p, r) for k, f in losses.items()}
  )(params, rest)
  l0, g0 = results["none"]
  for policy in ("dots", "full"):
    l1, g1 = results[policy]
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
