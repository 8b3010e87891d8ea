"""WebShopEnv stepping speed: one JSON line per batch size.

  python bench/envs_webshop.py [--batch_sizes=1,16,128] [--steps=3000]

A batch of ``B`` environment instances (groups of 8 sharing a task, as in
GRPO) is stepped round-robin in one process, each with a seeded policy that
takes the expert's action half of the time and a random admissible action
otherwise (so every page kind is visited); finished episodes reset to the
next task. Reports environment steps per second (``reset`` and policy time
included), plus the one-off world build time.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from third_party_envs.webshop import catalogue
from third_party_envs.webshop import world as world_lib
from third_party_envs.webshop.env import WebShopEnv

GROUP = 8


def _policy(env: WebShopEnv, step, rng: random.Random) -> str:
  if rng.random() < 0.5:
    return env.expert_action()
  action = rng.choice(step.admissible_actions)
  if action == "search[<your query>]":
    action = f"search[{catalogue.search_words(env.goal)}]"
  return action


def bench(batch_size: int, total_steps: int, seed: int = 0) -> dict:
  rng = random.Random(seed)
  envs = [WebShopEnv() for _ in range(batch_size)]
  n_tasks = envs[0].num_tasks("train")
  next_task = [0]

  def new_task(i):
    return (next_task[0] + i // GROUP) % n_tasks

  steps = [env.reset(new_task(i), "train") for i, env in enumerate(envs)]
  done_steps, episodes = 0, 0
  start = time.perf_counter()
  while done_steps < total_steps:
    for i, env in enumerate(envs):
      steps[i] = env.step(_policy(env, steps[i], rng))
      done_steps += 1
      if steps[i].done:
        episodes += 1
        next_task[0] += 1
        steps[i] = env.reset(new_task(i), "train")
  seconds = time.perf_counter() - start
  return dict(
      bench="webshop_env_step",
      batch_size=batch_size,
      steps=done_steps,
      episodes=episodes,
      seconds=round(seconds, 4),
      steps_per_s=round(done_steps / seconds, 1),
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch_sizes", default="1,16,128")
  parser.add_argument("--steps", type=int, default=3000)
  args = parser.parse_args(argv)
  start = time.perf_counter()
  world_lib.make_world()
  build = time.perf_counter() - start
  for b in (int(x) for x in args.batch_sizes.split(",")):
    row = bench(b, max(args.steps, b))
    row["world_build_s"] = round(build, 3)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
