"""AlfWorldEnv stepping speed: one JSON line per batch size.

  python bench/envs_alfworld.py [--batch_sizes=1,16,128] [--steps=2000]
                                [--tasks=48] [--cache_dir=DIR]

First ``--tasks`` train games are generated (or found) in the cache and the
generation time per game is reported (``gen_s_per_game``; 0 when cached).
Then a batch of ``B`` instances (groups of 8 sharing a task, as in GRPO) is
stepped round-robin in one process, each with a seeded policy that takes the
expert's action half of the time and a random admissible action otherwise;
an episode ends when won or after 50 steps (verl-agent's ALFWorld budget)
and the instance resets to the next task (cycling over the generated ones).
Reports environment steps per second (``reset``, dense reward and policy
time included) and episodes won.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

from third_party_envs.alfworld.env import AlfWorldEnv

GROUP = 8
MAX_STEPS = 50


def _policy(env: AlfWorldEnv, step, rng: random.Random) -> str:
  if rng.random() < 0.5:
    action = env.expert_action()
    if action is not None:
      return action
  return rng.choice(step.admissible_actions)


def bench(
    batch_size: int,
    total_steps: int,
    n_tasks: int,
    cache_dir: str,
    seed: int = 0,
) -> dict:
  rng = random.Random(seed)
  envs = [AlfWorldEnv(cache_dir=cache_dir) for _ in range(batch_size)]
  next_task = [0]

  def new_task(i):
    return (next_task[0] + i // GROUP) % n_tasks

  steps = [env.reset(new_task(i), "train") for i, env in enumerate(envs)]
  lengths = [0] * batch_size
  done_steps = episodes = wins = 0
  start = time.perf_counter()
  while done_steps < total_steps:
    for i, env in enumerate(envs):
      steps[i] = env.step(_policy(env, steps[i], rng))
      lengths[i] += 1
      done_steps += 1
      if steps[i].done or lengths[i] >= MAX_STEPS:
        episodes += 1
        wins += steps[i].won
        next_task[0] += 1
        steps[i], lengths[i] = env.reset(new_task(i), "train"), 0
  seconds = time.perf_counter() - start
  for env in envs:
    env.close()
  return dict(
      bench="alfworld_env_step",
      batch_size=batch_size,
      steps=done_steps,
      episodes=episodes,
      wins=wins,
      seconds=round(seconds, 4),
      steps_per_s=round(done_steps / seconds, 1),
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch_sizes", default="1,16,128")
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--tasks", type=int, default=48)
  parser.add_argument(
      "--cache_dir",
      default=None,
      help="game cache (default: a fresh temporary dir)",
  )
  args = parser.parse_args(argv)
  cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="alfworld_bench_")
  env = AlfWorldEnv(cache_dir=cache_dir)
  start = time.perf_counter()
  for task_id in range(args.tasks):
    env.game_file(task_id, "train")
  gen_s = (time.perf_counter() - start) / args.tasks
  for b in (int(x) for x in args.batch_sizes.split(",")):
    row = bench(b, max(args.steps, b), args.tasks, cache_dir)
    row["gen_s_per_game"] = round(gen_s, 4)
    row["cache_dir"] = os.path.abspath(cache_dir)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
