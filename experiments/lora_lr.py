r"""LoRA's learning rate against full fine-tuning's on the toy.

Report: docs/results.md, "LoRA learning rate".

  python experiments/lora_lr.py                 # every cell, resumable
  python experiments/lora_lr.py --budget_s 480  # stop starting cells at 8 min
  python experiments/lora_lr.py --report_only   # the table from the JSON

Task: the learning guard's (tests/learning_guard_test.py): the toy number
line with distant targets (``min_distance=4``), the 'nano' policy, a
60-step behaviour-cloning warm start (seed 0) whose greedy reply is one
action everywhere, and the direction whose tasks that action fails (its
greedy success <= 30 %). GRPO alone (``rspo=0``), ``--steps`` A steps of
4 tasks x 8 episodes, 2 updates a step, every row; A's greedy success on
the direction's 64 held-out tasks before and after. The toy's own
``tiny`` start (59 % greedy, both directions) did not rank learning rates:
full fine-tuning lost 19 points at lr 1e-4 and 3e-4 from it (GRPO on
targets of both directions moves the action marginal, not the
comparison; the guard's docstring).

Cells (SETTINGS): full fine-tuning, or LoRA (``model.lora_alpha`` 32, every
attention and MLP projection) of rank r with the default
``train.lora_lr_multiplier`` (m), i.e. the adapters at train.lr x m; at
seeds ``--seeds``. The seed varies the RL (sampling, tasks, LoRA's A
init); the warm start is one.

Per cell: greedy success per held-out task before and after (for the
intervals), A's sampled success at each step (``rollout_success_rate``:
its mean over the steps ranks how fast a setting learns when the end
saturates), and approx_kl a step. Cells go into ``--out`` (JSON) as they
finish; a call skips finished cells. The report: per setting, the gain
(final - start, points) with a 95 % t interval over seeds
(rspo_jax/intervals.py), the mean sampled success, the approx_kl median.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

import numpy as np
from toy_mechanism import load, save  # resumable JSON, written atomically

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (rank, train.lr), rank 0 = full fine-tuning; LoRA at train.lr x the
# default multiplier on the adapters. In the order run: the pair
# (full and rank 4 at 1e-4) first, then the lr sweep around it.
SETTINGS = (
    (0, 1e-4),
    (4, 1e-4),
    (0, 3e-5),
    (4, 1e-5),
    (0, 3e-4),
    (4, 3e-5),
    (1, 1e-4),
    (16, 1e-4),
    (0, 1e-3),
    (4, 3e-6),
)
DEFAULTS = SETTINGS[:2]  # every seed of these before the others' 2nd seed
# The learning guard's recipe (tests/learning_guard_test.py).
COMMON = (
    "model=nano,rspo=0,env.max_steps=12,env.history_length=0,"
    "env.num_eval_tasks=64,env.num_workers=2"
)
ENV_KWARGS = {"min_distance": 4}
WARM_START = "seed=0,sft.steps=60"
GRPO = (
    "train.batch_tasks=4,train.group_size=8,train.updates_per_step=2,"
    "train.max_train_rows=0,train.eval_every=0"
)


def config(overrides: str, direction: str = ""):
  from configs import base

  cfg = base.make_config("toy", "grpo", f"{COMMON},{overrides}")
  with cfg.unlocked():
    cfg.env.kwargs = dict(
        ENV_KWARGS, **({"direction": direction} if direction else {})
    )
    cfg.mesh.shape = (1, 1, 1)
  base.validate(cfg)
  return cfg


def cells(seeds) -> list:
  """[(key, rank, train.lr, seed)] in the order run: the defaults at the
  first seed, then each other setting at the first seed interleaved with
  the defaults at the other seeds, then the rest (a cut sweep has what
  matters most)."""
  first, rest = seeds[:1], seeds[1:]
  others = [
      (r, lr, s) for s in first for r, lr in SETTINGS if (r, lr) not in DEFAULTS
  ]
  extra = [(r, lr, s) for s in rest for r, lr in DEFAULTS]
  order = [(r, lr, s) for s in first for r, lr in DEFAULTS]
  while others or extra:
    order += others[:2] + extra[:2]
    others, extra = others[2:], extra[2:]
  order += [
      (r, lr, s) for s in rest for r, lr in SETTINGS if (r, lr) not in DEFAULTS
  ]
  return [(f"r{r}_lr{lr:g}_s{s}", r, lr, s) for r, lr, s in order]


def cell_overrides(
    rank: int, lr: float, seed: int, steps: int, checkpoint: str
) -> str:
  return (
      f"{GRPO},seed={seed},steps={steps},train.lr={lr:g},"
      f"model.lora_rank={rank},train.checkpoint_every=1000,"
      f"model.checkpoint_dir={checkpoint}"
  )


def greedy(run, step: int) -> dict:
  return run.evaluate(run.trainer.a, step)


def warm_start(root: str) -> tuple:
  """(checkpoint, direction, greedy success there): the guard's warm
  start and the direction its greedy policy fails, made once."""
  from rspo_jax import build

  path = os.path.join(root, "warm_start")
  marker = os.path.join(path, "direction.json")
  if not os.path.exists(marker):
    shutil.rmtree(path, ignore_errors=True)
    build.build_run(config(WARM_START), path, progress=False).close()
    checkpoint = os.path.join(path, "warm_start")
    found = None
    for direction in ("up", "down"):
      probe = os.path.join(root, f"probe_{direction}")
      run = build.build_run(
          config(
              f"{WARM_START},steps=1,model.checkpoint_dir={checkpoint}",
              direction,
          ),
          probe,
          progress=False,
      )
      try:
        start = greedy(run, 0)["success_rate"]
      finally:
        run.close()
      shutil.rmtree(probe, ignore_errors=True)
      if start <= 0.3:
        found = (direction, start)
        break
    if found is None:
      raise SystemExit("the warm start is not weak in either direction")
    save(marker, {"direction": found[0], "start": found[1]})
  d = load(marker)
  return os.path.join(path, "warm_start"), d["direction"], d["start"]


def run_cell(rank, lr, seed, args, checkpoint, direction, cache_dir) -> dict:
  from rspo_jax import build
  from rspo_jax.metrics import metrics_path, read_metrics
  from rspo_jax.models import lora

  workdir = os.path.join(args.root, f"r{rank}_lr{lr:g}_s{seed}")
  shutil.rmtree(workdir, ignore_errors=True)  # a cell restarts whole
  cfg = config(
      cell_overrides(rank, lr, seed, args.steps, checkpoint)
      + f",train.compile_cache_dir={cache_dir}",
      direction,
  )
  t0 = time.perf_counter()
  run = build.build_run(cfg, workdir, progress=False)
  try:
    start = greedy(run, 0)
    run.trainer.run()
    final = greedy(run, args.steps)
  finally:
    run.close()
  rows = read_metrics(metrics_path(workdir))
  a_rows = [r for r in rows if r["phase"] == "A"]
  shutil.rmtree(workdir, ignore_errors=True)
  return {
      "rank": rank,
      "train_lr": lr,
      "multiplier": lora.lr_multiplier(cfg),
      "adapter_lr": lr * lora.lr_multiplier(cfg),
      "seed": seed,
      "direction": direction,
      "start": start["success_rate"],
      "final": final["success_rate"],
      "start_won": [e["won"] for e in start["per_task"]],
      "final_won": [e["won"] for e in final["per_task"]],
      "rollout_success": [r["rollout_success_rate"] for r in a_rows],
      "approx_kl": [r["approx_kl"] for r in a_rows],
      "wall_s": round(time.perf_counter() - t0, 1),
  }


# ------------------------------------------------------------------ report
def settings_of(data: dict) -> dict:
  """(rank, train.lr) -> its cells, seeds sorted."""
  out = {}
  for c in data["cells"].values():
    out.setdefault((c["rank"], c["train_lr"]), []).append(c)
  return {k: sorted(v, key=lambda c: c["seed"]) for k, v in sorted(out.items())}


def gain(cells: list) -> dict:
  """Greedy final - start, per seed (the mean over the held-out tasks),
  with a Student t interval over the seeds (n <= 5: no bootstrap)."""
  from rspo_jax import intervals

  g = [c["final"] - c["start"] for c in cells]
  if len(g) < 2:
    return {"mean": g[0], "lo": float("nan"), "hi": float("nan"), "n": 1}
  return intervals.t_interval(g)


def matching_ratio(
    data: dict, rank: int = 4, seed: int = 0, full_lr: float = 1e-4
):
  """The adapters' lr at which LoRA rank ``rank`` learns as fast as full
  fine-tuning at ``full_lr`` (mean sampled success over the steps, seed
  ``seed``), over ``full_lr``: log-linear interpolation between the two
  LoRA lrs whose speeds bracket full fine-tuning's. None if none do."""
  cells = [c for c in data["cells"].values() if c["seed"] == seed]
  full = [c for c in cells if not c["rank"] and c["train_lr"] == full_lr]
  lora = sorted(
      (c["adapter_lr"], float(np.mean(c["rollout_success"])))
      for c in cells
      if c["rank"] == rank
  )
  if not full or len(lora) < 2:
    return None
  target = float(np.mean(full[0]["rollout_success"]))
  for (x0, y0), (x1, y1) in zip(lora, lora[1:]):
    if y0 <= target <= y1 and y1 > y0:
      t = (target - y0) / (y1 - y0)
      return float(np.exp(np.log(x0) + t * (np.log(x1) - np.log(x0))) / full_lr)
  return None


def report(data: dict) -> str:
  pts = lambda d: (
      f"{100 * d['mean']:+.1f} [{100 * d['lo']:+.1f}," f" {100 * d['hi']:+.1f}]"
  )
  lines = [
      "| policy | train.lr | adapters' lr | seeds | greedy start ->"
      " final, % | gain, points [95 %] | sampled success over the"
      " steps, % | approx_kl a step, median |",
      "|---|---:|---:|---:|---|---|---:|---:|",
  ]
  best = {}
  for (rank, lr), cs in settings_of(data).items():
    g = gain(cs)
    speed = float(np.mean([np.mean(c["rollout_success"]) for c in cs]))
    kl = statistics.median(k for c in cs for k in c["approx_kl"])
    name = f"LoRA r = {rank}" if rank else "full"
    eff = f"{cs[0]['adapter_lr']:g}" if rank else "—"
    lines.append(
        f"| {name} | {lr:g} | {eff} | {len(cs)} |"
        f" {100 * np.mean([c['start'] for c in cs]):.1f} ->"
        f" {100 * np.mean([c['final'] for c in cs]):.1f} | {pts(g)} |"
        f" {100 * speed:.1f} | {kl:.2g} |"
    )
    score = (g["mean"], speed)  # the gain, then how fast it came
    if score > best.get(rank, (None, (-9, -9)))[1]:
      best[rank] = ((cs[0]["adapter_lr"] if rank else lr), score)
  lines.append("")
  for rank, (lr, _) in sorted(best.items()):
    top = max(
        c["adapter_lr"] for c in data["cells"].values() if c["rank"] == rank
    )
    name = f"LoRA r = {rank}" if rank else "full fine-tuning"
    edge = (
        " (the grid's largest: success still rising, no peak found)"
        if lr == top
        else ""
    )
    lines.append(f"best lr, {name}: {lr:g}{edge}")
  for seed in sorted({c["seed"] for c in data["cells"].values()}):
    lora = [
        c
        for c in data["cells"].values()
        if c["seed"] == seed and c["rank"] == 4
    ]
    full = [
        c
        for c in data["cells"].values()
        if c["seed"] == seed and not c["rank"] and c["train_lr"] == 1e-4
    ]
    if len(lora) < 2 or not full:
      continue
    ratio = matching_ratio(data, seed=seed)
    fastest = max(np.mean(c["rollout_success"]) for c in lora)
    lines.append(
        f"equal speed (seed {seed}): LoRA r = 4 matches full fine-tuning at"
        f" lr 1e-4 ({100 * np.mean(full[0]['rollout_success']):.1f} %"
        " sampled) "
        + (
            f"at {ratio:.2g}x its lr"
            if ratio
            else "at no lr of the grid (its fastest:" f" {100 * fastest:.1f} %)"
        )
    )
  crit = settings_of(data)
  full, r4 = crit.get((0, 1e-4)), crit.get((4, 1e-4))
  if full and r4 and len(full) >= 2:
    lo = gain(full)["lo"]
    lines.append(
        f"criterion: LoRA r = 4 at lr 1e-4 gains"
        f" {100 * gain(r4)['mean']:+.1f} points, full fine-tuning's"
        f" lower bound {100 * lo:+.1f}:"
        f" {'met' if gain(r4)['mean'] >= lo else 'not met'}"
        f" ({len(r4)} and {len(full)} seeds)"
    )
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root", default=os.path.join(ROOT, "runs", "lora_lr"))
  p.add_argument(
      "--out", default=os.path.join(ROOT, "docs", "results", "lora_lr.json")
  )
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--steps", type=int, default=20)
  p.add_argument(
      "--only",
      default="",
      help="comma-separated cell keys (r4_lr0.0001_s0, ...)",
  )
  p.add_argument(
      "--budget_s",
      type=float,
      default=0,
      help="start no cell after this many seconds (0: all)",
  )
  p.add_argument("--report_only", action="store_true")
  args = p.parse_args(argv)
  data = load(args.out)
  settings = {"steps": args.steps, "task": "learning guard"}
  if data.get("settings", settings) != settings:
    raise SystemExit(
        f"{args.out} holds cells of {data['settings']}, not"
        f" {settings}: use another --out"
    )
  data["settings"] = settings
  if not args.report_only:
    checkpoint, direction, _ = warm_start(args.root)
    t0 = time.perf_counter()  # the budget counts cells, not the warm start
    cache_dir = os.path.join(args.root, "compile_cache")
    only = set(filter(None, args.only.split(",")))
    for key, rank, lr, seed in cells([int(s) for s in args.seeds.split(",")]):
      if key in data["cells"] or (only and key not in only):
        continue
      if args.budget_s and time.perf_counter() - t0 > args.budget_s:
        print(
            json.dumps(
                {
                    "stopped": "budget",
                    "left": sum(
                        k not in data["cells"]
                        for k, *_ in cells(
                            [int(s) for s in args.seeds.split(",")]
                        )
                    ),
                }
            ),
            flush=True,
        )
        break
      data["cells"][key] = run_cell(
          rank, lr, seed, args, checkpoint, direction, cache_dir
      )
      save(args.out, data)
      c = data["cells"][key]
      print(
          json.dumps(
              {
                  "cell": key,
                  "wall_s": c["wall_s"],
                  "start": c["start"],
                  "final": c["final"],
                  "approx_kl_median": statistics.median(c["approx_kl"]),
              }
          ),
          flush=True,
      )
  print(report(data))


if __name__ == "__main__":
  main()
