"""Numerics: float32 master weights and optimizer state, bf16 compute,
float32 gradient sums; bf16 copies for pi_ref, the rollout engine, exports.

Why it matters: an AdamW step at lr 1e-6 moves a weight w by ~1e-6, below
half a bf16 ulp of |w| >= 2^-11 (ulp(2^-6) = 2^-13 ~ 1.2e-4), so bf16
weights ~N(0, 0.02) almost all stay put; float32 ones all move.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from configs import alfworld_gigpo
from configs.mesh import gpu8
from rspo_jax import build, models, plan, sharding, train_step as ts
from rspo_jax.learner import Learner
from rspo_jax.models import transformer as tfm
from rspo_jax.rollout.jax_engine import JaxEngine
from rspo_jax.types import Batch

RULES = sharding.DEFAULT_RULES
F32, BF16 = jnp.dtype("float32"), jnp.dtype("bfloat16")
_fwd = nnx.jit(lambda m, i, p, a: m(i, p, a))


def micro_cfg(**kw):
  shape = dict(
      vocab_size=128,
      num_layers=2,
      hidden_size=64,
      intermediate_size=128,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
  )
  return models.get_model_config("tiny", **{**shape, **kw})


def sft_batch(rows=8, length=24, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, 128, size=(rows, length)).astype(np.int32)
  attn = np.ones((rows, length), np.int32)
  loss_mask = np.zeros((rows, length), np.float32)
  loss_mask[:, 12:] = 1.0
  positions = np.tile(np.arange(length, dtype=np.int32), (rows, 1))
  z = np.zeros((rows, length), np.float32)
  return Batch(
      tokens=tokens,
      positions=positions,
      attention_mask=attn,
      loss_mask=loss_mask,
      advantages=z,
      old_logp=z,
      ref_logp=z,
      behavior_logp=z,
      returns=z,
      old_values=z,
      is_offpolicy=np.zeros(rows, bool),
  )


def param_leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def walk_eqns(jaxpr):
  """Every equation of a (closed) jaxpr, sub-jaxprs included."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  for eqn in jaxpr.eqns:
    yield eqn
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
          yield from walk_eqns(sub)


def loop_carries(jaxpr):
  """Avals of the loop-carried values of every scan / while loop."""
  out = []
  for eqn in walk_eqns(jaxpr):
    if eqn.primitive.name == "scan":
      start = eqn.params["num_consts"]
      carry = eqn.invars[start : start + eqn.params["num_carry"]]
    elif eqn.primitive.name == "while":
      carry = eqn.invars[
          eqn.params["cond_nconsts"] + eqn.params["body_nconsts"] :
      ]
    else:
      continue
    out += [v.aval for v in carry]
  return out


# --------------------------------------------------------------------------
# a. One AdamW step at lr 1e-6 under bf16 compute moves every fp32 master
# --------------------------------------------------------------------------


def one_step(param_dtype):
  """(fraction of weights changed by one step, learner, batch)."""
  cfg = micro_cfg(dtype="bfloat16", param_dtype=param_dtype)
  mesh = sharding.make_mesh((1, 1, 1))
  learner = Learner(
      models.create_model(cfg, seed=0),
      ts.make_optimizer(1e-6),
      ts.make_sft_loss(0.0),
      mesh=mesh,
      rules=RULES,
      micro_batch_rows=4,
  )
  before = param_leaves(learner.params)
  batch = sft_batch()
  metrics = learner.train(batch, jax.random.key(0))
  assert np.isfinite(metrics["loss"]) and learner.step == 1
  after = param_leaves(learner.params)
  changed = sum(int((a != b).sum()) for a, b in zip(before, after))
  total = sum(a.size for a in before)
  return changed / total, learner, batch


def test_bf16_compute_step_moves_every_fp32_master():
  frac, learner, batch = one_step("float32")
  assert frac >= 0.99, frac
  assert {x.dtype for x in jax.tree.leaves(learner.params)} == {F32}
  # Adam's m and v follow the float32 params.
  moments = [x for x in jax.tree.leaves(learner.state.opt_state) if x.ndim > 0]
  assert moments and {x.dtype for x in moments} == {F32}
  # The micro-batch gradient sums (8 rows in 2 micro-batches of 4) are
  # loop-carried float32 arrays of the params' shapes.
  (step_fn,) = learner._steps.values()
  carries = loop_carries(
      jax.make_jaxpr(step_fn)(learner.state, batch, jax.random.key(0))
  )
  shapes = {x.shape for x in jax.tree.leaves(learner.params)}
  sums = [a for a in carries if a.shape in shapes and a.ndim >= 1]
  assert len(sums) >= len(jax.tree.leaves(learner.params))
  assert {a.dtype for a in sums} == {F32}


def test_bf16_params_lose_the_same_step():
  """The control: with bf16 masters (and so bf16 Adam moments) the same
  step moves only the few weights with |w| below ~2^-11."""
  frac, learner, _ = one_step("bfloat16")
  assert frac < 0.5, frac
  assert {x.dtype for x in jax.tree.leaves(learner.params)} == {BF16}


# --------------------------------------------------------------------------
# b. A bf16 checkpoint loads as fp32 masters computing in bf16
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
  """A tiny model exported in its compute dtype (bf16), the default."""
  cfg = micro_cfg(dtype="bfloat16")
  assert cfg.param_dtype == "float32"
  model = models.create_model(cfg, seed=3)
  path = str(tmp_path_factory.mktemp("bf16_ckpt"))
  models.save_hf_model(model, cfg, path)
  return cfg, model, path


def test_export_defaults_to_the_compute_dtype(bf16_checkpoint, tmp_path):
  cfg, model, path = bf16_checkpoint
  tensors = load_file(os.path.join(path, "model.safetensors"))
  assert {t.dtype for t in tensors.values()} == {BF16}
  hf = json.load(open(os.path.join(path, "config.json")))
  assert hf["torch_dtype"] == hf["dtype"] == "bfloat16"
  # float32 exports stay possible, and keep the masters exactly.
  models.save_hf_model(model, cfg, str(tmp_path), dtype="float32")
  assert json.load(open(tmp_path / "config.json"))["dtype"] == "float32"
  _, exact = models.load_hf_model(str(tmp_path))
  for a, b in zip(
      param_leaves(nnx.state(model, nnx.Param)),
      param_leaves(nnx.state(exact, nnx.Param)),
  ):
    assert b.dtype == F32
    np.testing.assert_array_equal(a, b)


def test_bf16_checkpoint_loads_fp32_masters_with_bf16_compute(bf16_checkpoint):
  cfg, model, path = bf16_checkpoint
  cfg2, loaded = models.load_hf_model(path, dtype="bfloat16")
  assert (cfg2.dtype, cfg2.param_dtype) == ("bfloat16", "float32")
  masters = param_leaves(nnx.state(loaded, nnx.Param))
  assert {a.dtype for a in masters} == {F32}
  # The masters hold the file's bf16 values exactly.
  for a, b in zip(param_leaves(nnx.state(model, nnx.Param)), masters):
    np.testing.assert_array_equal(a.astype(BF16).astype(F32), b)
  ids = jnp.asarray(
      np.random.default_rng(0).integers(0, 128, (2, 9)), jnp.int32
  )
  pos = jnp.tile(jnp.arange(9, dtype=jnp.int32), (2, 1))
  mask = jnp.ones((2, 9), jnp.int32)
  logits, hidden, _ = _fwd(loaded, ids, pos, mask)
  assert hidden.dtype == BF16 and logits.dtype == F32
  # Every matmul (projections, attention, MLP, LM head) takes bf16 inputs;
  # attention scores and logits accumulate in float32.
  jaxpr = jax.make_jaxpr(lambda: loaded(ids, pos, mask))()
  dots = [e for e in walk_eqns(jaxpr) if e.primitive.name == "dot_general"]
  assert len(dots) >= 2 * 9 + 1  # per layer: q k v o, 2 attn, 3 MLP
  for e in dots:
    assert {v.aval.dtype for v in e.invars} == {BF16}, e
  # An inference-only server may keep bf16 weights.
  _, server = models.load_hf_model(
      path, dtype="bfloat16", param_dtype="bfloat16"
  )
  assert {a.dtype for a in param_leaves(nnx.state(server, nnx.Param))} == {BF16}


def test_config_names_its_dtypes():
  assert micro_cfg().inference_dtype == "float32"
  assert micro_cfg(dtype="bfloat16").inference_dtype == "bfloat16"
  assert micro_cfg(param_dtype="bfloat16").inference_dtype == "bfloat16"
  assert micro_cfg(dtype=jnp.bfloat16).dtype == "bfloat16"
  with pytest.raises(ValueError, match="ModelConfig.dtype 'bf16'"):
    micro_cfg(dtype="bf16")


# --------------------------------------------------------------------------
# The run as build.py makes it: masters, pi_ref, engine
# --------------------------------------------------------------------------


def paper_cfg(checkpoint_dir=""):
  cfg = alfworld_gigpo.get_config("model=qwen2.5-1.5b")
  with cfg.unlocked():
    cfg.mesh.update(gpu8.get_config())
    cfg.model.checkpoint_dir = checkpoint_dir
  return cfg


def test_build_loads_masters_and_bf16_inference_copies(bf16_checkpoint):
  _, _, path = bf16_checkpoint
  cfg = paper_cfg(path)
  assert cfg.model.dtype == "bfloat16"
  mesh = sharding.make_mesh((1, 1, 1))
  mcfg, module = build.warm_started_policy(cfg, None, path, mesh, "unused")
  assert (mcfg.dtype, mcfg.param_dtype, mcfg.remat) == (
      "bfloat16",
      "float32",
      "full",
  )  # model.remat=auto, no plan: full
  policy = build.make_policy_learner(
      cfg, module, mesh, lr=1e-6, loss_fn=ts.make_sft_loss(0.0)
  )
  ref = build.inference_params(policy.params, mcfg, policy.state_sh.params)
  assert {x.dtype for x in jax.tree.leaves(ref)} == {BF16}
  assert {x.dtype for x in jax.tree.leaves(policy.params)} == {F32}
  # pi_ref's bf16 copy gives exactly the masters' log-probs (the forward
  # rounds every weight to bf16 anyway), and survives training (donation).
  batch = sft_batch()
  want = policy.apply(batch)
  np.testing.assert_array_equal(policy.apply(batch, params=ref), want)
  policy.train(batch, jax.random.key(0))
  np.testing.assert_array_equal(policy.apply(batch, params=ref), want)
  # The in-process engine holds bf16 weights and casts syncs to them (in
  # the unrolled layout: the paper's policy scans its layers).
  assert mcfg.scan_layers
  engine = JaxEngine(
      build.inference_model(policy.module(), mcfg),
      build.engine_config(mcfg),
      pad_id=0,
      eos_ids=[2],
  )
  assert {x.dtype for x in jax.tree.leaves(engine._params)} == {BF16}
  engine.update_weights(build.engine_params(policy.params, mcfg), 1)
  got = param_leaves(engine._params)
  assert {x.dtype for x in got} == {BF16}
  for a, b in zip(param_leaves(tfm.unrolled_state(policy.params)), got):
    np.testing.assert_array_equal(a.astype(BF16), b)


def test_cpu_run_stays_float32():
  cfg = alfworld_gigpo.get_config()
  mcfg = build.model_config(cfg, list(range(100)))
  assert (mcfg.dtype, mcfg.param_dtype, mcfg.inference_dtype) == (
      "float32",
      "float32",
      "float32",
  )


# --------------------------------------------------------------------------
# c. The plan prints the dtypes the run uses, and counts their bytes
# --------------------------------------------------------------------------


def test_plan_reports_the_dtypes():
  p = plan.make_plan(paper_cfg(), "w", {})
  assert p["dtype"] == {
      "params": "float32",
      "optimizer_state": "float32",
      "grad_accumulation": "float32",
      "compute": "bfloat16",
      "reference": "bfloat16",
      "engine": "bfloat16",
      "export": "bfloat16",
      "remat": "none",
      "scan_layers": True,  # the plan's choice: 1.5B
  }  # fits without remat
  mcfg = plan.plan_model_config(paper_cfg())
  n, gb = mcfg.num_params(), 1024**3
  mem = plan.memory_per_device(paper_cfg(), mcfg, (1, 8, 1))
  # Masters, Adam m and v in float32 over 8 devices (the gradients are the
  # train step's transient); pi_ref's bf16 copy over 8; the engine's bf16
  # weights whole on each of them (split over 'tensor' only).
  assert mem["policy_A_GB"] == pytest.approx(12 * n / 8 / gb)
  assert mem["grads_GB"] == pytest.approx(2 * 4 * n / 8 / gb)  # + the sum
  assert mem["ref_GB"] == pytest.approx(2 * n / 8 / gb)
  assert mem["engine_weights_GB"] == pytest.approx(2 * n / gb)
  # model.param_dtype: the one key that changes the masters.
  cfg = paper_cfg()
  with cfg.unlocked():
    cfg.model.param_dtype = "bfloat16"
  p = plan.make_plan(cfg, "w", {})
  assert p["dtype"]["params"] == p["dtype"]["optimizer_state"] == "bfloat16"
  mem = plan.memory_per_device(cfg, plan.plan_model_config(cfg), (1, 8, 1))
  assert mem["policy_A_GB"] == pytest.approx(6 * n / 8 / gb)
  # CPU recipe: float32 throughout; an SGLang engine loads the exports.
  cpu = alfworld_gigpo.get_config(
      "rollout.engine=sglang," "rollout.server_urls=http://a:1"
  )
  assert set(
      plan.make_plan(
          cpu, "w", {"RSPO_NUM_HOSTS": "1", "RSPO_DEVICES_PER_HOST": "1"}
      )["dtype"].values()
  ) == {"float32", "none", False}
