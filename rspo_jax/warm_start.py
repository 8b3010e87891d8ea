"""Behaviour cloning on expert episodes: the tiny policy's warm start.

The environments' scripted solvers play episodes; every turn becomes one
supervised row -- the same prompt the policy will see in RL (chat template,
history window) followed by the reply

    <think>{thought}</think><action>{expert action}</action><|im_end|>

and the policy minimises -mean log pi(reply tokens). The paper starts RL from
instruct models that already succeed sometimes; SFT is stopped early (few
steps) so the tiny policy is weak but not hopeless.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Iterable, Optional

import jax
import numpy as np

from rspo_jax import batching
from rspo_jax.learner import Learner
from rspo_jax.rollout import prompts as prompt_lib
from rspo_jax.types import StepRecord
from third_party_envs import registry

log = logging.getLogger(__name__)


THOUGHT = "expert_thought"  # EnvStep.info key of the expert's thought


def expert_reply(action: str, thought: Optional[str] = None) -> str:
  """The expert's thought (``env.expert_thought()``, e.g. ALFWorld's
  searching expert's 'mug is not here' / 'put mug in shelf'), else a
  short fixed one: short
  replies on CPU (the tiny policy learns the format; a real instruct model
  writes its own reasoning)."""
  return f"<think>{thought or 'next step'}</think><action>{action}</action>"


def step_reply(obs, action: str) -> str:
  return expert_reply(action, obs.info.get(THOUGHT))


def expert_episodes(
    env_name: str,
    env_kwargs: dict,
    task_ids: Iterable[int],
    *,
    split: str,
    max_steps: int,
) -> list[list[tuple[object, str]]]:
  """[(EnvStep before the action, expert action), ...] per won episode
  (per finished episode where the env's ``expert_keeps_lost``); the
  expert's thought, when it states one, in the EnvStep's
  ``info[THOUGHT]``."""
  env = registry.make_env(env_name, **env_kwargs)
  episodes = []
  try:
    for task_id in task_ids:
      obs, steps = env.reset(int(task_id), split), []
      for _ in range(max_steps):
        action = env.expert_action()
        if action is None:
          break
        thought = env.expert_thought()
        if thought is not None:
          obs = dataclasses.replace(obs, info={**obs.info, THOUGHT: thought})
        steps.append((obs, action))
        obs = env.step(action)
        if obs.done:
          break
      if obs.won or (
          getattr(env, "expert_keeps_lost", False) and obs.done and steps
      ):
        episodes.append(steps)
  finally:
    env.close()
  return episodes


def episode_texts(episodes, env_name: str, history_length: int):
  """(user message, reply) pairs of every turn, for tokenizer training."""
  for steps in episodes:
    history = []
    for t, (obs, action) in enumerate(steps):
      yield prompt_lib.build_prompt(
          env_name,
          obs.task,
          obs.observation,
          obs.admissible_actions,
          history,
          t,
          history_length,
      ), step_reply(obs, action)
      history.append((obs.observation, action))


def sft_records(
    episodes,
    tokenizer,
    env_name: str,
    *,
    history_length: int,
    max_prompt_tokens: int,
) -> list[StepRecord]:
  eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
  records = []
  for e, steps in enumerate(episodes):
    history = []
    for t, (obs, action) in enumerate(steps):
      ids, _, _ = prompt_lib.build_prompt_ids(
          tokenizer,
          env_name,
          obs.task,
          obs.observation,
          obs.admissible_actions,
          history,
          t,
          max_prompt_tokens=max_prompt_tokens,
          history_length=history_length,
      )
      reply = tokenizer.encode(
          step_reply(obs, action), add_special_tokens=False
      )
      records.append(
          StepRecord(
              task_id=e,
              group_id=e,
              traj_id=e,
              step_idx=t,
              prompt_ids=np.asarray(ids, np.int32),
              response_ids=np.asarray(reply + [eos], np.int32),
              behavior_logp=np.zeros(len(reply) + 1, np.float32),
          )
      )
      history.append((obs.observation, action))
  return records


def train_sft(
    learner: Learner,
    records: list[StepRecord],
    *,
    steps: int,
    batch_rows: int,
    seed: int,
    max_len: Optional[int] = None,
    progress: bool = True,
    metrics_writer=None,
) -> list[float]:
  """``steps`` updates on random row batches; returns the loss curve."""
  from tqdm.auto import tqdm

  rng = np.random.default_rng(seed)
  ones = np.ones(len(records), np.float32)
  curve = []
  bar = tqdm(
      range(steps),
      desc="warm start (SFT)",
      disable=not progress,
      dynamic_ncols=True,
  )
  for step in bar:
    rows = rng.choice(
        len(records), size=min(batch_rows, len(records)), replace=False
    )
    batch = batching.records_to_batch(
        [records[i] for i in rows],
        ones[rows],
        max_len=max_len,
        row_ways=learner.row_ways,
    )
    m = learner.train(batch, jax.random.key(seed + step))
    curve.append(m["nll"])
    bar.set_postfix(nll=f"{m['nll']:.3f}")
    if metrics_writer is not None:
      metrics_writer.write(step, "sft", m)
  return curve


def jsonl_records(path: str, tokenizer) -> list[StepRecord]:
  """Rows from a JSONL of {"prompt": user message, "response": reply}."""
  eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
  records = []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        prompt, response = row["prompt"], row["response"]
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path}:{n}: expected {{'prompt': str, 'response': str}}: {e}"
        ) from e
      ids = prompt_lib.render_chat(tokenizer, prompt)
      reply = tokenizer.encode(response, add_special_tokens=False) + [eos]
      records.append(
          StepRecord(
              task_id=n,
              group_id=n,
              traj_id=n,
              step_idx=0,
              prompt_ids=np.asarray(ids, np.int32),
              response_ids=np.asarray(reply, np.int32),
              behavior_logp=np.zeros(len(reply), np.float32),
          )
      )
  if not records:
    raise ValueError(f"{path}: no trajectories")
  return records
