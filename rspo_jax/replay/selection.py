"""Which trajectories of the replay buffer D one step of A replays.

Alpha is a share of training *samples* (paper: "14 online + 2 offline" of a
16-task batch of groups of 8; PPO: 112 online + 16 replayed of 128):

  n_off = floor(alpha * batch_tasks * group_size + 1/2)   replayed trajectories
  n_on  = batch_tasks - ceil(n_off / group_size)           fresh groups

so the replayed trajectories take the group slots they fill, rounded up
(alpha = 1/8, 16 x 8: 16 trajectories, 14 groups; alpha * batch_tasks need
not be an integer: alpha = 1/8, 4 x 4 replays 2 trajectories beside 3 fresh
groups).

A step's ``n_off`` trajectories are ranked by ``strategy``:
  * 'reward'   successful trajectories (last step ``won``) first, then by
               outcome reward R, highest first; ties in random order;
  * 'variance' by the outcome-reward variance of the trajectory's group
               (population: Var_g = mean_i (R_i - mean_j R_j)^2), highest
               first; a group's trajectories stay together, in random
               order (the strategy chooses groups by their spread, not by
               wins; 'reward' is the one that prefers wins); tied groups in
               random order;
  * 'random'   a uniform permutation.
Every random choice uses the caller's ``np.random.Generator``; the result
does not depend on the order trajectories are given in (they are ranked
from ascending ``traj_id``), so hosts holding the same D and generator
select the same trajectories.

Within a loop, ``used`` holds the traj_ids already replayed from D. Two
rules pick a step's ``n_off`` trajectories from the ranking:

  * reuse='wins' (the default for 'reward'; docs/method.md section 4):
    every step prefers wins -- unused wins, then wins already replayed,
    then unused other trajectories, then replayed others, each in rank
    order, never a trajectory twice in one step. With B winning ~1/3 of
    its episodes, the one-pass rule below spends D's wins in A's first
    step and leaves the last steps of a loop replaying failures only
    (negative-heavy replay, which reward-based sampling exists to avoid).
    ``used`` only grows; ``restarted`` says the step replayed a trajectory
    again.
  * reuse='pass' (the earlier rule; 'variance' and 'random' always): unused
    first. A step takes the best-ranked trajectories not in ``used``; when
    fewer than ``n_off`` unused ones remain it takes all of them, starts a
    new pass (``used`` is emptied) and fills the rest of the step from the
    top of the whole of D. The returned ``used`` is then the trajectories
    drawn in the new pass only, and ``restarted`` says the pass began
    again.
numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

import numpy as np

from rspo_jax.types import Trajectory

STRATEGIES = ("reward", "variance", "random")
REUSE = ("wins", "pass")


def replay_counts(
    alpha: float, batch_tasks: int, group_size: int
) -> tuple[int, int]:
  """(n_off replayed trajectories, n_on fresh groups) of one step of A
  (module docstring)."""
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha={alpha} must be in [0, 1]")
  if batch_tasks < 1 or group_size < 1:
    raise ValueError(
        f"batch_tasks={batch_tasks}, group_size={group_size} must be >= 1"
    )
  n_off = int(math.floor(alpha * batch_tasks * group_size + 0.5))
  return n_off, batch_tasks - math.ceil(n_off / group_size)


def rank(
    group_ids: Sequence[int],
    rewards: Sequence[float],
    won: Sequence[bool],
    strategy: str,
    rng: np.random.Generator,
) -> np.ndarray:
  """Indices of the given trajectories, best first, under ``strategy``
  (module docstring). NaN rewards rank last."""
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy {strategy!r} is not one of {STRATEGIES}")
  g = np.asarray(group_ids)
  raw = np.asarray(rewards, np.float64)
  r = np.nan_to_num(raw, nan=-np.inf)
  w = np.asarray(won, bool)
  n = len(g)
  if not len(r) == len(w) == n:
    raise ValueError(f"{n} group ids, {len(r)} rewards, {len(w)} won flags")
  tie = rng.permutation(n)
  if strategy == "random":
    return tie
  if strategy == "reward":
    return np.lexsort((tie, -r, ~w))  # the last key is the primary one
  groups, gi = np.unique(g, return_inverse=True)
  gi = gi.ravel()
  var = np.nan_to_num(
      [raw[gi == k].var() for k in range(len(groups))], nan=-np.inf
  )
  group_tie = rng.permutation(len(groups))
  return np.lexsort((tie, group_tie[gi], -var[gi]))


@dataclasses.dataclass
class Selection:
  """One step's replayed trajectories, best first, and the new used set."""

  trajectories: list[Trajectory]
  used: list[int]  # traj_ids replayed (reuse='pass': in this pass), sorted
  restarted: bool  # a trajectory was replayed again (a new pass began)


def select(
    trajectories: Sequence[Trajectory],
    n: int,
    strategy: str,
    rng: np.random.Generator,
    used: Iterable[int] = (),
    reuse: str = "wins",
) -> Selection:
  """The ``min(n, len(trajectories))`` trajectories one step replays
  (module docstring); ``reuse`` applies to 'reward' only."""
  if n < 0:
    raise ValueError(f"n={n} must be >= 0")
  if reuse not in REUSE:
    raise ValueError(f"reuse {reuse!r} is not one of {REUSE}")
  trajs = sorted(trajectories, key=lambda t: t.steps[0].traj_id)
  ids = [t.steps[0].traj_id for t in trajs]
  if len(set(ids)) != len(ids):
    raise ValueError("trajectories repeat a traj_id")
  won = [bool(t.steps[-1].won) for t in trajs]
  order = rank(
      [t.group_id for t in trajs],
      [t.outcome_reward for t in trajs],
      won,
      strategy,
      rng,
  )
  used = set(used) & set(ids)
  if strategy == "reward" and reuse == "wins":
    tiers = [
        [i for i in order if won[i] == w and (ids[i] in used) == u]
        for w, u in ((True, False), (True, True), (False, False), (False, True))
    ]
    take = sum(tiers, [])[:n]
    restarted = any(ids[i] in used for i in take)
    used |= {ids[i] for i in take}
    return Selection([trajs[i] for i in take], sorted(used), restarted)
  take = [i for i in order if ids[i] not in used][:n]
  restarted = len(take) < min(n, len(trajs))
  if restarted:  # D has no unused trajectory left: a new pass over D
    taken = set(take)
    more = [i for i in order if i not in taken][: n - len(take)]
    take += more
    used = {ids[i] for i in more}
  else:
    used |= {ids[i] for i in take}
  return Selection([trajs[i] for i in take], sorted(used), restarted)
