"""Kill -9 of launch/train.py anywhere in the RSPO loop, then a restart
(issue 9, fault 1; issue 5: "SIGKILL mid-phase, then restart ends at the
same step count with the same number of training steps and no lost buffer
shard").

Every case starts from the same warm start (tokenizer, behaviour-cloned
policy, start-of-RL eval) and runs the micro toy config of rspo_e2e_test
(2 loops, k = 1). The process SIGKILLs itself at one point
(``RSPO_FAULT_AT``, rspo_jax/faults.py) and is started again in the same
workdir. The finished run must match an uninterrupted one from the same
warm start: same A steps (one 'A' metrics row per step, duplicates of a
redone step allowed), same optimizer step count, same per-step data
(on-policy / replayed rows, generated tokens), the same losses and final
parameters to float32 rounding, and no partial checkpoint or shard left
behind or read.
"""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest

from rspo_e2e_test import MICRO
from rspo_jax import faults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM_FILES = ("tokenizer", "warm_start", "eval_start.json")
TOTAL_STEPS = 2  # MICRO: steps=2, rspo.k=1 -> checkpoints 1, 2, 3, 4

pytestmark = pytest.mark.slow


def _train(workdir: str, fault: str = "") -> subprocess.CompletedProcess:
  env = dict(os.environ, XLA_FLAGS="")  # one device, as a user runs it
  env.pop(faults.ENV_VAR, None)
  if fault:
    env[faults.ENV_VAR] = fault
  cmd = [
      sys.executable,
      os.path.join(ROOT, "launch/train.py"),
      f"--config={ROOT}/configs/toy_grpo.py:{MICRO}",
      f"--workdir={workdir}",
      "--no_progress",
      "--log_level=info",
  ]  # the checkpoint and resume lines
  return subprocess.run(
      cmd, capture_output=True, text=True, env=env, timeout=900
  )


def _copy_warm(warm: str, workdir: str) -> str:
  os.makedirs(workdir)
  for name in WARM_FILES:
    src = os.path.join(warm, name)
    if os.path.isdir(src):
      shutil.copytree(src, os.path.join(workdir, name))
    else:
      shutil.copy(src, workdir)
  return workdir


def _summary(workdir: str) -> dict:
  """What a finished run left: metrics per A step, the last checkpoint."""
  rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  a_rows = {}
  for r in rows:
    if r["phase"] == "A":
      a_rows[r["step"]] = r  # a redone step: its last row counts
  ckpt_dir = os.path.join(workdir, "checkpoints")
  mgr = ocp.CheckpointManager(ckpt_dir)
  step = mgr.latest_step()
  out = mgr.restore(
      step,
      args=ocp.args.Composite(
          policy=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()
      ),
  )
  mgr.close()
  params = [np.asarray(x) for x in _leaves(out["policy"]["params"])]
  return {
      "a_rows": a_rows,
      "n_a_rows": sum(r["phase"] == "A" for r in rows),
      "meta": out["meta"],
      "policy_step": int(out["policy"]["step"]),
      "params": params,
      "leftovers": glob.glob(os.path.join(ckpt_dir, "*tmp*"))
      + glob.glob(os.path.join(workdir, "replay*", "*.tmp")),
      "final_eval": json.load(open(os.path.join(workdir, "eval_final.json"))),
  }


def _leaves(tree):
  if isinstance(tree, dict):
    return [x for k in sorted(tree) for x in _leaves(tree[k])]
  return [tree]


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> str:
  """The warm start alone: a first process killed in B's first update."""
  run = str(tmp_path_factory.mktemp("warm") / "run")
  out = _train(run, "b_phase:1")
  assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
  return _copy_warm(run, str(tmp_path_factory.mktemp("template") / "w"))


@pytest.fixture(scope="module")
def baseline(warm, tmp_path_factory) -> dict:
  run = _copy_warm(warm, str(tmp_path_factory.mktemp("baseline") / "run"))
  out = _train(run)
  assert out.returncode == 0, out.stderr[-3000:]
  s = _summary(run)
  assert sorted(s["a_rows"]) == [1, 2] and s["n_a_rows"] == TOTAL_STEPS
  assert all(r["rows_off"] > 0 for r in s["a_rows"].values())  # replayed
  return s


def _resumed_state(stderr: str) -> str:
  m = re.search(r"resumed from checkpoint: (LoopState\([^)]*\))", stderr)
  return m.group(1) if m else ""


# fault -> (what the killed process left, the state the restart resumes
# from). Checkpoints: 1 after loop 0's B phase (phase A), 2 after A step 1
# (phase B), 3 after loop 1's B phase, 4 after A step 2.
CASES = {
    # B's phase of loop 1: resume at its start, B redone from A.
    "b_phase:2": ("nothing", "loop=1, phase='B', a_steps=1"),
    # B's collection of loop 1: closed shards but no _COMPLETE marker;
    # the restart must not use them (B's phase is redone, D rebuilt).
    "collect:2": ("unmarked_shards", "loop=1, phase='B', a_steps=1"),
    # A's first update: D (written by the dead process) is complete on
    # disk; the restart replays from it.
    "a_phase:1": ("complete_buffer", "loop=0, phase='A', a_steps=0"),
    # Mid-write of checkpoint 2: orbax's temporary directory is left; the
    # restart resumes from checkpoint 1.
    "checkpoint:2": ("partial_checkpoint", "loop=0, phase='A', a_steps=0"),
}


@pytest.mark.parametrize("fault", list(CASES))
def test_sigkill_then_restart_matches_an_uninterrupted_run(
    fault, warm, baseline, tmp_path
):
  left, resumes_from = CASES[fault]
  run = _copy_warm(warm, str(tmp_path / "run"))
  killed = _train(run, fault)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  replay_dir = os.path.join(run, "replay")
  shards = glob.glob(os.path.join(replay_dir, "*.array_record"))
  marked = os.path.exists(os.path.join(replay_dir, "_COMPLETE"))
  partial = glob.glob(os.path.join(run, "checkpoints", "*tmp*"))
  if left == "unmarked_shards":
    assert shards and not marked
  elif left == "complete_buffer":
    assert shards and marked
  elif left == "partial_checkpoint":
    assert partial
  assert not os.path.exists(os.path.join(run, "eval_final.json"))

  restarted = _train(run)
  assert restarted.returncode == 0, restarted.stderr[-3000:]
  assert resumes_from in _resumed_state(restarted.stderr)
  got = _summary(run)
  assert got["leftovers"] == []
  # Same step counts: A steps, distinct 'A' rows, optimizer steps.
  assert got["meta"]["a_steps"] == baseline["meta"]["a_steps"] == TOTAL_STEPS
  assert sorted(got["a_rows"]) == sorted(baseline["a_rows"])
  assert (
      got["policy_step"]
      == baseline["policy_step"]
      == sum(r["updates"] for r in baseline["a_rows"].values())
  )  # optimizer steps
  assert got["meta"]["loop"] == baseline["meta"]["loop"]
  # Same data per step (nothing lost, nothing stale replayed) and the same
  # numbers.
  for step, want in baseline["a_rows"].items():
    row = got["a_rows"][step]
    for key in (
        "rows_on",
        "rows_off",
        "rollout_gen_tokens",
        "rollout_env_steps",
        "skipped",
    ):
      assert row[key] == want[key], (step, key)
    assert row["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-8)
  for a, b in zip(got["params"], baseline["params"]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert got["final_eval"]["success_rate"] == (
      baseline["final_eval"]["success_rate"]
  )
