r"""How a policy's evaluation episodes end, with the actions of the first
failures (WebShop or ALFWorld).

Plays each task of the eval split once with the config's evaluation
decoding (greedy by default) and sorts the episodes. WebShop:

  won        -- score 1.0
  wrong_buy  -- clicked ``buy now`` with a wrong product or option
  no_buy     -- ran out of steps without buying (e.g. clicking the same
                option again and again)
  invalid    -- ended with an invalid reply

ALFWorld:

  won              -- the goal holds
  repeats_invalid  -- ended repeating one command the game rejects
                      (``Nothing happens.``), e.g. taking an object that
                      is not there
  step_limit       -- ran out of steps otherwise

  python experiments/eval_failures.py --config=configs/webshop_grpo.py \
      --policy_dir=runs/webshop_grpo/warm_start --show=10

Prints one JSON line: counts per kind, mean score, and for the first
``--show`` failures their goal and actions.
"""

import collections
import json

from absl import app, flags
from ml_collections import config_flags


def ending(actions: list[str], won: bool, invalid: bool) -> str:
  if won:
    return "won"
  if "click[buy now]" in actions:
    return "wrong_buy"
  return "invalid" if invalid else "no_buy"


def alfworld_ending(
    actions: list[str], won: bool, rejected: list[bool], repeats: int = 3
) -> str:
  """``rejected[t]``: the game answered step t with ``Nothing happens.``
  (known for every step but the last, whose answer the record lacks)."""
  if won:
    return "won"
  tail = actions[-repeats:]
  if (
      len(tail) == repeats
      and len(set(tail)) == 1
      and all(rejected[-repeats:-1])
  ):
    return "repeats_invalid"
  return "step_limit"


def main(argv):
  del argv
  cfg = _CONFIG.value
  if cfg is None or not _POLICY.value:
    raise app.UsageError("--config and --policy_dir are required")
  env_name = cfg.env.name
  if env_name not in ("webshop", "alfworld"):
    raise app.UsageError("eval_failures.py reads WebShop or ALFWorld episodes")
  from rspo_jax import build, models, sharding
  from rspo_jax.rollout.collect import CollectRequest, collect
  from rspo_jax.rollout.engine import SamplingParams
  from third_party_envs import registry
  from third_party_envs.vector import VectorEnv
  from third_party_envs.alfworld import env as alfworld_env
  from third_party_envs.webshop import reward

  tokenizer = models.load_tokenizer(_POLICY.value)
  mcfg, module = models.load_hf_model(_POLICY.value)
  engine = build.make_engine(
      cfg, mcfg, module, tokenizer, sharding.make_mesh((-1, 1, 1))
  )
  n_tasks = _TASKS.value or cfg.env.num_eval_tasks
  venv = VectorEnv(
      env_name, build.env_kwargs(cfg), min(16, n_tasks), num_workers=1
  )
  sampling = SamplingParams(
      temperature=cfg.rollout.eval_temperature,
      max_new_tokens=cfg.rollout.max_new_tokens,
      stop_strings=("</action>",),
  )
  episodes = collections.defaultdict(list)
  try:
    for start in range(0, n_tasks, venv.num_envs):
      tasks = list(range(start, min(start + venv.num_envs, n_tasks)))
      records, _ = collect(
          engine,
          venv,
          tokenizer,
          CollectRequest(
              tasks, 1, sampling, traj_id_start=start, group_id_start=start
          ),
          build.collect_config(cfg, cfg.env.eval_split),
      )
      for r in records:
        episodes[r.task_id].append(r)
  finally:
    venv.close()
    engine.close()
  env = registry.make_env(env_name, **build.env_kwargs(cfg))
  counts, scores, shown = collections.Counter(), [], []
  for task_id in sorted(episodes):
    steps = sorted(episodes[task_id], key=lambda r: r.step_idx)
    actions = [r.action for r in steps]
    if env_name == "webshop":
      kind = ending(actions, steps[-1].won, steps[-1].invalid)
    else:
      rejected = [
          nxt.anchor_obs == alfworld_env.INVALID_FEEDBACK for nxt in steps[1:]
      ] + [False]
      kind = alfworld_ending(actions, steps[-1].won, rejected)
    counts[kind] += 1
    scores.append(steps[-1].score)
    if kind != "won" and len(shown) < _SHOW.value:
      first = env.reset(task_id, cfg.env.eval_split)
      goal = (
          reward.goal_option_values(env.goal)
          if env_name == "webshop"
          else first.task
      )
      shown.append(
          {
              "task": task_id,
              "kind": kind,
              "score": round(steps[-1].score, 3),
              "goal": goal,
              "actions": actions,
          }
      )
  print(
      json.dumps(
          {
              "episodes": len(episodes),
              **dict(counts),
              "score": sum(scores) / max(len(scores), 1),
              "failures": shown,
          }
      )
  )


if __name__ == "__main__":  # flags here: tests import ending() alone
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "Experiment config file.", lock_config=True
  )
  _POLICY = flags.DEFINE_string("policy_dir", None, "HF dir of the policy.")
  _TASKS = flags.DEFINE_integer(
      "num_tasks", None, "Tasks (default: env.num_eval_tasks)."
  )
  _SHOW = flags.DEFINE_integer("show", 5, "Failures to list with actions.")
  app.run(main)
