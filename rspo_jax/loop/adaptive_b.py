"""Adaptive B (beyond the paper): B trains until it wins enough.

With a fixed k, B can raise its dense return for k steps and still store
no win (spell, L = 6, seeds 200 and 400: B's lift 0 in every loop), so A
replays nothing it could learn from and the next loop restarts B from the
same A. With ``rspo.b_k_max`` > k, B takes its k steps, then keeps going
while the win rate of its newest training collection is below the target,
up to ``b_k_max`` steps. The newest collection is on fresh tasks, played
before B trains on them, so it measures the current B out of sample.

The target, with ``p_A`` A's win rate (B's first collection: B = A), ``n``
the episodes of a collection and ``m = rspo.b_win_multiple``::

    p = clip(p_A, 1 / n, 1 - 1 / n)      # at least one win, one loss
    odds_B = m * p / (1 - p)
    target = odds_B / (1 + odds_B)

B's odds of a win are m times A's: about m * p_A while A rarely wins, and
below 1 however often A wins. When B reaches the target, the batch that
showed it is not trained on (its environment steps count all the same).
"""

from __future__ import annotations


def win_target(a_success: float, episodes: int, multiple: float) -> float:
  """B's win rate at which it stops: its odds ``multiple`` times A's
  (``a_success`` clipped to [1/episodes, 1 - 1/episodes])."""
  floor = 1.0 / episodes
  p = min(max(a_success, floor), 1.0 - floor)
  odds = multiple * p / (1.0 - p)
  return odds / (1.0 + odds)


def max_steps(rspo_cfg) -> int:
  """The most steps B takes in a loop: k, or ``b_k_max`` when adaptive."""
  return max(rspo_cfg.k, rspo_cfg.b_k_max)


def is_adaptive(rspo_cfg) -> bool:
  return rspo_cfg.b_k_max > rspo_cfg.k
