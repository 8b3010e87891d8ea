r"""RSPO's mechanism in its smallest form: GRPO vs RSPO+GRPO on the toy.

  python bench/toy_mechanism.py                      # 2 arms x 5 seeds
  python bench/toy_mechanism.py --max_cells 2        # a few cells a call
  python bench/toy_mechanism.py --report_only        # tables from the JSON

Task (the learning guard's, tests/learning_guard_test.py): distant targets
(``min_distance=4``) upward on the number line; A starts from the toy
expert's 60-step behaviour-cloning warm start on both directions, whose
greedy reply is 'dec' in every state (0 % greedy on the task; its own
T = 1 samples win 8.6 %: the outcome reward is sparse). The dense reward is the
environment's progress signal (``rspo.dense_reward=oracle``):

  dense_t = (|x_{t-1} - n| - |x_t - n|) / |x_0 - n|.

Arms (nano policy, ``--steps`` A steps of 4 tasks x 8 episodes, lr
``--lr``, 2 updates a step; everything else the toy CPU recipe):
  grpo   ``rspo=0``: A on fresh groups, outcome reward;
  rspo   ``rspo=1``, k = 3, alpha = 1/4: per loop B := A, 3 steps of B on
         the dense reward, B's stored collection D, then 3 steps of A on 3
         fresh groups + 8 replayed trajectories of D (outcome advantages).
Seeds ``--seeds`` vary the RL (sampling, tasks, updates); the warm start is
one (seed 0), made once into ``<root>/warm_start``.

Per cell: A's greedy success on the 64 held-out ``valid_seen`` tasks every
``--eval_every`` A steps (and at 0), each with the environment steps spent
so far (A's and B's collections), and A's rollout success per step. Cells
are written into ``--out`` (JSON) as they finish; a call skips finished
cells (resumable: each cell restarts from scratch in its workdir). The
report ``--md`` gives, per arm and evaluation, the mean over seeds with a
95 % bootstrap interval over seeds x tasks (rspo_jax/intervals.py), and
the difference rspo - grpo at equal A steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ARMS = {"grpo": "rspo=0", "rspo": "rspo=1,rspo.k=3,rspo.alpha=0.25"}
DISTANT = {"min_distance": 4}
COMMON = ("model=nano,env.max_steps=12,env.history_length=0,"
          "env.num_eval_tasks=64,rspo.dense_reward=oracle")
WARM_START = "seed=0,sft.steps=60"
SAMPLING_SEEDS = (0, 1)  # the T = 1 evaluation's


def config(env_kwargs: dict, overrides: str):
  from configs import base

  cfg = base.make_config("toy", "grpo", f"{COMMON},{overrides}")
  with cfg.unlocked():
    cfg.env.kwargs = env_kwargs
    cfg.mesh.shape = (1, 1, 1)
  base.validate(cfg)
  return cfg


def cell_overrides(arm: str, seed: int, args, checkpoint: str) -> str:
  return (f"{ARMS[arm]},seed={seed},steps={args.steps},train.lr={args.lr},"
          "train.batch_tasks=4,train.group_size=8,train.updates_per_step=2,"
          f"train.max_train_rows=0,train.eval_every={args.eval_every},"
          f"model.checkpoint_dir={checkpoint}")


def warm_start(root: str) -> str:
  from rspo_jax import build

  path = os.path.join(root, "warm_start")
  if not os.path.exists(os.path.join(path, "warm_start", "config.json")):
    build.build_run(config(DISTANT, WARM_START), path, progress=False).close()
  return os.path.join(path, "warm_start")


def run_cell(arm: str, seed: int, args, checkpoint: str) -> dict:
  from rspo_jax import build
  from rspo_jax import evaluate as evaluate_lib

  workdir = os.path.join(args.root, f"{arm}_s{seed}")
  shutil.rmtree(workdir, ignore_errors=True)  # a cell restarts whole
  cfg = config(dict(DISTANT, direction="up"),
               cell_overrides(arm, seed, args, checkpoint))
  t0 = time.perf_counter()
  run = build.build_run(cfg, workdir, progress=False)
  evals = []

  def evaluate(learner, step):
    out = run.evaluate(learner, step)  # greedy; leaves A's weights synced
    sampled = evaluate_lib.evaluate(
        run.engine, run.venv, run.tokenizer,
        build.collect_config(cfg, cfg.env.eval_split),
        list(range(cfg.env.num_eval_tasks)), temperature=1.0,
        max_new_tokens=cfg.rollout.max_new_tokens, seeds=SAMPLING_SEEDS)
    evals.append({"a_step": step, "env_steps": run.trainer.state.env_steps,
                  "success_rate": out["success_rate"],
                  "won": [e["won"] for e in out["per_task"]],
                  "t1_success_rate": sampled["success_rate"],
                  "t1_won": [[e["won"] for e in sampled["per_task"]
                              if e["seed"] == s] for s in SAMPLING_SEEDS]})
    return {"success_rate": out["success_rate"],
            "t1_success_rate": sampled["success_rate"]}

  try:
    evaluate(run.trainer.a, 0)
    run.trainer.run(evaluate)
    if evals[-1]["a_step"] != args.steps:
      evaluate(run.trainer.a, args.steps)
  finally:
    run.close()
  rows = [json.loads(line) for line in open(
      os.path.join(workdir, "metrics.jsonl"))]
  rollouts = [{"a_step": r["step"], "env_steps": r["env_steps"],
               "success_rate": r["rollout_success_rate"]}
              for r in rows if r["phase"] == "A"]
  b_rollouts = [{"loop_a_step": r["step"],
                 "success_rate": r["rollout_success_rate"],
                 "dense_reward_mean": r.get("dense_reward_mean")}
                for r in rows if r["phase"] == "B"]
  return {"arm": arm, "seed": seed, "overrides": cfg_string(cfg, arm, seed,
                                                             args),
          "evals": evals, "rollouts": rollouts, "b_rollouts": b_rollouts,
          "wall_s": round(time.perf_counter() - t0, 1)}


def cfg_string(cfg, arm, seed, args) -> str:
  del cfg
  return cell_overrides(arm, seed, args, "<root>/warm_start/warm_start")


def load(path: str) -> dict:
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  return {"cells": {}}


def save(path: str, data: dict) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(data, f, separators=(",", ":"))
  os.replace(path + ".tmp", path)


# ------------------------------------------------------------------ report
def arm_cells(data: dict, arm: str) -> list:
  return sorted((c for c in data["cells"].values() if c["arm"] == arm),
                key=lambda c: c["seed"])


def outcomes(cells: list, key: str) -> np.ndarray:
  """x[r, e, g, s] of evaluation ``e``: greedy (``won``, s = 1) or T = 1
  (``t1_won``, s = sampling seeds)."""
  if key == "won":
    return np.array([[np.asarray(e["won"])[:, None] for e in c["evals"]]
                     for c in cells], float)
  return np.array([[np.asarray(e["t1_won"]).T for e in c["evals"]]
                   for c in cells], float)


def report(data: dict, command: str) -> str:
  from rspo_jax import intervals

  pct = lambda d: (f"{100 * d['mean']:.1f} [{100 * d['lo']:.1f},"
                   f" {100 * d['hi']:.1f}]")
  doc = __doc__[__doc__.index("Task ("):__doc__.index("Per cell")].rstrip()
  lines = [f"Command: `{command}` (resumable; `--max_cells N` a call)", "",
           "```", doc, "```", "",
           "Success of A on the 64 held-out tasks, % with a 95 % bootstrap"
           " interval over training seeds x tasks (x sampling seeds for"
           " T = 1); env steps: A's and B's collections so far, mean over"
           " seeds.", ""]
  found = {arm: arm_cells(data, arm) for arm in ARMS}
  for arm, cells in found.items():
    if not cells:
      continue
    greedy, sampled = outcomes(cells, "won"), outcomes(cells, "t1_won")
    lines += [f"## {arm} (seeds {[c['seed'] for c in cells]})", "",
              "| A step | env steps | greedy % | T = 1 % |",
              "|---:|---:|---|---|"]
    for i, e in enumerate(cells[0]["evals"]):
      env_steps = np.mean([c["evals"][i]["env_steps"] for c in cells])
      lines.append(
          f"| {e['a_step']} | {env_steps:.0f} |"
          f" {pct(intervals.success_interval(greedy[:, i]))} |"
          f" {pct(intervals.success_interval(sampled[:, i]))} |")
    lines.append("")
  a, b = found["rspo"], found["grpo"]
  if a and b:
    lines += ["## rspo - grpo at equal A steps (points)", "",
              "| A step | greedy | T = 1 |", "|---:|---|---|"]
    for i, e in enumerate(a[0]["evals"]):
      d = [intervals.method_difference(outcomes(a, k)[:, i],
                                       outcomes(b, k)[:, i])
           for k in ("won", "t1_won")]
      lines.append(f"| {e['a_step']} | {pct(d[0])} | {pct(d[1])} |")
    lines.append("")
    lines += ["## B's own rollouts (rspo): success % of B's k = 3 training"
              " steps of each loop, mean over seeds", "",
              "| loop (A steps before it) | B step 1 | B step 2 | B step 3 |",
              "|---:|---|---|---|"]
    loops = sorted({r["loop_a_step"] for r in a[0]["b_rollouts"]})
    for start in loops:
      per = [[r["success_rate"] for r in c["b_rollouts"]
              if r["loop_a_step"] == start] for c in a]
      mean = np.mean(np.array(per), axis=0) * 100
      lines.append(f"| {start} | " + " | ".join(f"{m:.1f}" for m in mean)
                   + " |")
    lines.append("")
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root", default=os.path.join(ROOT, "runs",
                                                "toy_mechanism"))
  p.add_argument("--out", default=os.path.join(
      ROOT, "docs", "results", "toy_mechanism.json"))
  p.add_argument("--md", default=os.path.join(
      ROOT, "docs", "results", "toy_mechanism.md"))
  p.add_argument("--arms", default="grpo,rspo")
  p.add_argument("--seeds", default="0,1,2,3,4")
  p.add_argument("--steps", type=int, default=12)
  p.add_argument("--eval_every", type=int, default=3)
  p.add_argument("--lr", type=float, default=1e-4)
  p.add_argument("--max_cells", type=int, default=0,
                 help="stop after this many new cells (0: all)")
  p.add_argument("--report_only", action="store_true")
  args = p.parse_args(argv)
  data = load(args.out)
  settings = {k: getattr(args, k) for k in ("steps", "eval_every", "lr")}
  if data.get("settings", settings) != settings:
    raise SystemExit(f"{args.out} holds cells of {data['settings']}, not"
                     f" {settings}: use another --out")
  data["settings"] = settings
  if not args.report_only:
    checkpoint = warm_start(args.root)
    done = 0
    for seed in [int(s) for s in args.seeds.split(",")]:
      for arm in args.arms.split(","):
        key = f"{arm}_s{seed}"
        if key in data["cells"]:
          continue
        if args.max_cells and done >= args.max_cells:
          break
        data["cells"][key] = run_cell(arm, seed, args, checkpoint)
        save(args.out, data)
        done += 1
        cell = data["cells"][key]
        print(json.dumps({"cell": key, "wall_s": cell["wall_s"], "greedy": [
            e["success_rate"] for e in cell["evals"]]}), flush=True)
  command = (f"python bench/toy_mechanism.py --steps {args.steps}"
             f" --eval_every {args.eval_every} --lr {args.lr:g}"
             f" --seeds {args.seeds}")
  write_report(args.md, report(data, command))


MARK = "<!-- generated by bench/toy_mechanism.py below -->"


def write_report(path: str, tables: str) -> None:
  """Replaces what follows MARK in ``path`` (the text above it, a reading
  of the results, is kept)."""
  head = "# Toy mechanism study: GRPO vs RSPO+GRPO\n\n"
  if os.path.exists(path):
    with open(path) as f:
      text = f.read()
    if MARK in text:
      head = text[:text.index(MARK)]
  with open(path + ".tmp", "w") as f:
    f.write(f"{head}{MARK}\n\n{tables}\n")
  os.replace(path + ".tmp", path)


if __name__ == "__main__":
  main()
