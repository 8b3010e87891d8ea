r"""LoRA's learning rate against full fine-tuning's on the toy (issue 54).

  python bench/lora_lr.py                    # every cell, resumable
  python bench/lora_lr.py --budget_s 480     # stop starting cells after 8 min
  python bench/lora_lr.py --report_only      # the table from the JSON

Task: the toy number line (configs/toy_grpo.py, the 'tiny' policy, 32
held-out goals, 4 tasks x 4 episodes a step, 2 updates a step), GRPO alone
(``rspo=0``), ``--steps`` A steps, from the toy's own weak warm start (its
40-step behaviour cloning, seed 0), made once into ``<root>/warm_start``.

Cells (SETTINGS): full fine-tuning, or LoRA (alpha 32, every attention
and MLP projection) of rank r with the default
``train.lora_lr_multiplier`` (m), i.e. the adapters at train.lr x m; at
seeds ``--seeds`` (``cells``: the order run). The seed varies the RL
(sampling, tasks, LoRA's A init); the warm start is one.

Per cell: A's greedy success on the held-out goals before and after, per
goal (for the intervals), and the median approx_kl of A's steps (how far
an A step moves the policy). Cells go into ``--out`` (JSON) as they finish;
a call skips finished cells. The report: per setting, the gain (final -
start, points) with a 95 % bootstrap interval over seeds x goals
(rspo_jax/intervals.py), and the approx_kl median.
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
# default multiplier on the adapters. In the order run: the default pair
# first, then the lr sweep around it (rank 4 fully, ranks 1 and 16 at the
# default lr).
SETTINGS = ((0, 1e-4), (4, 1e-4), (0, 3e-4), (4, 3e-5), (4, 3e-4),
            (1, 1e-4), (16, 1e-4), (0, 3e-5), (0, 1e-3), (4, 1e-5))
DEFAULTS = SETTINGS[:2]  # every seed of these before the others' 2nd seed
WARM_START = "rspo=0,seed=0,steps=1"  # + sft.steps: behaviour cloning


def config(overrides: str):
  from configs import base

  cfg = base.make_config("toy", "grpo", overrides)
  with cfg.unlocked():
    cfg.mesh.shape = (1, 1, 1)
  base.validate(cfg)
  return cfg


def cells(seeds) -> list:
  """[(key, rank, train.lr, seed)] in the order run: the defaults at the
  first seed, then each other setting at the first seed interleaved with
  the defaults at the other seeds, then the rest (a cut sweep has what
  matters most)."""
  first, rest = seeds[:1], seeds[1:]
  others = [(r, lr, s) for s in first for r, lr in SETTINGS
            if (r, lr) not in DEFAULTS]
  extra = [(r, lr, s) for s in rest for r, lr in DEFAULTS]
  order = [(r, lr, s) for s in first for r, lr in DEFAULTS]
  while others or extra:
    order += others[:2] + extra[:2]
    others, extra = others[2:], extra[2:]
  order += [(r, lr, s) for s in rest for r, lr in SETTINGS
            if (r, lr) not in DEFAULTS]
  return [(f"r{r}_lr{lr:g}_s{s}", r, lr, s) for r, lr, s in order]


def cell_overrides(rank: int, lr: float, seed: int, steps: int,
                   checkpoint: str) -> str:
  return (f"rspo=0,seed={seed},steps={steps},train.lr={lr:g},"
          f"model.lora_rank={rank},train.checkpoint_every=1000,"
          f"model.checkpoint_dir={checkpoint}")


def warm_start(root: str, sft_steps: int) -> str:
  from rspo_jax import build

  path = os.path.join(root, "warm_start")
  if not os.path.exists(os.path.join(path, "warm_start", "config.json")):
    build.build_run(config(f"{WARM_START},sft.steps={sft_steps}"), path,
                    progress=False).close()
  return os.path.join(path, "warm_start")


def run_cell(rank, lr, seed, args, checkpoint, cache_dir) -> dict:
  from rspo_jax import build
  from rspo_jax.models import lora

  workdir = os.path.join(args.root, f"r{rank}_lr{lr:g}_s{seed}")
  shutil.rmtree(workdir, ignore_errors=True)  # a cell restarts whole
  cfg = config(cell_overrides(rank, lr, seed, args.steps, checkpoint)
               + f",train.compile_cache_dir={cache_dir}")
  t0 = time.perf_counter()
  run = build.build_run(cfg, workdir, progress=False)
  t_built = time.perf_counter()
  try:
    start = run.evaluate(run.trainer.a, 0)
    t_start = time.perf_counter()
    run.trainer.run()
    t_trained = time.perf_counter()
    final = run.evaluate(run.trainer.a, args.steps)
  finally:
    run.close()
  phases = {"build_s": t_built - t0, "start_eval_s": t_start - t_built,
            "train_s": t_trained - t_start,
            "final_eval_s": time.perf_counter() - t_trained}
  rows = [json.loads(line) for line in open(
      os.path.join(workdir, "metrics.jsonl"))]
  kl = [r["approx_kl"] for r in rows if r["phase"] == "A"]
  shutil.rmtree(workdir, ignore_errors=True)
  return {"rank": rank, "train_lr": lr, "multiplier": lora.lr_multiplier(cfg),
          "adapter_lr": lr * lora.lr_multiplier(cfg), "seed": seed,
          "start": start["success_rate"], "final": final["success_rate"],
          "start_won": [e["won"] for e in start["per_task"]],
          "final_won": [e["won"] for e in final["per_task"]],
          "approx_kl": kl, "wall_s": round(time.perf_counter() - t0, 1),
          **{k: round(v, 1) for k, v in phases.items()}}


# ------------------------------------------------------------------ report
def settings_of(data: dict) -> dict:
  """(rank, train.lr) -> its cells, seeds sorted."""
  out = {}
  for c in data["cells"].values():
    out.setdefault((c["rank"], c["train_lr"]), []).append(c)
  return {k: sorted(v, key=lambda c: c["seed"]) for k, v in
          sorted(out.items())}


def gain(cells: list) -> dict:
  """final - start over seeds x goals: finals [R, G, 1] against each
  seed's own start (greedy starts are one policy's: equal per seed)."""
  from rspo_jax import intervals

  final = np.array([c["final_won"] for c in cells], float)[:, :, None]
  start = np.array([c["start_won"] for c in cells], float)[:, :, None]
  return intervals.difference_interval(final, start)


def report(data: dict) -> str:
  pts = lambda d: (f"{100 * d['mean']:+.1f} [{100 * d['lo']:+.1f},"
                   f" {100 * d['hi']:+.1f}]")
  lines = ["| policy | train.lr | adapters' lr | seeds | greedy start ->"
           " final, % | gain, points [95 %] | approx_kl a step, median |",
           "|---|---:|---:|---:|---|---|---:|"]
  best = {}
  for (rank, lr), cs in settings_of(data).items():
    g = gain(cs)
    kl = statistics.median(k for c in cs for k in c["approx_kl"])
    name = f"LoRA r = {rank}" if rank else "full"
    eff = f"{cs[0]['adapter_lr']:g}" if rank else "—"
    lines.append(
        f"| {name} | {lr:g} | {eff} | {len(cs)} |"
        f" {100 * np.mean([c['start'] for c in cs]):.1f} ->"
        f" {100 * np.mean([c['final'] for c in cs]):.1f} | {pts(g)} |"
        f" {kl:.2g} |")
    if g["mean"] > best.get(rank, (None, -9))[1]:
      best[rank] = ((cs[0]["adapter_lr"] if rank else lr), g["mean"], g)
  lines.append("")
  if 0 in best:
    for rank in sorted(k for k in best if k):
      lines.append(f"best lr, LoRA r = {rank} / full: {best[rank][0]:g} /"
                   f" {best[0][0]:g} = {best[rank][0] / best[0][0]:g}")
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root", default=os.path.join(ROOT, "runs", "lora_lr"))
  p.add_argument("--out", default=os.path.join(
      ROOT, "docs", "results", "lora_lr.json"))
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--sft_steps", type=int, default=40,
                 help="the warm start's behaviour-cloning steps")
  p.add_argument("--only", default="",
                 help="comma-separated cell keys (r4_lr0.0001_s0, ...)")
  p.add_argument("--budget_s", type=float, default=0,
                 help="start no cell after this many seconds (0: all)")
  p.add_argument("--report_only", action="store_true")
  args = p.parse_args(argv)
  data = load(args.out)
  settings = {"steps": args.steps, "sft_steps": args.sft_steps}
  if data.get("settings", settings) != settings:
    raise SystemExit(f"{args.out} holds cells of {data['settings']}, not"
                     f" {settings}: use another --out")
  data["settings"] = settings
  if not args.report_only:
    t0 = time.perf_counter()
    checkpoint = warm_start(args.root, args.sft_steps)
    cache_dir = os.path.join(args.root, "compile_cache")
    only = set(filter(None, args.only.split(",")))
    for key, rank, lr, seed in cells([int(s) for s in
                                      args.seeds.split(",")]):
      if key in data["cells"] or (only and key not in only):
        continue
      if args.budget_s and time.perf_counter() - t0 > args.budget_s:
        print(json.dumps({"stopped": "budget", "left": sum(
            k not in data["cells"] for k, *_ in cells(
                [int(s) for s in args.seeds.split(",")]))}), flush=True)
        break
      data["cells"][key] = run_cell(rank, lr, seed, args, checkpoint,
                                    cache_dir)
      save(args.out, data)
      c = data["cells"][key]
      print(json.dumps({"cell": key, "wall_s": c["wall_s"], **{
          k: c[k] for k in ("build_s", "start_eval_s", "train_s",
                            "final_eval_s")},
                        "start": c["start"], "final": c["final"],
                        "approx_kl_median": statistics.median(
                            c["approx_kl"])}), flush=True)
  print(report(data))


if __name__ == "__main__":
  main()
