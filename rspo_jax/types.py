"""Plain records shared by rollout, replay and the learner.

Imports nothing from the rest of the package: everything else imports this.

Token-level conventions used everywhere (learner, losses, batching):
  * A learner row is one *step* of an episode: the step's prompt (task, history
    window, current observation, rendered with the chat template) followed by
    the model's reply. ``tokens[b, t]`` holds prompt then response,
    right-padded.
  * Per-token arrays (``loss_mask``, ``advantages``, ``old_logp`` ...) are
    aligned with ``tokens``: entry ``t`` concerns predicting ``tokens[b, t]``
    from ``tokens[b, :t]``. Entry 0 is never a response token.
  * ``loss_mask[b, t] = 1`` exactly on response tokens of real rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

POLICY_A = "A"  # Agent A: the deliverable, outcome reward only.
POLICY_B = "B"  # Agent B: the dense-reward explorer.


@dataclasses.dataclass
class StepRecord:
  """One turn of one episode, as the rollout worker emits it (numpy only).

  ``reward`` is what the learner uses; for B's stored trajectories it is the
  swapped (outcome) reward. ``env_reward`` is the raw per-step environment
  reward (including the invalid-action penalty), ``dense_reward`` the process
  reward slot (filled by a dense reward source, NaN when unset).
  """

  task_id: int
  group_id: int  # episodes of one group share task_id (GRPO/GiGPO groups)
  traj_id: int  # unique per episode within a collection
  step_idx: int
  prompt_ids: np.ndarray  # int32 [P]
  response_ids: np.ndarray  # int32 [R]
  behavior_logp: np.ndarray  # float32 [R], log pi_behaviour(response token)
  policy_tag: str = POLICY_A
  weight_version: int = 0
  env_reward: float = 0.0
  dense_reward: float = float("nan")
  outcome_reward: float = 0.0  # 10 * won for the whole episode, on every step
  won: bool = False
  score: float = 0.0  # task score of the episode (WebShop 0..1)
  done: bool = False  # last step of its episode
  invalid: bool = False  # reply had no valid <action> tag
  anchor_obs: str = ""  # GiGPO anchor observation text for this step
  action: str = ""  # parsed action text sent to the environment
  failed: bool = False  # environment worker crashed during this episode
  task_type: str = ""


class Batch(NamedTuple):
  """A learner batch, all arrays [B, T] unless noted (see module doc).

  Fields unused by an algorithm are zeros (never None) so one jitted step
  serves every configuration.
  """

  tokens: Any  # int32 [B, T]
  positions: Any  # int32 [B, T], 0.. for real tokens
  attention_mask: Any  # bool/int [B, T], 1 on real (non-pad) tokens
  loss_mask: Any  # float32 [B, T], 1 on response tokens
  advantages: Any  # float32 [B, T]
  old_logp: Any  # float32 [B, T], log pi_old (A at the start of the update)
  ref_logp: Any  # float32 [B, T], log pi_ref
  behavior_logp: Any  # float32 [B, T], log pi_B for replayed rows, else old
  returns: Any  # float32 [B, T], PPO value targets
  old_values: Any  # float32 [B, T], PPO critic values at collection time
  is_offpolicy: Any  # bool [B], row sampled from the replay buffer


@dataclasses.dataclass
class Trajectory:
  """All steps of one episode, in order."""

  steps: list[StepRecord]

  @property
  def outcome_reward(self) -> float:
    return self.steps[-1].outcome_reward if self.steps else 0.0

  @property
  def task_id(self) -> int:
    return self.steps[0].task_id

  @property
  def group_id(self) -> int:
    return self.steps[0].group_id


def group_trajectories(records: list[StepRecord]) -> list[Trajectory]:
  """Groups step records into trajectories by traj_id, steps in order."""
  by_traj: dict[int, list[StepRecord]] = {}
  for r in records:
    by_traj.setdefault(r.traj_id, []).append(r)
  return [
      Trajectory(sorted(s, key=lambda r: r.step_idx))
      for _, s in sorted(by_traj.items())
  ]
