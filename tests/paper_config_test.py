"""Paper scale vs CPU scale: two complete tables, neither leaking into the
other (issue 15, items 1, 2 and 8).

The expected paper values below are written from the paper (shared
DESIGN.md sections 2-3) and verl-agent's run scripts, not imported from
configs/scales.py.
"""

import importlib
import json
import os
import subprocess
import sys

import ml_collections
import pytest

from configs import base, scales

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_ALGOS = [
    (e, a) for e in ("webshop", "alfworld") for a in ("grpo", "ppo", "gigpo")
]

PAPER_COMMON = {
    "model.preset": "qwen2.5-1.5b",
    "model.dtype": "bfloat16",  # compute
    "model.param_dtype": "float32",  # master weights, Adam state
    "model.remat": "auto",  # the plan picks none / dots / full
    "model.scan_layers": True,  # one compiled block (MaxText scan_layers)
    "env.history_length": 2,
    "env.num_eval_tasks": 128,  # verl-agent val_data_size=128
    "env.kwargs": {},  # the upstream-sized worlds
    "algo.clip_eps": 0.2,
    "algo.kl_coef": 0.01,
    "algo.kl_kind": "k3",  # verl's low_var_kl
    "algo.entropy_coef": 0.001,
    "algo.invalid_action_penalty": -0.1,
    "algo.clip_ratio_c": 3.0,  # verl's actor.clip_ratio_c (dual clip)
    "algo.gamma": 0.95,  # verl-agent algorithm.gamma (GiGPO step returns)
    "rspo.alpha": 0.125,
    "rspo.k": 3,
    "rspo.dense_reward": "prm",
    "rollout.temperature": 1.0,
    "rollout.eval_temperature": 0.4,
    "rollout.max_new_tokens": 512,
    "train.total_steps": 150,
    "train.lr": 1e-6,
    "train.weight_decay": 0.01,  # verl's AdamW default
    "train.max_train_rows": 0,  # every rollout row trained
    "train.updates_per_step": 0,
    "train.ppo_epochs": 1,
    "train.eval_every": 5,  # verl-agent trainer.test_freq=5
    "sft.enabled": False,
}
PAPER_ENV = {
    "alfworld": {
        "env.max_steps": 50,
        "rollout.max_prompt_tokens": 2048,
        "train.mini_batch_rows": 256,
    },
    "webshop": {
        "env.max_steps": 15,
        "rollout.max_prompt_tokens": 4096,
        "train.mini_batch_rows": 64,
    },
}
PAPER_ALGO = {
    "grpo": {
        "train.batch_tasks": 16,
        "train.group_size": 8,
        "algo.normalize_std": True,
    },  # norm_adv_by_std_in_grpo
    "gigpo": {"train.batch_tasks": 16, "train.group_size": 8},
    # verl-agent's PPO: 128 distinct tasks, one episode each; verl's critic:
    # cliprange_value 0.5, AdamW weight decay 0.01.
    "ppo": {
        "train.batch_tasks": 128,
        "train.group_size": 1,
        "algo.critic_lr": 1e-5,
        "algo.value_clip_eps": 0.5,
    },
}
# verl-agent's examples/gigpo_trainer: run_webshop.sh mode="mean_norm"
# (no std divisor), run_alfworld.sh mode="mean_std_norm".
PAPER_ENV_ALGO = {
    ("webshop", "gigpo"): {"algo.normalize_std": False},
    ("alfworld", "gigpo"): {"algo.normalize_std": True},
}


def get(env, algo, arg=None):
  return importlib.import_module(f"configs.{env}_{algo}").get_config(arg)


def flat(c, prefix=""):
  """{'a.b': value}; env.kwargs is one value (a dict)."""
  out = {}
  for key, value in c.items():
    if isinstance(value, ml_collections.ConfigDict):
      if key == "kwargs":
        out[prefix + key] = value.to_dict()
      else:
        out.update(flat(value, prefix + key + "."))
    else:
      out[prefix + key] = value
  return out


@pytest.mark.parametrize("env,algo", ENV_ALGOS)
def test_paper_preset_has_every_paper_value(env, algo):
  got = flat(get(env, algo, "model=qwen2.5-1.5b"))
  want = {
      **PAPER_COMMON,
      **PAPER_ENV[env],
      **PAPER_ALGO[algo],
      **PAPER_ENV_ALGO.get((env, algo), {}),
  }
  assert {k: got[k] for k in want} == want


def test_paper_critic_decays_weights_like_verls():
  """One AdamW update with a zero gradient moves a critic weight by
  -lr * weight_decay * w: 1e-5 * 0.01 * 2.0 (verl critic.optim)."""
  import jax.numpy as jnp
  import numpy as np
  from rspo_jax import build

  tx = build.critic_optimizer(get("webshop", "ppo", "model=qwen2.5-1.5b"))
  w = {"w": jnp.full((3,), 2.0)}
  updates, _ = tx.update({"w": jnp.zeros(3)}, tx.init(w), w)
  np.testing.assert_allclose(updates["w"], -1e-5 * 0.01 * 2.0, rtol=1e-5)


@pytest.mark.parametrize(
    "preset", ["qwen2.5-0.5b", "qwen2.5-7b", "llama-3.2-3b"]
)
def test_every_paper_preset_gets_the_same_table(preset):
  one = flat(get("alfworld", "gigpo", "model=qwen2.5-1.5b"))
  other = flat(get("alfworld", "gigpo", f"model={preset}"))
  assert {k for k in one if one[k] != other[k]} == {"model.preset"}
  assert other["model.preset"] == preset


@pytest.mark.parametrize("env,algo", ENV_ALGOS)
def test_cpu_and_paper_presets_differ_in_the_documented_keys(env, algo):
  cpu = flat(get(env, algo))
  paper = flat(get(env, algo, "model=qwen2.5-1.5b"))
  assert set(cpu) == set(paper)
  differ = {k for k in cpu if cpu[k] != paper[k]}
  assert differ == set(scales.SCALE_DIFF[env])
  assert differ <= set(scales.SCALE_KEYS)


@pytest.mark.parametrize("env", ["webshop", "alfworld", "toy"])
@pytest.mark.parametrize("algo", ["grpo", "ppo", "gigpo"])
def test_both_tables_set_exactly_the_scale_keys_with_one_type(env, algo):
  paper = scales.resolve(scales.PAPER, env, algo)
  cpu = scales.resolve(scales.CPU, env, algo)
  assert set(paper) == set(cpu) == set(scales.SCALE_KEYS)
  # An override parses the same at both scales (set_by_path keeps types).
  assert {k: type(v) for k, v in paper.items()} == {
      k: type(v) for k, v in cpu.items()
  }
  # _base sets none of them: a scale key comes from its table only.
  assert not set(flat(base._base(env, algo))) & set(scales.SCALE_KEYS)
  # The keys the CPU recipe takes from the paper are equal there.
  assert all(cpu[k] == paper[k] for k in scales.CPU_KEEPS_PAPER)


def test_cpu_preset_keeps_its_budget_choices():
  # WebShop: the paper's batch, alpha and every row (the CPU study's recipe
  # that learns) with CPU's learning rate and updates; one RSPO loop (the
  # 15-minute default run), the other environments two.
  c = get("webshop", "grpo")
  assert (
      c.rspo.alpha,
      c.train.max_train_rows,
      c.env.history_length,
      c.train.eval_every,
  ) == (0.125, 0, 1, 0)
  assert (
      c.train.batch_tasks,
      c.train.group_size,
      c.train.total_steps,
      c.train.lr,
      c.train.updates_per_step,
  ) == (16, 8, 3, 3e-4, 4)
  assert c.train.total_steps == c.rspo.k
  assert get("alfworld", "grpo").train.total_steps == 2 * c.rspo.k
  assert c.rspo.dense_reward == "oracle"
  # alpha 1/8 of 128 episodes: 16 replayed trajectories (two groups).
  assert c.rspo.alpha * 128 == 16 == 2 * c.train.group_size
  # ALFWorld: alpha 1/4 of 4 x 4 episodes: 4 replayed (one whole group).
  c = get("alfworld", "grpo")
  assert (c.rspo.alpha, c.train.max_train_rows) == (0.25, 64)
  episodes = c.train.batch_tasks * c.train.group_size
  assert c.rspo.alpha * episodes == 4 == c.train.group_size


@pytest.mark.parametrize(
    "arg",
    [
        "model=qwen2.5-1.5b,rspo.alpha=0.25,train.max_train_rows=64",
        "rspo.alpha=0.25,train.max_train_rows=64,model=qwen2.5-1.5b",
    ],
)
def test_overrides_win_over_the_scale_wherever_they_stand(arg):
  c = get("webshop", "grpo", arg)
  assert c.rspo.alpha == 0.25 and c.train.max_train_rows == 64
  assert c.train.lr == 1e-6 and c.model.preset == "qwen2.5-1.5b"


def test_last_model_override_picks_the_scale():
  c = get("webshop", "grpo", "model=qwen2.5-1.5b,model=tiny")
  assert c.model.preset == "tiny" and c.train.lr == 3e-4  # CPU table
  c = get("webshop", "grpo", "model=tiny,model=qwen2.5-7b")
  assert c.model.preset == "qwen2.5-7b" and c.train.lr == 1e-6


def step_updates(train, rows):
  """Optimizer updates of one step of `rows` trained rows (per epoch):
  updates_per_step n > 0: min(n, rows); else mini_batch_rows m > 0:
  ceil(rows / m); else 1."""
  if train.updates_per_step:
    return min(train.updates_per_step, rows)
  if train.mini_batch_rows:
    return -(-rows // train.mini_batch_rows)
  return 1


@pytest.mark.parametrize(
    "name", [f"{e}_{a}" for e, a in ENV_ALGOS] + ["toy_grpo"]
)
def test_cpu_configs_make_at_least_two_updates_per_step(name):
  c = importlib.import_module(f"configs.{name}").get_config()
  t = c.train
  episodes = t.batch_tasks * t.group_size
  fewest = episodes  # every episode takes at least one step
  most = episodes * c.env.max_steps
  if t.max_train_rows:
    most = min(most, t.max_train_rows)
  assert (fewest, most) == (
      (128, 1024) if c.env.name == "webshop" else (16, 64)
  )
  assert all(
      step_updates(t, rows) * t.ppo_epochs >= 2
      for rows in range(fewest, most + 1)
  )


def test_paper_mini_batches_count_step_rows_as_verl():
  """verl-agent: ppo_mini_batch_size=256 (ALFWorld) / 64 (WebShop) step
  rows per update (rollout.n = 1 inside verl)."""
  alf = get("alfworld", "grpo", "model=qwen2.5-1.5b").train
  web = get("webshop", "grpo", "model=qwen2.5-1.5b").train
  assert step_updates(alf, 128 * 20) == 10  # 128 episodes x 20 turns
  assert step_updates(alf, 128 * 50) == 25
  assert step_updates(web, 128 * 5) == 10
  assert step_updates(web, 128 * 15) == 30


def test_one_mini_batch_override_clears_the_other():
  c = get("webshop", "grpo", "train.mini_batch_rows=32")
  assert (c.train.mini_batch_rows, c.train.updates_per_step) == (32, 0)
  c = get("webshop", "grpo", "model=qwen2.5-1.5b,train.updates_per_step=4")
  assert (c.train.mini_batch_rows, c.train.updates_per_step) == (0, 4)
  c = get("webshop", "grpo")
  c.train.mini_batch_rows = 32  # as --config.train.mini_batch_rows=32
  with pytest.raises(ValueError, match="updates_per_step"):
    base.validate(c)
  for bad in ("train.ppo_epochs=0", "train.updates_per_step=-1"):
    with pytest.raises(ValueError, match=bad.split("=")[0]):
      get("webshop", "grpo", bad)


def test_dense_reward_names():
  assert get("alfworld", "gigpo").rspo.dense_reward == "oracle"
  assert (
      get("alfworld", "gigpo", "model=qwen2.5-1.5b").rspo.dense_reward == "prm"
  )
  # 'env', the former name of the oracle, is still accepted.
  assert (
      get("webshop", "grpo", "rspo.dense_reward=env").rspo.dense_reward
      == "oracle"
  )
  with pytest.raises(ValueError, match="rspo.dense_reward"):
    get("webshop", "grpo", "rspo.dense_reward=heuristic")


def test_ppo_alone_may_have_groups_of_one():
  assert get("webshop", "ppo", "train.group_size=1").train.group_size == 1
  with pytest.raises(ValueError, match="train.group_size"):
    get("webshop", "grpo", "train.group_size=1")


def test_launch_flags_apply_after_the_scale():
  """--config=file:model=... picks the paper table; a --config.<key> flag
  then wins (launch/train.py --dry_run prints the plan)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("RSPO_")}
  env.update(JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [
          sys.executable,
          "launch/train.py",
          "--config=configs/alfworld_grpo.py:model=qwen2.5-1.5b",
          "--config.train.total_steps=30",
          "--config.train.batch_tasks=8",
          "--dry_run",
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  p = json.loads(proc.stdout)
  assert p["model"] == "qwen2.5-1.5b" and p["steps_of_A"] == 30
  assert p["batch"]["tasks"] == 8 and p["batch"]["group_size"] == 8
