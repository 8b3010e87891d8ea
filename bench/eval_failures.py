r"""How a policy's evaluation episodes end: won, bought the wrong thing, or
never bought (WebShop), with the actions of the first failures.

Plays each task of the eval split once with the config's evaluation
decoding (greedy by default) and sorts the episodes:

  won        -- score 1.0
  wrong_buy  -- clicked ``buy now`` with a wrong product or option
  no_buy     -- ran out of steps without buying (e.g. clicking the same
                option again and again)
  invalid    -- ended with an invalid reply

  python bench/eval_failures.py --config=configs/webshop_grpo.py \
      --policy_dir=runs/webshop_grpo/warm_start --show=10

Prints one JSON line: counts per kind, mean score, and for the first
``--show`` failures their goal options and actions.
"""

import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402



def ending(actions: list[str], won: bool, invalid: bool) -> str:
  if won:
    return "won"
  if "click[buy now]" in actions:
    return "wrong_buy"
  return "invalid" if invalid else "no_buy"


def main(argv):
  del argv
  cfg = _CONFIG.value
  if cfg is None or not _POLICY.value:
    raise app.UsageError("--config and --policy_dir are required")
  if cfg.env.name != "webshop":
    raise app.UsageError("eval_failures.py reads WebShop episodes only")
  from rspo_jax import build, models, sharding
  from rspo_jax.rollout.collect import collect
  from rspo_jax.rollout.engine import SamplingParams
  from third_party_envs import registry
  from third_party_envs.vector import VectorEnv
  from third_party_envs.webshop import reward

  tokenizer = models.load_tokenizer(_POLICY.value)
  mcfg, module = models.load_hf_model(_POLICY.value)
  engine = build.make_engine(cfg, mcfg, module, tokenizer,
                             sharding.make_mesh((-1, 1, 1)))
  n_tasks = _TASKS.value or cfg.env.num_eval_tasks
  venv = VectorEnv("webshop", build.env_kwargs(cfg), min(16, n_tasks),
                   num_workers=1)
  sampling = SamplingParams(
      temperature=cfg.rollout.eval_temperature,
      max_new_tokens=cfg.rollout.max_new_tokens, stop_strings=("</action>",))
  episodes = collections.defaultdict(list)
  try:
    for start in range(0, n_tasks, venv.num_envs):
      tasks = list(range(start, min(start + venv.num_envs, n_tasks)))
      records, _ = collect(engine, venv, tokenizer, tasks, 1, sampling,
                           build.collect_config(cfg, cfg.env.eval_split),
                           traj_id_start=start, group_id_start=start)
      for r in records:
        episodes[r.task_id].append(r)
  finally:
    venv.close()
    engine.close()
  env = registry.make_env("webshop", **build.env_kwargs(cfg))
  counts, scores, shown = collections.Counter(), [], []
  for task_id in sorted(episodes):
    steps = sorted(episodes[task_id], key=lambda r: r.step_idx)
    actions = [r.action for r in steps]
    kind = ending(actions, steps[-1].won, steps[-1].invalid)
    counts[kind] += 1
    scores.append(steps[-1].score)
    if kind != "won" and len(shown) < _SHOW.value:
      env.reset(task_id, cfg.env.eval_split)
      shown.append({"task": task_id, "kind": kind,
                    "score": round(steps[-1].score, 3),
                    "goal_options": reward.goal_option_values(env.goal),
                    "actions": actions})
  print(json.dumps({"episodes": len(episodes), **dict(counts),
                    "score": sum(scores) / max(len(scores), 1),
                    "failures": shown}))


if __name__ == "__main__":  # flags here: tests import ending() alone
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "Experiment config file.", lock_config=True
  )
  _POLICY = flags.DEFINE_string("policy_dir", None, "HF dir of the policy.")
  _TASKS = flags.DEFINE_integer("num_tasks", None,
                                "Tasks (default: env.num_eval_tasks).")
  _SHOW = flags.DEFINE_integer("show", 5, "Failures to list with actions.")
  app.run(main)
