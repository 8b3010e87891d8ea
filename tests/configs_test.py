"""The embedded configs: CPU recipe vs paper scale, overrides."""

import re

import pytest

from configs import alfworld_gigpo, webshop_grpo, webshop_ppo


def test_cpu_recipe_uses_the_small_webshop_world():
  cfg = webshop_grpo.get_config()
  assert dict(cfg.env.kwargs) == dict(
      num_products=30,
      goals_per_product=20,
      num_test_goals=256,
      expert_query="type",
  )
  # Its committed warm start, not behaviour cloning (default_run_test.py).
  assert cfg.model.preset == "nano" and not cfg.sft.enabled
  assert cfg.model.checkpoint_dir.endswith("warm_starts/webshop_nano")
  assert cfg.sft.prompt_loss_weight == 1.0 and cfg.env.num_eval_tasks == 256
  assert webshop_ppo.get_config().env.kwargs.num_products == 30


def test_cpu_recipe_uses_two_alfworld_task_types():
  cfg = alfworld_gigpo.get_config()
  assert cfg.model.preset == "nano" and cfg.sft.prompt_loss_weight == 1.0
  assert tuple(cfg.env.kwargs.task_types) == (
      "pick_and_place_simple",
      "look_at_obj_in_light",
  )
  assert not dict(alfworld_gigpo.get_config("model=qwen2.5-1.5b").env.kwargs)


def test_paper_scale_restores_upstream_sized_worlds():
  cfg = webshop_grpo.get_config("model=qwen2.5-1.5b")
  assert not dict(cfg.env.kwargs)  # upstream-sized defaults of WebShopEnv
  assert not cfg.sft.enabled
  assert cfg.train.group_size == 8 and cfg.train.batch_tasks == 16


def test_world_overrides_keep_their_types():
  cfg = webshop_grpo.get_config(
      "env.kwargs.num_products=60," "env.kwargs.expert_query=instruction"
  )
  assert cfg.env.kwargs.num_products == 60
  assert cfg.env.kwargs.expert_query == "instruction"
  with pytest.raises(ValueError):
    webshop_grpo.get_config("env.kwargs.num_products=many")


def test_train_tasks_restricts_the_training_task_ids():
  """env.train_tasks = N: A and B draw from task ids 0 .. N - 1 of the
  training split (the trainer's num_train_tasks); 0 = the whole split."""
  from configs import base
  from rspo_jax import build
  from rspo_jax.errors import ConfigError

  cfg = webshop_grpo.get_config()
  whole = build.num_tasks(cfg, "train")
  assert whole > 16 and build.num_train_tasks(cfg) == whole
  cfg = webshop_grpo.get_config("env.train_tasks=16")
  assert build.num_train_tasks(cfg) == 16
  with pytest.raises(
      ConfigError, match=f"env.train_tasks={whole + 1}.*" f"has {whole} tasks"
  ):
    build.num_train_tasks(
        webshop_grpo.get_config(f"env.train_tasks={whole + 1}")
    )
  # Fewer than a step's tasks: refused at start (a step's tasks differ).
  with pytest.raises(
      ConfigError, match="env.train_tasks=3.*>= train" ".batch_tasks = 16"
  ):
    base.validate(webshop_grpo.get_config("env.train_tasks=3"))


def test_centre_cap_keys_default_off_validated_and_threaded():
  """rspo.centre_cap (0 = off) and rspo.centre_cap_mode reach A's loss
  config; the baseline (rspo=0) never caps; bad values stop at start."""
  from rspo_jax import build
  from rspo_jax.errors import ConfigError

  cfg = webshop_grpo.get_config()
  assert cfg.rspo.centre_cap == 0.0 and cfg.rspo.centre_cap_mode == "truncate"
  assert build.policy_loss_config(cfg, rspo=True).centre_cap == 0.0
  cfg = webshop_grpo.get_config("rspo.centre_cap=2,rspo.centre_cap_mode=mask")
  loss_cfg = build.policy_loss_config(cfg, rspo=True)
  assert (loss_cfg.centre_cap, loss_cfg.centre_cap_mode) == (2.0, "mask")
  assert build.policy_loss_config(cfg, rspo=False).centre_cap == 0.0
  assert webshop_grpo.get_config("rspo.centre_cap=1").rspo.centre_cap == 1.0
  for bad, wanted in (
      ("rspo.centre_cap=-1", "rspo.centre_cap=-1.0"),
      ("rspo.centre_cap=0.5", "0 (off) or >= 1"),
      ("rspo.centre_cap_mode=clamp", "one of truncate, mask"),
  ):
    with pytest.raises(ConfigError, match=re.escape(wanted)):
      webshop_grpo.get_config(bad)


def test_dual_clip_is_verls_default_reaches_both_losses_and_is_validated():
  """algo.clip_ratio_c: 3.0 as verl's dp_actor, in A's and B's loss
  configs (rspo or not); 0 turns it off; C <= 1 stops at start."""
  from rspo_jax import build
  from rspo_jax.errors import ConfigError

  for arg in (None, "model=qwen2.5-1.5b"):
    cfg = webshop_grpo.get_config(arg)
    assert cfg.algo.clip_ratio_c == 3.0
    for rspo in (True, False):
      assert build.policy_loss_config(cfg, rspo=rspo).clip_ratio_c == 3.0
  cfg = webshop_grpo.get_config("algo.clip_ratio_c=0")
  assert build.policy_loss_config(cfg, rspo=True).clip_ratio_c == 0.0
  with pytest.raises(ConfigError, match=re.escape("0 (off) or > 1")):
    webshop_grpo.get_config("algo.clip_ratio_c=1")


def test_attention_kernel_is_a_config_key_that_reaches_the_model():
  """model.attention (auto | xla | cudnn | splash | plain) is settable as
  docs/scale_out.md says, reaches the model config, and a bad value stops
  at start naming the choices."""
  from rspo_jax import build
  from rspo_jax.errors import ConfigError

  assert webshop_grpo.get_config().model.attention == "auto"
  cfg = webshop_grpo.get_config("model.attention=xla")
  assert build.model_numerics(cfg)["attention"] == "xla"
  with pytest.raises(
      ConfigError,
      match=re.escape(
          "model.attention='splsh' (did you mean 'splash'?); wants one of auto,"
          " xla, cudnn, splash, plain"
      ),
  ):
    webshop_grpo.get_config("model.attention=splsh")
