"""A's replayed rows: how many (alpha as a share of samples) and which
trajectories of D, with their advantages against their whole B group.

Every host reads the same D and ranks it with the same generator
(seeds.replay_rng) and used set (``LoopState.replay_used``): ``n_off``
trajectories, unused ones first, chosen by ``rspo.sampling`` (reward /
variance / random; replay/selection.py); each host keeps its
``distributed.host_share`` of them.
"""

from __future__ import annotations

import logging

from rspo_jax import distributed
from rspo_jax.loop import seeds
from rspo_jax.replay import replayed, selection

log = logging.getLogger(__name__)


def counts(cfg, d_empty: bool) -> tuple[int, int]:
  """(n_off replayed trajectories, n_on fresh groups) of A's step:
  alpha as a share of samples (``selection.replay_counts``),
  n_off = alpha * batch_tasks * group_size (rounded); no replay for the
  baselines and while D is empty (``d_empty``: RSPO_H's first loop)."""
  if not cfg.rspo.enabled or d_empty:
    return 0, cfg.train.batch_tasks
  return selection.replay_counts(
      cfg.rspo.alpha, cfg.train.batch_tasks, cfg.train.group_size
  )


def draw(cfg, d: list, n_off: int, state):
  """This host's replayed records of A's step (``n_off`` trajectories of
  ``d``, D's trajectories) and their advantages against their whole group
  of D (None for PPO: GAE at the step); ``state.replay_used`` updated."""
  sel = selection.select(
      d,
      n_off,
      cfg.rspo.sampling,
      seeds.replay_rng(cfg.seed, state.a_steps),
      state.replay_used,
      cfg.rspo.replay_reuse,
  )
  if sel.restarted:
    log.info("this step replays trajectories of D again")
  state.replay_used = sel.used
  first, last = distributed.host_share(len(sel.trajectories))
  adv = replayed.advantages_in_buffer(
      d, cfg.algo, invalid_action_penalty=cfg.algo.invalid_action_penalty
  )
  return replayed.rows(sel.trajectories[first:last], adv)
