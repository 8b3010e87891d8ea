r"""Per-decision accuracy of a warm-start policy on expert episodes.

For held-out goals, the scripted expert plays each episode; at every turn the
policy sees the same prompt (chat template, history window) and answers
greedily. Its action is compared with the expert's, per kind of decision:

  search  -- ``search[...]``
  product -- clicking a product id on a results page
  option  -- any other click before buying (option values, paging)
  buy     -- ``click[buy now]``

Teacher-forced (the expert's trajectory, not the policy's), so it shows which
decisions a warm start has learned even while whole episodes still fail.

  python launch/sft.py --config=configs/webshop_grpo.py --workdir=runs/ws
  python experiments/warm_start_probe.py --config=configs/webshop_grpo.py \
      --policy_dir=runs/ws/warm_start --num_tasks=24

Prints one JSON line: ``{"search": [right, n], "product": ..., ...}``.
"""

import collections
import json
import re

from absl import app, flags
from ml_collections import config_flags


def decision_kind(action: str) -> str:
  if action.startswith("search["):
    return "search"
  if action == "click[buy now]":
    return "buy"
  if re.fullmatch(r"click\[b0[0-9a-z]{8}\]", action):
    return "product"
  return "option"


def main(argv):
  del argv
  cfg = _CONFIG.value
  if cfg is None or not _POLICY.value:
    raise app.UsageError("--config and --policy_dir are required")
  from rspo_jax import build, models, sharding, warm_start
  from rspo_jax.rollout import prompts
  from rspo_jax.rollout.engine import SamplingParams

  tokenizer = models.load_tokenizer(_POLICY.value)
  mcfg, module = models.load_hf_model(_POLICY.value)
  engine = build.make_engine(
      cfg, mcfg, module, tokenizer, sharding.make_mesh((-1, 1, 1))
  )
  episodes = warm_start.expert_episodes(
      cfg.env.name,
      build.env_kwargs(cfg),
      range(_TASKS.value),
      split=cfg.env.eval_split,
      max_steps=cfg.env.max_steps,
  )
  prompt_ids, expert = [], []
  for steps in episodes:
    history = []
    for t, (obs, action) in enumerate(steps):
      ids, _, _ = prompts.build_prompt_ids(
          tokenizer,
          cfg.env.name,
          obs.task,
          obs.observation,
          obs.admissible_actions,
          history,
          t,
          max_prompt_tokens=cfg.rollout.max_prompt_tokens,
          history_length=cfg.env.history_length,
      )
      prompt_ids.append(ids)
      expert.append(action)
      history.append((obs.observation, action))
  results = engine.generate(
      prompt_ids,
      SamplingParams(
          temperature=0.0,
          max_new_tokens=cfg.rollout.max_new_tokens,
          stop_strings=("</action>",),
      ),
  )
  score = collections.defaultdict(lambda: [0, 0])
  for result, want in zip(results, expert):
    reply = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    got, _ = prompts.parse_action(reply, cfg.env.name)
    kind = decision_kind(want)
    score[kind][0] += int(got == want)
    score[kind][1] += 1
  engine.close()
  print(json.dumps(dict(score)))


if __name__ == "__main__":  # flags here: tests import decision_kind() alone
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "Experiment config file.", lock_config=True
  )
  _POLICY = flags.DEFINE_string("policy_dir", None, "HF dir of the policy.")
  _TASKS = flags.DEFINE_integer("num_tasks", 24, "Held-out goals to play.")
  app.run(main)
