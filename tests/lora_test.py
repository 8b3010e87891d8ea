"""LoRA (rspo_jax/models/lora.py, issue 39): adapters on a frozen base.

What holds:

  * fresh adapters (B = 0): the LoRA model's logits equal its base's bit for
    bit (float32, and bfloat16 compute with the base stored in bfloat16);
  * merged weights (W + (alpha / r) A B) give the LoRA model's outputs, and
    the base's exactly at B = 0;
  * a Learner trains the adapters only: one update changes adapters and
    nothing of the base, Adam keeps moments of adapter size only, pi_ref
    (the adapters off) is the base;
  * checkpoints hold the adapters and their optimizer state (restore);
  * the PEFT directory's names, shapes and delta match the merged HF weights;
  * the train step on 8 fake devices, (1, 4, 2), moves no activation-sized
    array with LoRA on.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from safetensors.numpy import load_file

from rspo_jax import build, hlo, sharding, train_step as ts
from rspo_jax.checkpoint import RunCheckpointer
from rspo_jax.learner import Learner
from rspo_jax.models import create_model, get_model_config, hf_io, lora
from train_step_test import RULES, make_batch

RANK, ALPHA = 4, 8.0


def base_cfg(**kw):
  return get_model_config("nano", vocab_size=128, **kw)


def with_rank(cfg, rank=RANK):
  return dataclasses.replace(cfg, lora_rank=rank, lora_alpha=ALPHA)


def inputs(rows=2, length=12):
  tokens = (jnp.arange(rows * length).reshape(rows, length) * 7) % 128
  mask = jnp.ones((rows, length), jnp.int32).at[1, 9:].set(0)
  pos = jnp.maximum(jnp.cumsum(mask, 1) - 1, 0) * mask
  return tokens, pos, mask


def logits(model):
  return np.asarray(model(*inputs())[0])


def randomise_b(model, seed=1):
  """The adapters' B set to random values (a trained adapter)."""
  graphdef, state = nnx.split(model)
  key = iter(jax.random.split(jax.random.key(seed), 64))
  flat = [
      (
          p,
          v.replace(0.05 * jax.random.normal(next(key), v.value.shape))
          if p[-1] == "b" and isinstance(v, nnx.LoRAParam)
          else v,
      )
      for p, v in nnx.to_flat_state(state)
  ]
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


@pytest.fixture(scope="module")
def models_f32():
  cfg0 = base_cfg()
  base = create_model(cfg0, seed=0)
  return cfg0, base, lora.add_adapters(base, with_rank(cfg0), seed=1)


@pytest.mark.parametrize(
    "numerics",
    [dict(), dict(dtype="bfloat16"), dict(scan_layers=True)],
    ids=["f32", "bf16", "scanned"],
)
def test_fresh_adapters_equal_the_base_bit_for_bit(numerics):
  cfg0 = base_cfg(**numerics)
  base = create_model(cfg0, seed=0)
  model = lora.add_adapters(base, with_rank(cfg0), seed=1)
  frozen = nnx.state(model, lora.FrozenParam)
  want_dt = jnp.dtype(cfg0.dtype)  # the base in the compute dtype
  assert {x.dtype for x in jax.tree.leaves(frozen)} == {want_dt}
  assert {
      x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))
  } == {jnp.dtype("float32")}
  np.testing.assert_array_equal(logits(model), logits(base))


def test_merged_weights(models_f32):
  cfg0, base, model = models_f32
  cfg = with_rank(cfg0)
  # B = 0: merged = base exactly.
  cfg_m, merged = lora.merged_model(model, cfg)
  assert cfg_m == cfg0
  for a, b in zip(
      jax.tree.leaves(nnx.state(merged, nnx.Param)),
      jax.tree.leaves(nnx.state(base, nnx.Param)),
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # A trained adapter: merged weights give the LoRA model's outputs.
  trained = randomise_b(model)
  got = logits(lora.merged_model(trained, cfg)[1])
  want = logits(trained)
  assert np.abs(want - logits(base)).max() > 1e-3  # the adapters matter
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  # What the in-process engine is given: the base config's layout.
  graphdef, params, _ = build.inference_model(trained, cfg)
  assert build.engine_config(cfg).lora_rank == 0
  got = logits(nnx.merge(graphdef, params))
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_learner_trains_adapters_only(models_f32, tmp_path):
  cfg0, base, model = models_f32
  mesh = sharding.make_mesh((1, 1, 1))
  learner = Learner(
      model,
      ts.make_optimizer(1e-2),
      ts.make_policy_loss(ts.PolicyLossConfig(alpha=0.25, kl_coef=0.01)),
      mesh=mesh,
      rules=RULES,
  )
  adapters = nnx.state(model, nnx.LoRAParam)
  n_adapter = sum(x.size for x in jax.tree.leaves(adapters))
  assert jax.tree.structure(learner.params) == jax.tree.structure(adapters)
  moments = [x for x in jax.tree.leaves(learner.state.opt_state) if x.ndim > 0]
  assert sum(x.size for x in moments) == 2 * n_adapter  # Adam's mu, nu
  base_before = jax.device_get(learner.frozen)
  batch = make_batch(rows=4, length=24)
  logp0 = learner.apply(batch)
  ref = build.reference_params(learner, with_rank(cfg0))
  before = jax.device_get(learner.params)
  m = learner.train(batch, jax.random.key(0))
  assert m["skipped"] == 0.0
  # The base is an argument of the step, not a constant baked into it.
  (step,) = learner._steps.values()
  args = step.lower(learner.state, batch, jax.random.key(0)).args_info[0]
  assert len(jax.tree.leaves(args[3])) == len(jax.tree.leaves(base_before))
  after = jax.device_get(learner.params)
  for (p, b), (_, a) in zip(
      nnx.to_flat_state(before), nnx.to_flat_state(after)
  ):
    changed = not np.array_equal(np.asarray(a.value), np.asarray(b.value))
    # B moves; A's gradient is 0 while B = 0, so A waits a step.
    assert changed == (p[-1] == "b"), p
  for a, b in zip(
      jax.tree.leaves(base_before),
      jax.tree.leaves(jax.device_get(learner.frozen)),
  ):
    np.testing.assert_array_equal(a, b)
  # pi_ref = the base (adapters off): the fresh policy's log-probs.
  np.testing.assert_array_equal(learner.apply(batch, params=ref), logp0)
  assert not np.array_equal(learner.apply(batch), logp0)

  # Checkpoints: adapters + optimizer state; restored into another init.
  ckpt = RunCheckpointer(str(tmp_path / "ckpt"))
  ckpt.save(1, {"policy": learner.state}, {"a_steps": 1})
  ckpt.wait()
  other = Learner(
      lora.add_adapters(base, with_rank(cfg0), seed=7),
      ts.make_optimizer(1e-2),
      learner.loss_fn,
      mesh=mesh,
      rules=RULES,
  )
  states, _ = ckpt.restore({"policy": other.state})
  ckpt.close()
  other.state = states["policy"]
  for a, b in zip(
      jax.tree.leaves(jax.device_get(other.state)),
      jax.tree.leaves(jax.device_get(learner.state)),
  ):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(other.apply(batch), learner.apply(batch))


class _HeadAndAdapter(nnx.Module):
  """A plain weight (a critic's value head) beside an adapter."""

  def __init__(self):
    self.head = nnx.Param(jnp.ones(3))
    self.adapter = nnx.LoRAParam(jnp.ones(2))


def test_lr_multiplier_scales_adapter_steps_only():
  """One AdamW step, gradient +1 everywhere, p = 1, wd 0.1, no clipping:
  Adam's first step is m_hat / (sqrt(v_hat) + eps) = 1 / (1 + 1e-8), so

      p' = 1 - lr (1 / (1 + 1e-8) + wd),

  at lr for the plain weight, at lr x 10 for the adapter."""
  lr, wd, m = 1e-3, 0.1, 10.0
  _, params = nnx.split(_HeadAndAdapter(), nnx.Param)
  grads = jax.tree.map(jnp.ones_like, params)
  tx = ts.make_optimizer(
      lr, grad_clip=0, weight_decay=wd, adapter_lr_multiplier=m
  )
  updates, _ = tx.update(grads, tx.init(params), params)
  new = optax.apply_updates(params, updates)
  step = 1 / (1 + 1e-8) + wd
  np.testing.assert_allclose(new["head"].value, 1 - lr * step, rtol=1e-7)
  np.testing.assert_allclose(new["adapter"].value, 1 - m * lr * step, rtol=1e-7)
  # The optimizer state is AdamW's own: checkpoints keep their structure.
  plain = ts.make_optimizer(lr, grad_clip=0, weight_decay=wd)
  assert jax.tree.structure(tx.init(params)) == jax.tree.structure(
      plain.init(params)
  )


def test_lr_multiplier_on_a_lora_learner_step(models_f32):
  """A real train step of the LoRA nano model: every adapter's change
  with the multiplier 10 is 10 x its change without (B moves, A's
  gradient is 0 while B = 0)."""
  cfg0, base, _ = models_f32
  mesh = sharding.make_mesh((1, 1, 1))
  batch = make_batch(rows=4, length=24)
  deltas = []
  for m in (1.0, 10.0):
    model = lora.add_adapters(base, with_rank(cfg0), seed=1)
    learner = Learner(
        model,
        ts.make_optimizer(1e-3, adapter_lr_multiplier=m),
        ts.make_policy_loss(ts.PolicyLossConfig(alpha=0.25)),
        mesh=mesh,
        rules=RULES,
    )
    before = jax.device_get(learner.params)
    learner.train(batch, jax.random.key(0))
    after = jax.device_get(learner.params)
    deltas.append(
        jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), after, before)
    )
  moved = 0
  for d1, d10 in zip(jax.tree.leaves(deltas[0]), jax.tree.leaves(deltas[1])):
    np.testing.assert_allclose(d10, 10 * d1, rtol=1e-4, atol=1e-9)
    moved += bool(np.abs(d1).max() > 0)
  assert moved == len(jax.tree.leaves(deltas[0])) // 2  # every B


def test_lr_multiplier_rule_plan_and_validation(tmp_path):
  """The rule (lora.lr_multiplier): the key with LoRA, 1 without; the line
  the run and --dry_run show; a bad value is one line naming the key."""
  from configs import base as config_base
  from rspo_jax import plan
  from rspo_jax.errors import ConfigError

  def cfg(extra):
    return config_base.make_config("toy", "grpo", f"rspo=0,{extra}")

  assert lora.lr_multiplier(cfg("train.lr=1e-4")) == 1.0
  assert lora.lr_line(cfg("train.lr=1e-4")) == ""
  with_lora = cfg("train.lr=1e-4,model.lora_rank=4")
  assert lora.lr_multiplier(with_lora) == 10.0
  line = "lr 0.0001 x LoRA multiplier 10 = 0.001 on adapters"
  assert lora.lr_line(with_lora) == line
  assert (
      plan.make_plan(with_lora, str(tmp_path))["lora"]["learning_rate"] == line
  )
  off = cfg("train.lr=1e-4,model.lora_rank=4,train.lora_lr_multiplier=1")
  assert lora.lr_multiplier(off) == 1.0
  rspo_b = config_base.make_config(
      "toy", "grpo", "model.lora_rank=4,train.lr=1e-4,rspo.b_lr=3e-5"
  )
  assert lora.lr_line(rspo_b) == (
      line + "; B's lr 3e-05 x LoRA multiplier 10 = 0.0003 on adapters"
  )
  with pytest.raises(ConfigError) as e:
    cfg("model.lora_rank=4,train.lora_lr_multiplier=0")
  assert str(e.value) == (
      "bad config value train.lora_lr_multiplier=0.0;"
      " wants > 0 (1 = adapters at train.lr)"
  )


def test_peft_directory(models_f32, tmp_path):
  cfg0, base, model = models_f32
  cfg = with_rank(cfg0)
  trained = randomise_b(model)
  n = lora.save_peft(trained, cfg, str(tmp_path), base_model="base")
  conf = json.load(open(tmp_path / "adapter_config.json"))
  assert (conf["peft_type"], conf["r"], conf["lora_alpha"]) == (
      "LORA",
      RANK,
      ALPHA,
  )
  assert sorted(conf["target_modules"]) == sorted(
      [
          "q_proj",
          "k_proj",
          "v_proj",
          "o_proj",
          "gate_proj",
          "up_proj",
          "down_proj",
      ]
  )
  t = load_file(str(tmp_path / "adapter_model.safetensors"))
  assert len(t) == cfg.num_layers * 7 * 2
  assert n == sum(x.nbytes for x in t.values())
  pre = "base_model.model.model.layers.1."
  hf_base = hf_io.hf_tensors(base, cfg0, "float32")
  hf_merged = hf_io.hf_tensors(
      lora.merged_model(trained, cfg)[1], cfg0, "float32"
  )
  for mod in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"):
    a, b = t[pre + mod + ".lora_A.weight"], t[pre + mod + ".lora_B.weight"]
    name = f"model.layers.1.{mod}.weight"
    assert a.shape == (RANK, hf_base[name].shape[1])
    assert b.shape == (hf_base[name].shape[0], RANK)
    np.testing.assert_allclose(
        hf_merged[name] - hf_base[name], ALPHA / RANK * b @ a, atol=1e-6
    )


def test_lora_config_keys():
  import ml_collections

  c = ml_collections.ConfigDict(
      dict(
          model=dict(lora_rank=16, lora_alpha=32.0, lora_targets="q, v,down"),
          seed=0,
      )
  )
  cfg = build.lora_config(c, base_cfg())
  assert (cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets) == (
      16,
      32.0,
      ("q", "v", "down"),
  )
  c.model.lora_rank = 0
  assert build.lora_config(c, base_cfg()) == base_cfg()
  c.model.lora_rank, c.model.lora_targets = 8, "q,lm_head"
  with pytest.raises(Exception, match="lm_head"):
    build.lora_config(c, base_cfg())


def test_train_step_hlo_has_no_activation_collectives():
  """Qwen2.5-1.5B widths, 1 layer, rank 16 on (1, 4, 2): FSDP gathers of
  the base and the adapters, tensor-parallel partial sums; nothing of an
  activation's size over 'fsdp' or 'data'."""
  cfg = get_model_config(
      "qwen2.5-1.5b",
      num_layers=1,
      vocab_size=4096,
      dtype="bfloat16",
      lora_rank=16,
  )
  mesh_shape = (1, 4, 2)
  c = hlo.compile_train_step(
      sharding.make_mesh(mesh_shape), cfg, 8, 256, donate=False
  )
  _, _, base = hlo.abstract_model(cfg)
  bound = hlo.activation_bound(c, mesh_shape, cfg.hidden_size)
  assert not hlo.activation_collectives(
      c.hlo, (c.params, base), mesh_shape, bound
  )
  # The base is one bf16 copy, sharded: per device under half of it.
  n_base = sum(x.size for x in jax.tree.leaves(base))
  assert c.memory["argument"] < n_base * 2 / 2


# A toy RSPO run small enough for a test (tests/multihost_test.py's).
TOY = (
    "model.overrides=num_layers=1;hidden_size=64;intermediate_size=128;"
    "num_heads=2;num_kv_heads=1;head_dim=32,model.tokenizer_vocab=300,"
    "sft.steps=8,sft.num_episodes=16,sft.batch_rows=16,"
    "train.batch_tasks=4,train.group_size=2,rspo.alpha=0.5,rspo.k=1,"
    "steps=2,env.max_steps=3,env.num_eval_tasks=4,env.num_workers=1,"
    "rollout.max_new_tokens=16,rollout.max_prompt_tokens=256,"
    "model.lora_rank=4,model.lora_alpha=8,train.lr=1e-4"
)  # adapters 1e-3


@pytest.mark.slow
def test_rspo_run_with_lora_resumes_and_exports(tmp_path):
  """build_run -> RSPO loop (B := A's adapters, the engine synced with
  merged weights) -> checkpoint; a new run in the workdir resumes A's
  adapters and Adam state exactly; launch/export's function writes the
  merged HF directory (the LoRA model's outputs) and the PEFT directory."""
  from configs import toy_grpo
  from rspo_jax import policy_export

  cfg = toy_grpo.get_config(TOY)
  with cfg.unlocked():
    cfg.mesh.shape = (1, 1, 1)
  workdir = str(tmp_path / "run")
  run = build.build_run(cfg, workdir, progress=False)
  try:
    a = run.trainer.a
    assert lora.enabled(run.mcfg) and run.trainer.ref_params is not None
    assert jax.tree.structure(a.params) == jax.tree.structure(
        nnx.state(a.module(), nnx.LoRAParam)
    )
    run.trainer.run()
    want = jax.device_get(a.state)
    assert int(want.step) > 0
  finally:
    run.close()
  again = build.build_run(cfg, workdir, progress=False)
  try:
    assert again.trainer.try_resume()
    for x, y in zip(
        jax.tree.leaves(jax.device_get(again.trainer.a.state)),
        jax.tree.leaves(want),
    ):
      np.testing.assert_array_equal(x, y)
    model = again.trainer.a.module()
  finally:
    again.close()
  out = str(tmp_path / "export")
  info = policy_export.export_latest_policy(cfg, workdir, out)
  assert info["exported"] and info["adapter_bytes"] > 0
  conf = json.load(open(os.path.join(out, "adapter", "adapter_config.json")))
  assert conf["r"] == 4
  cfg0, exported = hf_io.load_hf_model(out)
  assert cfg0.lora_rank == 0
  np.testing.assert_allclose(logits(exported), logits(model), atol=1e-4)
