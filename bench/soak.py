r"""Soak: many short RSPO loops in one process; does anything grow?

  python bench/soak.py                 # 16 loops of the micro toy config
  python bench/soak.py --loops 50 --workdir /tmp/soak

Each loop is one full RSPO loop (k = 1) of the micro toy config of
``tests/rspo_e2e_test.py``: B := A, B's update, B's collection into the
replay shards, A's update on a mixed batch, checkpoint, buffer cleared. One
JSON line per loop:

  rss_mb       resident memory of this process (/proc/self/status VmRSS)
  open_fds     open file descriptors (/proc/self/fd)
  os_threads   threads of this process (XLA's pools included)
  children     live child processes (the environment workers)
  live_arrays  jax arrays alive (jax.live_arrays())
  workdir_mb   disk use of the run directory (checkpoints, replay, metrics)
  loop_s       wall time of the loop

and a last line, ``"summary"``, with each quantity's growth per loop: the
least-squares slope over the second half of the loops (the first half
includes compilation). Flat (about 0) means no leak; ``workdir_mb`` grows by
the metrics lines only (orbax keeps two checkpoints, D is cleared).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import _common

# Same as tests/rspo_e2e_test.py's MICRO (1-layer 64-wide model, 2 groups
# of 2 toy episodes of <= 4 steps, k = 1).
MICRO = (
    "model.overrides=num_layers=1;hidden_size=64;intermediate_size=128;"
    "num_heads=2;num_kv_heads=1;head_dim=32,model.tokenizer_vocab=300,"
    "sft.steps=8,sft.num_episodes=16,sft.batch_rows=16,"
    "train.batch_tasks=2,train.group_size=2,rspo.alpha=0.5,rspo.k=1,"
    "steps=1,env.max_steps=4,env.num_eval_tasks=4,env.num_workers=1,"
    "rollout.max_new_tokens=16,rollout.max_prompt_tokens=256"
)
KEYS = (
    "rss_mb",
    "open_fds",
    "os_threads",
    "children",
    "live_arrays",
    "workdir_mb",
    "loop_s",
)


def _status(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  return -1


def _children() -> int:
  n = 0
  for tid in os.listdir("/proc/self/task"):
    try:
      with open(f"/proc/self/task/{tid}/children") as f:
        n += len(f.read().split())
    except OSError:
      pass
  return n


def _disk_mb(path: str) -> float:
  total = 0
  for dirpath, _, files in os.walk(path):
    for name in files:
      try:
        total += os.lstat(os.path.join(dirpath, name)).st_size
      except OSError:  # removed meanwhile (orbax's old checkpoints)
        pass
  return total / 2**20


def measure(workdir: str) -> dict:
  import jax  # pylint: disable=import-outside-toplevel

  return {
      "rss_mb": round(_status("VmRSS") / 1024, 1),
      "open_fds": len(os.listdir("/proc/self/fd")),
      "os_threads": _status("Threads"),
      "py_threads": threading.active_count(),
      "children": _children(),
      "live_arrays": len(jax.live_arrays()),
      "workdir_mb": round(_disk_mb(workdir), 3),
  }


def slope(ys) -> float:
  """Least-squares growth per loop of ``ys`` (0 for fewer than 2 points)."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  if len(ys) < 2:
    return 0.0
  return float(np.polyfit(np.arange(len(ys)), np.asarray(ys, float), 1)[0])


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--loops", type=int, default=16)
  p.add_argument("--workdir", default=None, help="default: a temporary dir")
  p.add_argument("--config", default="", help="extra key=value overrides")
  args = p.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from configs import toy_grpo  # pylint: disable=import-outside-toplevel
  from rspo_jax import build  # pylint: disable=import-outside-toplevel

  workdir = args.workdir or tempfile.mkdtemp(prefix="rspo_soak_")
  cfg = toy_grpo.get_config(MICRO + ("," + args.config if args.config else ""))
  run = build.build_run(cfg, workdir, progress=False)
  rows = []
  try:
    run.trainer.try_resume()
    first = run.trainer.state.a_steps
    _common.emit({"loop": -1, "phase": "built", **measure(workdir)})
    for i in range(args.loops):
      with cfg.unlocked():
        cfg.train.total_steps = first + i + 1  # run() stops after one loop
      t0 = time.perf_counter()
      run.trainer.run()
      row = {
          "loop": i,
          **measure(workdir),
          "loop_s": round(time.perf_counter() - t0, 2),
      }
      rows.append(row)
      _common.emit(row)
  finally:
    run.close()
  tail = rows[len(rows) // 2 :]
  _common.emit(
      {
          "summary": "growth per loop, second half",
          "loops": len(rows),
          **{k: round(slope([r[k] for r in tail]), 4) for k in KEYS},
          "workdir": workdir,
      }
  )


if __name__ == "__main__":
  main()
