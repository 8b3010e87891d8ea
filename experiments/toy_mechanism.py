r"""RSPO's mechanism in its smallest form: GRPO vs RSPO+GRPO on the toy.

  python experiments/toy_mechanism.py                      # 5 arms x 5 seeds
  python experiments/toy_mechanism.py --arms grpo,rspo     # some arms
  python experiments/toy_mechanism.py --max_cells 2        # a few cells a call
  python experiments/toy_mechanism.py --report_only        # tables from JSON

Task (the learning guard's, tests/learning_guard_test.py): distant targets
(``min_distance=4``) upward on the number line; A starts from the toy
expert's 60-step behaviour-cloning warm start on both directions, whose
greedy reply is 'dec' in every state (0 % greedy on the task; its own
T = 1 samples win 8.6 %: the outcome reward is sparse). The dense reward is the
environment's progress signal (``rspo.dense_reward=oracle``):

  dense_t = (|x_{t-1} - n| - |x_t - n|) / |x_0 - n|,

or, in the misaligned arms, its decoy variant (third_party_envs/toy.py,
``dense_target_offset = -24``): progress toward m = n - 24, out of reach
below every start (x_0 - m >= 15 > 12 steps), i.e. the progress signal
with its sign flipped on these upward tasks: +1/|x_0 - n| a 'dec',
-1/|x_0 - n| an 'inc'. Why so blunt: in this budget GRPO moves the action
marginal p(inc), not the comparison (tests/learning_guard_test.py), and
subtler proxies do not pay a marginal policy for failing. Simulated
marginal policies on these tasks (2000 episodes each; success %, mean
dense return):
  p(inc)        0.25       0.45 (warm start)  0.65       0.8        1.0
  aligned       0, -1.21   9, -0.25           44, 0.56   82, 0.91   100, 1.00
  decoy n - 2   0, -1.21   9, -0.33           44, 0.16   82, 0.23   100, 0.20
  decoy n - 24  0, 1.21    9, 0.25            44, -0.56  82, -0.91  100, -1.00
A decoy short of the target (it pays for stopping 2 short and dithering)
pays most near p = 0.8, where success is 82 %: only a policy that has the
comparison could exploit it. The out-of-reach decoy pays for failing at
every p.

Arms (nano policy, ``--steps`` A steps of 4 tasks x 8 episodes, lr
``--lr``, 2 updates a step; everything else the toy CPU recipe):
  grpo   ``rspo=0``: A on fresh groups, outcome reward;
  rspo   ``rspo=1``, k = 3, alpha = 1/4: per loop B := A, 3 steps of B on
         the dense reward, B's stored collection D, then 3 steps of A on 3
         fresh groups + 8 replayed trajectories of D (outcome advantages);
  dense_only             ``rspo=0,rspo.dense_only=1``: the one policy (A,
         trained and evaluated) on the aligned dense reward alone (rspo.py:
         with dense_only, A's step uses the dense reward and B's phase is
         skipped, so rspo=1 would only add an empty D);
  dense_only_misaligned  the same on the decoy reward;
  rspo_misaligned        rspo's arm with B learning the decoy reward (A:
         outcome reward; D's rewards are swapped to the outcome).
Seeds ``--seeds`` vary the RL (sampling, tasks, updates); the warm start is
one (seed 0), made once into ``<root>/warm_start``.

Per cell: A's greedy success on the 64 held-out ``valid_seen`` tasks every
``--eval_every`` A steps (and at 0), each with the environment steps spent
so far (A's and B's collections), and A's rollout success and mean dense
return (the arm's environment dense reward: the decoy's in the misaligned
arms) per step, B's per B step. Cells
are written into ``--out`` (JSON) as they finish; a call skips finished
cells (resumable: each cell restarts from scratch in its workdir). The
report ``--md`` gives, per arm and evaluation, the mean over seeds with a
95 % bootstrap interval over seeds x tasks (rspo_jax/intervals.py), and
the difference arm - grpo at equal A steps, and the rollouts' dense return
beside their success: hacking is the dense return rising while success
falls.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RSPO = "rspo=1,rspo.k=3,rspo.alpha=0.25"
DENSE_ONLY = "rspo=0,rspo.dense_only=1"
ARMS = {
    "grpo": "rspo=0",
    "rspo": RSPO,
    "dense_only": DENSE_ONLY,
    "dense_only_misaligned": DENSE_ONLY,
    "rspo_misaligned": RSPO,
}
DISTANT = {"min_distance": 4}
DECOY = {"dense_target_offset": -24}  # out of reach: progress sign-flipped
MISALIGNED = ("dense_only_misaligned", "rspo_misaligned")
DIFFERENCES = [(arm, "grpo") for arm in ARMS if arm != "grpo"] + [
    ("rspo_misaligned", "rspo")
]  # (arm, reference) in the report
COMMON = (
    "model=nano,env.max_steps=12,env.history_length=0,"
    "env.num_eval_tasks=64,rspo.dense_reward=oracle"
)
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
  return (
      f"{ARMS[arm]},seed={seed},steps={args.steps},train.lr={args.lr},"
      "train.batch_tasks=4,train.group_size=8,train.updates_per_step=2,"
      f"train.max_train_rows=0,train.eval_every={args.eval_every},"
      f"model.checkpoint_dir={checkpoint}"
  )


def arm_env_kwargs(arm: str) -> dict:
  """The toy's kwargs of an arm's run (the warm start's: ``DISTANT``)."""
  return dict(DISTANT, direction="up", **(DECOY if arm in MISALIGNED else {}))


def cell_config(arm: str, seed: int, args, checkpoint: str):
  return config(
      arm_env_kwargs(arm), cell_overrides(arm, seed, args, checkpoint)
  )


def warm_start(root: str) -> str:
  from rspo_jax import build

  path = os.path.join(root, "warm_start")
  if not os.path.exists(os.path.join(path, "warm_start", "config.json")):
    build.build_run(config(DISTANT, WARM_START), path, progress=False).close()
  return os.path.join(path, "warm_start")


def run_cell(arm: str, seed: int, args, checkpoint: str) -> dict:
  from rspo_jax import build
  from rspo_jax import evaluate as evaluate_lib
  from rspo_jax.metrics import metrics_path, read_metrics

  workdir = os.path.join(args.root, f"{arm}_s{seed}")
  shutil.rmtree(workdir, ignore_errors=True)  # a cell restarts whole
  cfg = cell_config(arm, seed, args, checkpoint)
  t0 = time.perf_counter()
  run = build.build_run(cfg, workdir, progress=False)
  evals = []

  def evaluate(learner, step):
    out = run.evaluate(learner, step)  # greedy; leaves A's weights synced
    sampled = evaluate_lib.evaluate(
        run.engine,
        run.venv,
        run.tokenizer,
        build.collect_config(cfg, cfg.env.eval_split),
        list(range(cfg.env.num_eval_tasks)),
        temperature=1.0,
        max_new_tokens=cfg.rollout.max_new_tokens,
        seeds=SAMPLING_SEEDS,
    )
    evals.append(
        {
            "a_step": step,
            "env_steps": run.trainer.state.env_steps,
            "success_rate": out["success_rate"],
            "won": [e["won"] for e in out["per_task"]],
            "t1_success_rate": sampled["success_rate"],
            "t1_won": [
                [e["won"] for e in sampled["per_task"] if e["seed"] == s]
                for s in SAMPLING_SEEDS
            ],
        }
    )
    return {
        "success_rate": out["success_rate"],
        "t1_success_rate": sampled["success_rate"],
    }

  try:
    evaluate(run.trainer.a, 0)
    run.trainer.run(evaluate)
    if evals[-1]["a_step"] != args.steps:
      evaluate(run.trainer.a, args.steps)
  finally:
    run.close()
  rows = read_metrics(metrics_path(workdir))
  rollouts = [
      {
          "a_step": r["step"],
          "env_steps": r["env_steps"],
          "success_rate": r["rollout_success_rate"],
          "dense_return": dense_return(r),
      }
      for r in rows
      if r["phase"] == "A"
  ]
  b_rollouts = [
      {
          "loop_a_step": r["step"],
          "success_rate": r["rollout_success_rate"],
          "dense_reward_mean": r.get("dense_reward_mean"),
          "dense_return": dense_return(r),
      }
      for r in rows
      if r["phase"] == "B"
  ]
  return {
      "arm": arm,
      "seed": seed,
      "overrides": cfg_string(cfg, arm, seed, args),
      "env_kwargs": arm_env_kwargs(arm),
      "evals": evals,
      "rollouts": rollouts,
      "b_rollouts": b_rollouts,
      "wall_s": round(time.perf_counter() - t0, 1),
  }


def dense_return(row: dict) -> float:
  """Mean over a collection's episodes of sum_t dense_t, from its metrics
  row: the mean over its step records (``dense_reward_mean``) times the
  records per episode (``rollout_episode_length``; no failed episodes)."""
  return row["dense_reward_mean"] * row["rollout_episode_length"]


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
  return sorted(
      (c for c in data["cells"].values() if c["arm"] == arm),
      key=lambda c: c["seed"],
  )


def outcomes(cells: list, key: str) -> np.ndarray:
  """x[r, e, g, s] of evaluation ``e``: greedy (``won``, s = 1) or T = 1
  (``t1_won``, s = sampling seeds)."""
  if key == "won":
    return np.array(
        [[np.asarray(e["won"])[:, None] for e in c["evals"]] for c in cells],
        float,
    )
  return np.array(
      [[np.asarray(e["t1_won"]).T for e in c["evals"]] for c in cells], float
  )


def command_of(settings: dict, arms=None, seeds=None) -> str:
  """The command that makes (or resumes) ``arms`` x ``seeds``."""
  out = (
      f"python experiments/toy_mechanism.py --steps {settings['steps']}"
      f" --eval_every {settings['eval_every']} --lr {settings['lr']:g}"
  )
  if arms is not None:
    out += f" --arms {','.join(arms)}"
  if seeds is not None:
    out += f" --seeds {','.join(str(s) for s in seeds)}"
  return out


def seed_blocks(cells: list, key: str, field: str, every: int) -> list:
  """[(first, last A step, x[r, 1, 1])]: per seed r, the mean of
  ``cell[key][i][field]`` over each block of ``every`` consecutive entries
  (A steps 1..every, ...; B steps: per loop)."""
  n = min(len(c[key]) for c in cells)
  out = []
  for lo in range(0, n - every + 1, every):
    x = np.array(
        [np.mean([r[field] for r in c[key][lo : lo + every]]) for c in cells],
        float,
    )[:, None, None]
    out.append((lo, lo + every, x))
  return out


def report(data: dict) -> str:
  from rspo_jax import intervals

  settings = data["settings"]
  pct = lambda d: (
      f"{100 * d['mean']:.1f} [{100 * d['lo']:.1f}," f" {100 * d['hi']:.1f}]"
  )
  num = lambda d: f"{d['mean']:.2f} [{d['lo']:.2f}, {d['hi']:.2f}]"
  doc = __doc__[__doc__.index("Task (") : __doc__.index("Per cell")].rstrip()
  found = {arm: arm_cells(data, arm) for arm in ARMS}
  found = {arm: cells for arm, cells in found.items() if cells}
  lines = [
      f"Command: `{command_of(settings)}` (all arms x seeds 0-4;"
      " resumable; `--max_cells N` a call); each arm's own below.",
      "",
      "```",
      doc,
      "```",
      "",
      "Success of A on the 64 held-out tasks, % with a 95 % bootstrap"
      " interval over training seeds x tasks (x sampling seeds for"
      " T = 1); env steps: A's and B's collections so far, mean over"
      " seeds. Rollouts: A's training collections (4 tasks x 8"
      " episodes a step, T = 1) in blocks of A steps; dense return ="
      " mean over episodes of sum_t dense_t under the arm's dense"
      " reward (the decoy's in the misaligned arms), both with a 95 %"
      " bootstrap interval over training seeds only (3-5 values:"
      " rough).",
      "",
  ]
  for arm, cells in found.items():
    seeds = [c["seed"] for c in cells]
    greedy, sampled = outcomes(cells, "won"), outcomes(cells, "t1_won")
    lines += [
        f"## {arm} (seeds {seeds})",
        "",
        f"`{command_of(settings, [arm], seeds)}`",
        "",
        "| A step | env steps | greedy % | T = 1 % |",
        "|---:|---:|---|---|",
    ]
    for i, e in enumerate(cells[0]["evals"]):
      env_steps = np.mean([c["evals"][i]["env_steps"] for c in cells])
      lines.append(
          f"| {e['a_step']} | {env_steps:.0f} |"
          f" {pct(intervals.success_interval(greedy[:, i]))} |"
          f" {pct(intervals.success_interval(sampled[:, i]))} |"
      )
    lines.append("")
    if all("dense_return" in r for c in cells for r in c["rollouts"]):
      lines += [
          "| A's rollouts, A steps | dense return | success % |",
          "|---|---|---|",
      ]
      every = settings["eval_every"]
      for (lo, hi, dense), (_, _, won) in zip(
          seed_blocks(cells, "rollouts", "dense_return", every),
          seed_blocks(cells, "rollouts", "success_rate", every),
      ):
        lines.append(
            f"| {lo + 1}-{hi} |"
            f" {num(intervals.success_interval(dense))} |"
            f" {pct(intervals.success_interval(won))} |"
        )
      lines.append("")
  for arm, ref in DIFFERENCES:
    if arm not in found or ref not in found:
      continue
    cells, base = found[arm], found[ref]
    lines += [
        f"## {arm} - {ref} at equal A steps (points)",
        "",
        "| A step | greedy | T = 1 |",
        "|---:|---|---|",
    ]
    for i, e in enumerate(cells[0]["evals"]):
      d = [
          intervals.method_difference(
              outcomes(cells, k)[:, i], outcomes(base, k)[:, i]
          )
          for k in ("won", "t1_won")
      ]
      lines.append(f"| {e['a_step']} | {pct(d[0])} | {pct(d[1])} |")
    lines.append("")
  for arm, cells in found.items():
    if cells[0]["b_rollouts"]:
      lines += b_table(arm, cells)
  return "\n".join(lines)


def b_table(arm: str, cells: list) -> list:
  """B's own rollouts per loop and B step, mean over seeds: success %
  (and dense return under B's reward where recorded)."""
  dense = all("dense_return" in r for c in cells for r in c["b_rollouts"])
  loops = sorted({r["loop_a_step"] for r in cells[0]["b_rollouts"]})
  k = len(cells[0]["b_rollouts"]) // len(loops)
  lines = [
      f"## B's own rollouts ({arm}): success %"
      + (" / dense return" if dense else "")
      + f" of B's k = {k} training steps of each loop, mean over seeds",
      "",
      "| loop (A steps before it) | "
      + " | ".join(f"B step {i + 1}" for i in range(k))
      + " |",
      "|---:|" + "---|" * k,
  ]
  for start in loops:
    per = [
        [r for r in c["b_rollouts"] if r["loop_a_step"] == start] for c in cells
    ]
    won = np.mean([[r["success_rate"] for r in p] for p in per], axis=0)
    row = [f"{100 * w:.1f}" for w in won]
    if dense:
      ret = np.mean([[r["dense_return"] for r in p] for p in per], axis=0)
      row = [f"{w} / {d:.2f}" for w, d in zip(row, ret)]
    lines.append(f"| {start} | " + " | ".join(row) + " |")
  return lines + [""]


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root", default=os.path.join(ROOT, "runs", "toy_mechanism"))
  p.add_argument(
      "--out",
      default=os.path.join(ROOT, "docs", "results", "toy_mechanism.json"),
  )
  p.add_argument(
      "--md", default=os.path.join(ROOT, "docs", "results", "toy_mechanism.md")
  )
  p.add_argument("--arms", default=",".join(ARMS))
  p.add_argument("--seeds", default="0,1,2,3,4")
  p.add_argument("--steps", type=int, default=12)
  p.add_argument("--eval_every", type=int, default=3)
  p.add_argument("--lr", type=float, default=1e-4)
  p.add_argument(
      "--max_cells",
      type=int,
      default=0,
      help="stop after this many new cells (0: all)",
  )
  p.add_argument("--report_only", action="store_true")
  args = p.parse_args(argv)
  data = load(args.out)
  settings = {k: getattr(args, k) for k in ("steps", "eval_every", "lr")}
  if data.get("settings", settings) != settings:
    raise SystemExit(
        f"{args.out} holds cells of {data['settings']}, not"
        f" {settings}: use another --out"
    )
  data["settings"] = settings
  if not args.report_only:
    checkpoint = warm_start(args.root)
    done = 0
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
      raise SystemExit(f"unknown arms {unknown}; known: {list(ARMS)}")
    for seed in [int(s) for s in args.seeds.split(",")]:
      for arm in arms:
        key = f"{arm}_s{seed}"
        if key in data["cells"]:
          continue
        if args.max_cells and done >= args.max_cells:
          break
        data["cells"][key] = run_cell(arm, seed, args, checkpoint)
        save(args.out, data)
        done += 1
        cell = data["cells"][key]
        print(
            json.dumps(
                {
                    "cell": key,
                    "wall_s": cell["wall_s"],
                    "greedy": [e["success_rate"] for e in cell["evals"]],
                }
            ),
            flush=True,
        )
  write_report(args.md, report(data))


MARK = "<!-- generated by experiments/toy_mechanism.py below -->"


def write_report(path: str, tables: str) -> None:
  """Replaces what follows MARK in ``path`` (the text above it, a reading
  of the results, is kept)."""
  head = "# Toy mechanism study: GRPO vs RSPO+GRPO\n\n"
  if os.path.exists(path):
    with open(path) as f:
      text = f.read()
    if MARK in text:
      head = text[: text.index(MARK)]
  with open(path + ".tmp", "w") as f:
    f.write(f"{head}{MARK}\n\n{tables}\n")
  os.replace(path + ".tmp", path)


if __name__ == "__main__":
  main()
