r"""B's lift over its phase, by B variant, with A held fixed.

  python experiments/b_lift.py --out runs/b_lift/lift.jsonl --loops 6 \
      --config configs/webshop_gigpo.py:<the study recipe> \
      --variant default= --variant scale10=rspo.dense_scale=10

For each loop L = 0 .. loops-1 and each variant (taking turns, so a cut-short
run leaves the variants balanced): B := A (A is the policy the config
loads and never trains here), k steps on the dense reward, then B's stored
collection on the tasks and sampling seeds of its first training
collection (``rspo.b_lift_tasks='first'``). One JSON line per (variant,
loop) holds the loop's B_collect metrics: ``b_lift_success`` = success of
the stored collection - success of the first (B = A), and
``b_lift_dense_return`` likewise for the dense return per trajectory.
Every variant plays the same tasks in the same loop (the collection
counter and seed are the run's), so the variants' lifts are paired too.

Resumable: lines already in ``--out`` are skipped (a run is rebuilt and
advanced to the first missing loop by drawing, not playing, the earlier
loops' tasks: the task draws depend on the collection counter only).
The summary (``--report``) prints, per variant, the mean lift with a 95 %
bootstrap interval over loops (rspo_jax/intervals.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rspo_jax import build, intervals  # noqa: E402

KEYS = (
    "b_first_success",
    "b_stored_success",
    "b_lift_success",
    "b_first_dense_return",
    "b_stored_dense_return",
    "b_lift_dense_return",
)


def load_config(spec: str, extra: str):
  """``file.py:overrides`` + ``extra`` overrides -> a config."""
  import importlib.util  # noqa: PLC0415

  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("cfg", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  arg = ",".join(a for a in (arg, extra) if a)
  return module.get_config(arg or None)


def done_lines(out: str) -> list[dict]:
  if not os.path.exists(out):
    return []
  with open(out) as f:
    return [json.loads(line) for line in f if line.strip()]


def one_loop(trainer) -> dict:
  """B's phase of the trainer's current loop; its B_collect metrics."""
  rows, write = [], trainer.metrics.write

  def spy(step, phase, m):
    if phase == "B_collect":
      rows.append(m)
    return write(step, phase, m)

  trainer.metrics.write = spy
  try:
    trainer.b_phase()
  finally:
    trainer.metrics.write = write
  trainer.end_loop()
  trainer._after_loop_saved()  # D cleared
  (row,) = rows
  return row


def run(args) -> None:
  variants = dict(v.partition("=")[::2] for v in args.variant)
  done = {(d["variant"], d["loop"]) for d in done_lines(args.out)}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  runs = {}
  for name, extra in variants.items():
    cfg = load_config(args.config, extra)
    with cfg.unlocked():
      cfg.rspo.b_lift_tasks = "first"
    runs[name] = build.build_run(
        cfg, os.path.join(args.workdir, name), progress=False
    )
  try:
    for loop in range(args.loops):
      for name, r in runs.items():
        t = r.trainer
        collections = loop * (t.k + 1)  # k training + 1 stored collection
        if (name, loop) in done:
          continue
        t.state.loop, t.state.collections = loop, collections
        row = one_loop(t)
        line = {
            "variant": name,
            "loop": loop,
            "overrides": variants[name],
            **{k: row[k] for k in KEYS if k in row},
            "task_ids": row.get("rollout_task_ids"),
        }
        with open(args.out, "a") as f:
          f.write(json.dumps(line) + "\n")
        print(
            json.dumps({k: line[k] for k in line if k != "task_ids"}),
            flush=True,
        )
  finally:
    for r in runs.values():
      r.close()


def report(out: str) -> dict:
  """{variant: {key: mean and 95 % interval over loops}}."""
  by = {}
  for d in done_lines(out):
    by.setdefault(d["variant"], []).append(d)
  summary = {}
  for name, lines in by.items():
    summary[name] = {"loops": len(lines)}
    for key in ("b_lift_success", "b_lift_dense_return", "b_first_success"):
      x = np.array([[d[key]] for d in lines], np.float64)  # loops x 1
      summary[name][key] = intervals.success_interval(x)
  return summary


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", required=True)
  p.add_argument(
      "--variant",
      action="append",
      default=[],
      help="name=overrides (comma-separated key=value)",
  )
  p.add_argument("--loops", type=int, default=6)
  p.add_argument("--out", required=True)
  p.add_argument("--workdir", default="runs/b_lift")
  p.add_argument("--report", action="store_true", help="summary only")
  args = p.parse_args()
  if not args.report:
    if not args.variant:
      p.error("give at least one --variant name=overrides")
    run(args)
  print(json.dumps(report(args.out)))


if __name__ == "__main__":
  main()
