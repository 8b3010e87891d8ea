"""experiments/toy_mechanism.py without training: each arm's config, the dense
return read from a metrics row, and the report's rollout and B tables."""

import argparse
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import toy_mechanism as tm  # noqa: E402
from rspo_jax import build  # noqa: E402
from third_party_envs import registry  # noqa: E402

ARGS = argparse.Namespace(steps=12, eval_every=3, lr=1e-4)
UP = {"min_distance": 4, "direction": "up"}


def cfg_of(arm, seed=3):
  return tm.cell_config(arm, seed, ARGS, "/ckpt")


@pytest.mark.parametrize(
    "arm, enabled, dense_only, decoy",
    [
        ("grpo", False, False, False),
        ("rspo", True, False, False),
        ("dense_only", False, True, False),
        ("dense_only_misaligned", False, True, True),
        ("rspo_misaligned", True, False, True),
    ],
)
def test_arm_configs(arm, enabled, dense_only, decoy):
  c = cfg_of(arm)
  assert (bool(c.rspo.enabled), bool(c.rspo.dense_only)) == (
      enabled,
      dense_only,
  )
  assert c.rspo.dense_reward == "oracle" and c.rspo.dense_noise_sigma == 0
  if enabled:
    assert (c.rspo.k, c.rspo.alpha, c.rspo.data_source) == (3, 0.25, "rspo")
  want = dict(UP, dense_target_offset=-24) if decoy else UP
  assert dict(c.env.kwargs) == want
  assert (
      c.seed,
      c.train.total_steps,
      c.train.batch_tasks,
      c.train.group_size,
      c.train.lr,
  ) == (3, 12, 4, 8, 1e-4)
  assert c.model.checkpoint_dir == "/ckpt" and c.model.preset == "nano"


def test_existing_arms_keep_their_recorded_overrides():
  want = (
      "rspo=1,rspo.k=3,rspo.alpha=0.25,seed=0,steps=12,train.lr=0.0001,"
      "train.batch_tasks=4,train.group_size=8,train.updates_per_step=2,"
      "train.max_train_rows=0,train.eval_every=3,"
      "model.checkpoint_dir=<root>/warm_start/warm_start"
  )
  assert tm.cfg_string(None, "rspo", 0, ARGS) == want  # as in the JSON


def test_misaligned_env_pays_for_walking_away():
  c = cfg_of("dense_only_misaligned")
  env = registry.make_env(c.env.name, **build.env_kwargs(c))
  env.max_steps = c.env.max_steps
  start = env.reset(0, "valid_seen")
  n = int(start.task.split()[-1])
  x0 = int(start.observation.split()[-1].rstrip("."))
  assert n - x0 >= 4  # upward, distant
  down, up = env.step("dec"), env.step("inc")
  assert down.dense_reward == pytest.approx(1 / (n - x0))
  assert up.dense_reward == pytest.approx(-1 / (n - x0))


def test_dense_return_of_a_metrics_row():
  # 3 episodes of 4 records, dense sums 1, 0.5, -0.3: mean 0.4;
  # dense_reward_mean = 1.2 / 12 = 0.1, episode length 4.
  row = {"dense_reward_mean": 0.1, "rollout_episode_length": 4.0}
  assert tm.dense_return(row) == pytest.approx(0.4)


def cell(arm, seed, dense, won):
  """A fake cell: 2 held-out tasks, evals at 0 and 3; 3 A steps with
  rollout dense returns ``dense`` and successes ``won``."""
  ev = lambda step: {
      "a_step": step,
      "env_steps": 100 * step,
      "won": [0, 1],
      "t1_won": [[0, 1], [1, 1]],
  }
  b = [
      {"loop_a_step": 0, "success_rate": 0.25 * i, "dense_return": -0.5 * i}
      for i in range(3)
  ]
  return {
      "arm": arm,
      "seed": seed,
      "evals": [ev(0), ev(3)],
      "rollouts": [
          {"a_step": i + 1, "success_rate": w, "dense_return": d}
          for i, (d, w) in enumerate(zip(dense, won))
      ],
      "b_rollouts": b if arm.startswith("rspo") else [],
  }


def test_report_tables():
  data = {
      "settings": {"steps": 3, "eval_every": 3, "lr": 1e-4},
      "cells": {
          "grpo_s0": cell("grpo", 0, [0, 0, 0], [0, 0, 0]),
          "dense_only_misaligned_s0": cell(
              "dense_only_misaligned", 0, [0.3, 0.6, 0.9], [0.5, 0, 0]
          ),
          "dense_only_misaligned_s1": cell(
              "dense_only_misaligned", 1, [0.3, 0.3, 0.3], [0.25, 0, 0]
          ),
          "rspo_misaligned_s0": cell(
              "rspo_misaligned", 0, [0, 0, 0], [0, 0, 0]
          ),
      },
  }
  text = tm.report(data)
  # per seed block means: dense 0.6 and 0.3 -> 0.45; success 1/6, 1/12
  assert "| 1-3 | 0.45 [" in text and "| 12.5 [" in text
  assert (
      "`python experiments/toy_mechanism.py --steps 3 --eval_every 3 --lr"
      " 0.0001 --arms dense_only_misaligned --seeds 0,1`"
  ) in text
  assert "## dense_only_misaligned - grpo at equal A steps" in text
  assert "## rspo_misaligned - grpo at equal A steps" in text
  assert "- rspo at" not in text  # no rspo cells
  assert "| 3 | 0.0 [0.0, 0.0] | 0.0 [" in text  # same outcomes as grpo
  assert (
      "## B's own rollouts (rspo_misaligned): success % / dense return" in text
  )
  assert "| 0 | 0.0 / 0.00 | 25.0 / -0.50 | 50.0 / -1.00 |" in text


def test_lora_lr_matching_ratio_interpolates_in_log_lr():
  import lora_lr  # noqa: PLC0415  (experiments/ is on sys.path above)

  def cell(rank, lr, adapter_lr, speed):
    return {
        "rank": rank,
        "train_lr": lr,
        "adapter_lr": adapter_lr,
        "seed": 0,
        "rollout_success": [speed, speed],
    }

  data = {
      "cells": {
          "full": cell(0, 1e-4, 1e-4, 0.4),
          "a": cell(4, 1e-5, 1e-4, 0.2),
          "b": cell(4, 1e-4, 1e-3, 0.6),
      }
  }
  # 0.4 is halfway from 0.2 to 0.6: halfway in log lr from 1e-4 to 1e-3,
  # 10 ** -3.5 = 3.162e-4, over full fine-tuning's 1e-4.
  assert lora_lr.matching_ratio(data) == pytest.approx(10**0.5)
  data["cells"]["full"]["rollout_success"] = [0.9, 0.9]  # out of bracket
  assert lora_lr.matching_ratio(data) is None
