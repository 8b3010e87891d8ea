"""Every random stream of the RSPO loop, by role and step, in one place.

Each stream, its seed and what it decides:

  task draws        numpy generator seeded ``[seed, 1, collection]``: the
                    tasks of collection number ``collection``
  replay choice     numpy generator seeded ``[seed, 4, a_steps]``: which
                    trajectories of D A's step replays
                    (replay/selection.py)
  per-host draws    the update's generators (noise, row subsets,
                    mini-batch order: update.py) seeded
                    ``[seed, role, step_key]``, plus the process index on
                    a multi-host run (hosts draw different rows)
  sampling seeds    ``seed * 7919 + collection`` for a collection's groups,
                    ``+ 104_729 * process`` on host ``process``,
                    ``+ 1_000_003 * round`` for its r-th round of groups
                    (collection.py)
  update keys       ``jax.random.fold_in`` of the role, then the step(s),
                    into key 0, as a 31-bit int (``step_key`` of
                    update.py): A's step t folds (A, t), B's step i of loop
                    L folds (B, L, i): keys of different roles or steps
                    are independent however many loops or steps a run
                    takes (an arithmetic key such as 10**6 + 97 L + i
                    repeats once k > 97)
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

# The roles folded into the update keys.
ROLE_A, ROLE_B = 1, 2


def rng(seed: int, *keys) -> np.random.Generator:
  """A numpy generator of the run's ``seed`` and ``keys``."""
  return np.random.default_rng([seed, *keys])


def host_rng(
    seed: int, process_index: Optional[int], *keys
) -> np.random.Generator:
  """Per-host draws (noise, row subsets): ``rng`` with the process index
  appended on a multi-host run (``process_index`` None with one)."""
  if process_index is not None:
    keys = keys + (process_index,)
  return rng(seed, *keys)


def task_rng(seed: int, collection: int) -> np.random.Generator:
  """The generator that draws collection number ``collection``'s tasks."""
  return rng(seed, 1, collection)


def replay_rng(seed: int, a_steps: int) -> np.random.Generator:
  """The generator that ranks D for A's step after ``a_steps`` steps."""
  return rng(seed, 4, a_steps)


def sampling_seed(seed: int, collection: int) -> int:
  """The engine's sampling seed of collection number ``collection``."""
  return seed * 7919 + collection


def host_sampling_seed(
    seed: int, collection: int, process_index: Optional[int]
) -> int:
  """``sampling_seed`` of this host (``process_index`` None with one
  process): hosts draw different samples."""
  out = sampling_seed(seed, collection)
  if process_index is not None:
    out += 104_729 * process_index
  return out


def round_seed(seed: int, round_index: int) -> int:
  """The sampling seed of a collection's ``round_index``-th round."""
  return seed + 1_000_003 * round_index


def folded_key(*data: int) -> int:
  """An int in [0, 2**31): ``data`` folded in turn into key 0
  (``jax.random.fold_in``), then 32 random bits of that key halved."""
  key = jax.random.key(0)
  for d in data:
    key = jax.random.fold_in(key, d)
  return int(jax.random.bits(key, dtype=jnp.uint32)) >> 1


def a_step_key(a_steps: int) -> int:
  """The update's key of A's step after ``a_steps`` steps."""
  return folded_key(ROLE_A, a_steps)


def b_step_key(loop: int, step: int) -> int:
  """The update's key of B's step ``step`` (0..k-1; adaptive B: up to
  b_k_max - 1) of loop ``loop``."""
  return folded_key(ROLE_B, loop, step)
