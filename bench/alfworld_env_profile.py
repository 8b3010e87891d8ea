"""ALFWorld env cost per reset and per step, in one process: one JSON line.

  python bench/alfworld_env_profile.py [--tasks=16] [--group=1]
      [--turns=20] [--split=valid_seen] [--seed=0] [--repeats=1]
  python -m cProfile -s cumtime bench/alfworld_env_profile.py ...

``--tasks`` task ids of ``--split`` under the CPU recipe's env kwargs
(``configs/scales.py`` CPU ``env.kwargs['alfworld']``: two task types,
the searching expert, dense reward on), ``--group`` instances per task (the
A step's GRPO groups: 8), all reset, then stepped round-robin for
``--turns`` turns (the A step's shape) with a seeded random admissible
action each (an instance that won resets to its task). Games come from the
default cache, generated outside the timings; an untimed first reset per
instance, on one of the next ``--tasks`` task ids, builds the engines (the
loop's workers keep theirs from step to step), so the timed games are new
to the process as an A step's are.

``--tasks=8 --group=8 --split=train`` is one of the CPU A step's two
environment workers (64 of its 128 episodes, 8 tasks).

  reset_ms = reset seconds / resets,  step_ms = step seconds / steps,
  turn_ms  = (resets + steps seconds) / steps (what a rollout turn costs).
"""

from __future__ import annotations

import argparse
import json
import random
import time

from configs import scales
from third_party_envs.alfworld.env import AlfWorldEnv


def cpu_kwargs() -> dict:
  """The CPU recipe's AlfWorldEnv keyword arguments."""
  return dict(scales.CPU["env.kwargs"]["alfworld"])


def play(
    tasks: int, group: int, turns: int, split: str, seed: int, env_factory=None
) -> dict:
  """Resets ``tasks * group`` instances and steps them ``turns`` times."""
  make = env_factory or (lambda: AlfWorldEnv(**cpu_kwargs()))
  envs = [make() for _ in range(tasks * group)]
  for i, env in enumerate(envs):  # engines built (the loop's workers keep
    env.reset(tasks + i // group, split)  # theirs) on other games
    env.game_file(i // group, split)  # generated outside the timings
  rng = random.Random(seed)
  reset_s = step_s = 0.0
  resets = steps = wins = 0
  tic = time.perf_counter()
  last = [env.reset(i // group, split) for i, env in enumerate(envs)]
  reset_s += time.perf_counter() - tic
  resets += len(envs)
  for _ in range(turns):
    for i, env in enumerate(envs):
      action = rng.choice(last[i].admissible_actions)
      tic = time.perf_counter()
      last[i] = env.step(action)
      step_s += time.perf_counter() - tic
      steps += 1
      if last[i].done:
        wins += 1
        tic = time.perf_counter()
        last[i] = env.reset(i // group, split)
        reset_s += time.perf_counter() - tic
        resets += 1
  for env in envs:
    env.close()
  return dict(
      resets=resets,
      steps=steps,
      wins=wins,
      reset_s=round(reset_s, 4),
      step_s=round(step_s, 4),
      reset_ms=round(1e3 * reset_s / resets, 3),
      step_ms=round(1e3 * step_s / steps, 3),
      turn_ms=round(1e3 * (reset_s + step_s) / steps, 3),
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tasks", type=int, default=16)
  parser.add_argument("--group", type=int, default=1)
  parser.add_argument("--turns", type=int, default=20)
  parser.add_argument("--split", default="valid_seen")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--repeats", type=int, default=1)
  args = parser.parse_args(argv)
  for _ in range(args.repeats):
    row = play(args.tasks, args.group, args.turns, args.split, args.seed)
    print(
        json.dumps(
            dict(
                bench="alfworld_env_profile",
                split=args.split,
                tasks=args.tasks,
                group=args.group,
                turns=args.turns,
                **row,
            )
        ),
        flush=True,
    )


if __name__ == "__main__":
  main()
