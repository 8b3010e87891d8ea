"""rspo_jax vs Tunix vs TRL (and SGLang): training and generation speed.

  python bench/compare.py [--quick] [--markdown=out.md]
      [--tunix_python=/work/venv-tunix/bin/python]
      [--torch_python=/work/venv-torch/bin/python] [--sglang_url=URL]

Each peer runs in its own process with its own virtual environment
(bench/_peer_{ours,tunix,trl,sglang}.py, each filling in the skeleton of
bench/_peer_template.py; see their docstrings for exactly what each
measures), one process per (peer, task), so peak RSS is per task.
Same model shape for all: Qwen2, random weights, float32; 'tiny' (3.48 M
params: vocab 2048, 4 layers, d 256, 4 heads, 2 KV heads, ff 704, tied) and
'small-25m' (24.7 M; --quick: tiny only).

Metrics (per shape; batch ``rows`` x (prompt 256 + response 32), groups of
8 rows sharing a prompt):
  train_step               pi_old + pi_ref log-probs, loss, backward,
                           optimizer: tokens / s (tokens = rows x 288)
  update                   loss + backward + optimizer only
  logprob_forward          one log-prob pass
  rl_step_with_generation  sampling the responses + train_step
  update_gflops            PaLM train FLOPs (bench/_common.py) / update s
  update_frac_of_peak      update_gflops / the best peak_matmul measured
                           on this machine in the same run (any framework)
  generate_bN              new tokens / s, N distinct prompts, 32 new
                           tokens, temperature 1, log-probs returned
  first_*                  first call (compilation included), seconds
  peak_rss_{train,gen}     peak RSS of the worker process, MiB
  peak_matmul              best float32 2048^2 matmul, GFLOP/s
Output: JSON lines {"metric", "shape", "peer", "ours", "theirs", "unit",
"ratio", "ratio_cpu"}; ``ratio`` > 1 always favours rspo_jax (ours/theirs
for rates, theirs/ours for seconds and MiB); ``ratio_cpu`` is the same ratio
on process CPU seconds, steadier than wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import _common

HERE = Path(__file__).resolve().parent
SHAPE_NAMES = {"tiny": "qwen2-3.5m", "small-25m": "qwen2-25m"}
PEER_LABELS = {
    "ours": "rspo_jax",
    "tunix": "Tunix",
    "trl": "TRL",
    "sglang": "SGLang",
}


def shape_of(preset: str) -> dict:
  from rspo_jax import models

  cfg = models.get_model_config(preset)
  keys = (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
      "rope_theta",
      "rms_norm_eps",
      "tie_word_embeddings",
  )
  shape = {k: getattr(cfg, k) for k in keys}
  shape.update(preset=preset, params=cfg.num_params())
  return shape


def run_worker(
    python: str, peer: str, task: str, args, shape=None, extra=()
) -> list[dict]:
  """Runs one worker; its metric lines, or one {'error'} line."""
  cmd = [
      python,
      str(HERE / f"_peer_{peer}.py"),
      "--task",
      task,
      "--rows",
      str(args.rows),
      "--group",
      str(args.group),
      "--iters",
      str(args.iters),
      "--gen_batches",
      args.gen_batches,
      *extra,
  ]
  if shape is not None:
    cmd += ["--shape", json.dumps(shape)]
  env = dict(os.environ)
  if peer == "trl" and args.torch_threads:
    cmd += ["--torch_threads", str(args.torch_threads)]
    env.update(
        OMP_NUM_THREADS=str(args.torch_threads),
        MKL_NUM_THREADS=str(args.torch_threads),
    )
  load0 = _common.load_average()
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=env,
        timeout=args.worker_timeout,
        check=False,
    )
  except subprocess.TimeoutExpired:
    return [{"error": f"timeout after {args.worker_timeout} s"}]
  wall = round(time.perf_counter() - t0, 1)
  rows = []
  for line in proc.stdout.splitlines():
    try:  # peers print their own dicts too (TRL's train summary)
      row = json.loads(line)
    except ValueError:
      continue
    if isinstance(row, dict) and "metric" in row:
      row.update(wall_s=wall, load_before=load0)
      rows.append(row)
  if proc.returncode != 0 or not rows:
    tail = (proc.stderr or proc.stdout)[-1500:]
    return [{"error": f"rc={proc.returncode}: {tail}"}]
  return rows


def compare_rows(results: dict, shape_name: str, peak: float) -> list[dict]:
  """results[peer] = {metric: row}; one row per (metric, other peer)."""
  ours = results.get("ours", {})
  out = []
  for peer, theirs in results.items():
    if peer == "ours":
      continue
    for name, mine in ours.items():
      other = theirs.get(name)
      if other is None:
        continue
      up = mine["better"] == "higher"
      row = {
          "metric": name,
          "shape": shape_name,
          "peer": peer,
          "ours": _round(mine["value"]),
          "theirs": _round(other["value"]),
          "unit": mine["unit"],
          "ratio": _common.ratio(mine["value"], other["value"], up),
      }
      if mine.get("cpu_s") and other.get("cpu_s"):
        row["ratio_cpu"] = _common.ratio(other["cpu_s"], mine["cpu_s"])
      out.append(row)
    mine, other = ours.get("update_gflops"), theirs.get("update_gflops")
    if mine and other and peak:
      out.append(
          {
              "metric": "update_frac_of_peak",
              "shape": shape_name,
              "peer": peer,
              "ours": round(mine["value"] / peak, 3),
              "theirs": round(other["value"] / peak, 3),
              "unit": "fraction",
              "ratio": _common.ratio(mine["value"], other["value"]),
          }
      )
  return out


def _round(x):
  return round(x, 3) if isinstance(x, float) else x


def markdown(rows: list[dict], header: str) -> str:
  """One table per shape: metric | unit | ours | peer | ratio ... ."""
  peers = [
      p for p in ("tunix", "trl", "sglang") if any(r["peer"] == p for r in rows)
  ]
  lines = [header, ""]
  for shape in dict.fromkeys(r["shape"] for r in rows):
    lines += [f"### {shape}", ""]
    cols = ["metric", "unit", "rspo_jax"]
    for p in peers:
      cols += [PEER_LABELS[p], f"ratio vs {PEER_LABELS[p]}"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    table = {}
    for r in rows:
      if r["shape"] == shape:
        table.setdefault((r["metric"], r["unit"]), {})[r["peer"]] = r
    for (name, unit), by_peer in table.items():
      first = next(iter(by_peer.values()))
      cells = [name, unit, _fmt(first["ours"])]
      for p in peers:
        r = by_peer.get(p)
        cells += [_fmt(r["theirs"]), _fmt(r["ratio"])] if r else ["-", "-"]
      lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
  return "\n".join(lines)


def _fmt(x) -> str:
  if x is None:
    return "-"
  if isinstance(x, float):
    return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"
  return str(x)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument(
      "--quick",
      action="store_true",
      help="'tiny' shape only, 2 timed iterations",
  )
  p.add_argument("--shapes", default="tiny,small-25m")
  p.add_argument("--peers", default="tunix,trl")
  p.add_argument("--ours_python", default=sys.executable)
  p.add_argument("--tunix_python", default="/work/venv-tunix/bin/python")
  p.add_argument("--torch_python", default="/work/venv-torch/bin/python")
  p.add_argument(
      "--sglang_url",
      default="",
      help="an SGLang server serving the first shape's model",
  )
  p.add_argument("--rows", type=int, default=16)
  p.add_argument("--group", type=int, default=8)
  p.add_argument("--iters", type=int, default=0, help="0: 2 quick, else 3")
  p.add_argument("--gen_batches", default="16,128")
  p.add_argument(
      "--torch_threads",
      type=int,
      default=1,
      help="TRL's torch threads (0 = torch's default); 1 is"
      " fastest on the shared 2-core machine",
  )
  p.add_argument("--worker_timeout", type=int, default=1200)
  p.add_argument("--markdown", default="")
  args = p.parse_args(argv)
  cmdline = " ".join(
      shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
  )
  args.iters = args.iters or (2 if args.quick else 3)
  shapes = ["tiny"] if args.quick else args.shapes.split(",")
  pythons = {
      "ours": args.ours_python,
      "tunix": args.tunix_python,
      "trl": args.torch_python,
  }
  peers = ["ours"] + [x for x in args.peers.split(",") if x]
  for peer in peers:
    if peer not in pythons:
      raise ValueError(f"unknown peer {peer!r}; known: {sorted(pythons)}")
    if not Path(pythons[peer]).exists():
      raise ValueError(f"{peer}: python {pythons[peer]} not found")
  start = time.perf_counter()
  stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
  load_start = _common.load_average()

  peaks = {}
  for peer in peers:
    for row in run_worker(pythons[peer], peer, "matmul", args):
      _common.emit({"peer": peer, **row})
      if "metric" in row:
        peaks[peer] = row
  best_peak = max((r["value"] for r in peaks.values()), default=0.0)
  all_rows = []
  for peer, row in peaks.items():
    if peer != "ours" and "ours" in peaks:
      all_rows.append(
          {
              "metric": "peak_matmul",
              "shape": "-",
              "peer": peer,
              "ours": _round(peaks["ours"]["value"]),
              "theirs": _round(row["value"]),
              "unit": row["unit"],
              "ratio": _common.ratio(peaks["ours"]["value"], row["value"]),
          }
      )

  for preset in shapes:
    shape, name = shape_of(preset), SHAPE_NAMES.get(preset, preset)
    results = {peer: {} for peer in peers}
    for task in ("train", "gen"):
      for peer in peers:
        for row in run_worker(pythons[peer], peer, task, args, shape):
          _common.emit(
              {"peer": peer, "shape": name, "task": task, **row},
              stream=sys.stderr,
          )
          if "metric" in row:
            results[peer][row["metric"]] = row
    if args.sglang_url and preset == shapes[0]:
      results["sglang"] = {}
      for row in run_worker(
          args.ours_python,
          "sglang",
          "gen",
          args,
          shape,
          extra=("--url", args.sglang_url),
      ):
        if "metric" in row:
          results["sglang"][row["metric"]] = row
    rows = compare_rows(results, name, best_peak)
    for row in rows:
      _common.emit(row)
    all_rows += rows

  if args.markdown:
    header = (
        f"Run {stamp}: `python bench/compare.py {cmdline}`"
        f" ({args.iters} timed"
        f" iterations after one warm-up; {_common.machine_info()['cpus']}"
        f" CPUs; load average {load_start} at the start,"
        f" {_common.load_average()} at the end;"
        f" {time.perf_counter() - start:.0f} s in all; TRL with"
        f" {args.torch_threads or 'default'} torch thread(s))."
    )
    Path(args.markdown).write_text(markdown(all_rows, header) + "\n")


if __name__ == "__main__":
  main()
