"""The toy RSPO run, number for number: a refactor must not change it.

``launch/train.py`` on the smallest toy config (behaviour cloning, two RSPO
loops of GRPO, B's phase, the replay buffer, A's mixed step, the
evaluations) at seed 0. Every metric it writes to ``metrics.jsonl`` and both
evaluations must equal the recorded ones exactly, except wall-clock keys
(``time`` and every ``*_s`` key) and compile counts (the ``compile`` rows,
keys naming compiles or the cache: they depend on a persistent
compilation cache's contents).

The numbers are XLA's CPU numbers: another jax / jaxlib / numpy version or
another CPU model may change a low bit, so the test skips (saying why) when
the recorded fingerprint differs from this machine's. To record again, after
a change that is meant to change the numbers (and say which step moved and
why in the commit message):

  RSPO_RECORD_GOLDEN=1 python -m pytest -m slow tests/golden_run_test.py
"""

import json
import os
import platform
import subprocess
import sys

import jax
import jaxlib
import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "data", "golden", "toy_rspo_run.json")
CONFIG = (
    "model.overrides=num_layers=1;hidden_size=64;intermediate_size=128;"
    "num_heads=2;num_kv_heads=1;head_dim=32,model.tokenizer_vocab=300,"
    "sft.steps=8,sft.num_episodes=16,sft.batch_rows=16,"
    "train.batch_tasks=2,train.group_size=2,rspo.alpha=0.5,rspo.k=1,"
    "steps=2,env.max_steps=4,env.num_eval_tasks=4,env.num_workers=1,"
    "rollout.max_new_tokens=16,rollout.max_prompt_tokens=256"
)


def fingerprint() -> dict:
  cpu = ""
  if os.path.exists("/proc/cpuinfo"):
    for line in open("/proc/cpuinfo"):
      if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
  return {
      "jax": jax.__version__,
      "jaxlib": jaxlib.__version__,
      "numpy": np.__version__,
      "machine": platform.machine(),
      "cpu": cpu,
  }


def deterministic(row: dict) -> dict:
  """The row without wall-clock keys and compile counts (which depend on
  what a persistent compilation cache already holds, as in CI)."""
  return {
      k: v
      for k, v in row.items()
      if k != "time"
      and not k.endswith("_s")
      and "compile" not in k
      and "cache" not in k
  }


def run_once(workdir: str) -> dict:
  cmd = [
      sys.executable,
      os.path.join(ROOT, "launch", "train.py"),
      f"--config={ROOT}/configs/toy_grpo.py:{CONFIG}",
      f"--workdir={workdir}",
      "--no_progress",
  ]
  env = dict(os.environ, XLA_FLAGS="")
  out = subprocess.run(
      cmd, capture_output=True, text=True, env=env, timeout=1200
  )
  assert out.returncode == 0, out.stderr[-3000:]
  rows = [
      deterministic(r)
      for r in map(json.loads, open(os.path.join(workdir, "metrics.jsonl")))
      if r["phase"] != "compile"
  ]
  evals = {
      name: json.load(open(os.path.join(workdir, f"{name}.json")))
      for name in ("eval_start", "eval_final")
  }
  return {"metrics": rows, **evals}


def test_toy_rspo_run_is_unchanged(tmp_path):
  got = run_once(str(tmp_path / "run"))
  if os.environ.get("RSPO_RECORD_GOLDEN"):
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w") as f:
      json.dump({"fingerprint": fingerprint(), **got}, f, indent=1)
    pytest.skip(f"recorded {GOLDEN}")
  want = json.load(open(GOLDEN))
  if want["fingerprint"] != fingerprint():
    pytest.skip(
        f"recorded on {want['fingerprint']}, this machine is "
        f"{fingerprint()}: XLA's CPU numbers may differ"
    )
  assert len(got["metrics"]) == len(want["metrics"])
  for i, (g, w) in enumerate(zip(got["metrics"], want["metrics"])):
    changed = {
        k: (w.get(k), g.get(k)) for k in set(g) | set(w) if g.get(k) != w.get(k)
    }
    assert not changed, (
        f"metrics.jsonl row {i} (phase {w.get('phase')}, step "
        f"{w.get('step')}) changed: {{key: (recorded, now)}} = {changed}"
    )
  for name in ("eval_start", "eval_final"):
    assert got[name] == want[name], name
