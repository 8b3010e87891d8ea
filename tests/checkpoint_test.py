"""Checkpoints (issue 16 item 5): ``train.checkpoint_every`` honoured,
asynchronous saves, exact resumption from a checkpoint several steps back.

Which A steps are saved: ``checkpoint.due`` = every N-th step and each
loop's (and the run's) last; the loop also saves after B's collection.
Orbax steps: 2 * a_steps + (phase == 'A').

The slow test runs launch/train.py on the micro toy config of
rspo_e2e_test with k = 3 and checkpoint_every = 2 (RSPO, and RSPO_H): a
run saves after B's phase (1), after A step 2 (5) and after A step 3, the
loop's end (6) -- not after A step 1. A copy killed in A step 2 (before
that step's save) restarts from checkpoint 1, redoes steps 1 and 2 and
ends like the uninterrupted run, to float32 rounding. The restart reads
its compiled programs back from the persistent cache (<workdir>/compile_cache,
or the test session's $JAX_COMPILATION_CACHE_DIR: tests/conftest.py). A
copy sent SIGTERM in A step 1 (preemption.py) checkpoints that step, exits
with 143 and resumes after it.
"""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rspo_e2e_test import MICRO
from rspo_jax import checkpoint, compile_cache, faults
from rspo_jax.checkpoint import RunCheckpointer
from rspo_jax.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------- schedule


def test_due_saves_every_nth_step_and_each_loops_last():
  # k = 3, 7 steps: loops end after steps 3, 6 and 7 (the run's end).
  loop_done = lambda a: a % 3 == 0 or a == 7
  saved = lambda every: [
      a for a in range(1, 8) if checkpoint.due(a, every, loop_done(a))
  ]
  assert saved(2) == [2, 3, 4, 6, 7]
  assert saved(5) == [3, 5, 6, 7]
  assert saved(1) == saved(0) == [1, 2, 3, 4, 5, 6, 7]


# --------------------------------------------------------- async saves


def test_save_returns_with_the_arrays_copied_and_close_waits(tmp_path):
  """After ``save`` returns, the caller may donate or delete its arrays
  (a train step does): the checkpoint still holds the values at the call.
  ``close`` waits for the write; a new checkpointer restores it."""
  d = str(tmp_path / "checkpoints")
  ck = RunCheckpointer(d)
  w = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones((4,))}
  want = jax.tree.map(np.asarray, w)
  ck.save(1, {"policy": w}, {"a_steps": 0})
  jax.tree.map(lambda x: x.delete(), w)  # as a donating step would
  ck.save(
      3,
      {"policy": {"w": jnp.zeros((2, 3)), "b": jnp.zeros((4,))}},
      {"a_steps": 1},
  )  # waits for step 1's write first
  ck.close()
  assert ck.saved_steps == [1, 3]
  ck = RunCheckpointer(d)
  assert ck.latest_step() == 3
  like = {"policy": {"w": jnp.zeros((2, 3)), "b": jnp.zeros((4,))}}
  states, meta = ck.restore(like, step=1)
  assert meta == {"a_steps": 0}
  for k in want:
    np.testing.assert_array_equal(states["policy"][k], want[k])
  ck.close()


# ------------------------------------------------ kill and resume, N = 2


def config(steps: int, extra: str = "") -> str:
  """The micro toy run with k = 3, ``steps`` A steps, checkpoint_every=2."""
  out = (
      MICRO.replace("rspo.k=1,", "rspo.k=3,").replace(
          ",steps=2,", f",steps={steps},"
      )
      + ",train.checkpoint_every=2"
      + extra
  )
  assert "rspo.k=3," in out and f",steps={steps}," in out
  return out


# case -> (config, orbax steps saved by an uninterrupted run). RSPO: after
# B's phase (1), A step 2 (5), A step 3 = the loop's end (6). RSPO_H (no B,
# A's groups of a loop are the next loop's D), 4 steps: 1, 5, 6, after the
# (empty) B phase of loop 1 (7), A step 4 = the run's end (8).
CASES = {
    "rspo": (config(3), [1, 5, 6]),
    "rspo_h": (config(4, ",rspo.data_source=history"), [1, 5, 6, 7, 8]),
}
WARM_FILES = ("tokenizer", "warm_start", "eval_start.json")


def train(
    workdir: str, cfg: str, fault: str = "", fault_env: dict = None
) -> subprocess.CompletedProcess:
  env = dict(
      os.environ,
      XLA_FLAGS="",
      # Cache every program (JAX keeps those of >= 1 s by default;
      # the micro model's compile faster).
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  env.pop(faults.ENV_VAR, None)
  env.pop(faults.SIGNAL_VAR, None)
  if fault:
    env[faults.ENV_VAR] = fault
  env.update(fault_env or {})
  cmd = [
      sys.executable,
      os.path.join(ROOT, "launch/train.py"),
      f"--config={ROOT}/configs/toy_grpo.py:{cfg}",
      f"--workdir={workdir}",
      "--no_progress",
      "--log_level=info",
  ]  # the checkpoint and resume lines
  return subprocess.run(
      cmd, capture_output=True, text=True, env=env, timeout=900
  )


def saves_logged(stderr: str) -> list[int]:
  return [
      int(n)
      for n in re.findall(
          r"checkpoint (\d+): writing in the background", stderr
      )
  ]


def a_rows(workdir: str) -> dict:
  """The last 'A' metrics row of each step (a redone step writes again)."""
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"), "A")
  return {r["step"]: r for r in rows}


def final_params(workdir: str) -> list:
  ck = RunCheckpointer(os.path.join(workdir, "checkpoints"))
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  out = ck._mgr.restore(
      ck.latest_step(),
      args=ocp.args.Composite(  # pylint: disable=protected-access
          policy=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()
      ),
  )
  ck.close()
  leaves = jax.tree_util.tree_leaves_with_path(out["policy"]["params"])
  return out["meta"], [
      np.asarray(x)
      for _, x in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0]))
  ]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
  """case -> (workdir, stderr) of the uninterrupted run, made once."""
  done = {}

  def get(case: str):
    if case not in done:
      base = str(tmp_path_factory.mktemp(f"baseline_{case}"))
      out = train(base, CASES[case][0])
      assert out.returncode == 0, out.stderr[-3000:]
      done[case] = (base, out.stderr)
    return done[case]

  return get


def copy_warm_start(base: str, run: str) -> None:
  """Same warm start and start-of-RL evaluation as ``base``."""
  os.makedirs(run)
  for name in WARM_FILES:
    src = os.path.join(base, name)
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(
        src, os.path.join(run, name)
    )


def assert_same_run(run: str, base: str, steps: int) -> None:
  """Same A rows, parameters (to float32 rounding) and final evaluation."""
  want_meta, want_params = final_params(base)
  got_meta, got_params = final_params(run)
  assert got_meta["a_steps"] == want_meta["a_steps"] == steps
  assert got_meta["loop"] == want_meta["loop"]
  want_rows, got_rows = a_rows(base), a_rows(run)
  assert sorted(got_rows) == sorted(want_rows)
  for step, want in want_rows.items():
    row = got_rows[step]
    for key in (
        "rows_on",
        "rows_off",
        "rollout_gen_tokens",
        "rollout_env_steps",
        "updates",
        "skipped",
    ):
      assert row[key] == want[key], (step, key)
    assert row["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-8)
  for a, b in zip(got_params, want_params):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  final = lambda d: json.load(open(os.path.join(d, "eval_final.json")))
  assert final(run)["success_rate"] == final(base)["success_rate"]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_checkpoint_every_two_saves_those_steps_and_resumes_exactly(
    case, baseline, tmp_path
):
  """Killed in A step 2 (before its save): the restart resumes from the
  checkpoint after B's phase and redoes steps 1-2 (RSPO_H: step 1's groups,
  already in the next loop's D, are dropped and written again)."""
  cfg, saved = CASES[case]
  steps = 4 if case == "rspo_h" else 3
  base, base_log = baseline(case)
  assert saves_logged(base_log) == saved
  assert os.listdir(
      compile_cache.cache_dir(
          ml_collections.ConfigDict({"train": {"compile_cache_dir": ""}}), base
      )
  )
  want_rows = a_rows(base)
  assert sorted(want_rows) == list(range(1, steps + 1))
  assert want_rows[steps]["rows_off"] > 0  # replayed in the last loop

  run = str(tmp_path / "run")
  copy_warm_start(base, run)
  killed = train(run, cfg, "a_phase:2")
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert saves_logged(killed.stderr) == [1]  # step 1 was not saved
  restarted = train(run, cfg)
  assert restarted.returncode == 0, restarted.stderr[-3000:]
  assert (
      "resumed from checkpoint: LoopState(loop=0, phase='A', a_steps=0"
      in restarted.stderr
  )
  assert saves_logged(restarted.stderr) == saved[1:]
  assert glob.glob(os.path.join(run, "checkpoints", "*tmp*")) == []
  # The restart read programs back from the persistent cache.
  compile_rows = read_metrics(os.path.join(run, "metrics.jsonl"), "compile")
  assert sum(r["cache_hits"] for r in compile_rows) > 0
  assert_same_run(run, base, steps)


@pytest.mark.slow
def test_sigterm_checkpoints_the_step_in_progress_and_resumes_exactly(
    baseline, tmp_path
):
  """SIGTERM in A step 1 (whose checkpoint is not due at
  checkpoint_every=2): the step finishes, is saved (orbax step 3), the
  process exits with 143 without a final evaluation; the restart resumes
  after step 1 -- nothing redone -- and ends like the uninterrupted run."""
  cfg, saved = CASES["rspo"]
  base, _ = baseline("rspo")
  run = str(tmp_path / "run")
  copy_warm_start(base, run)
  env_term = {faults.SIGNAL_VAR: "TERM"}
  stopped = train(run, cfg, "a_phase:1", env_term)
  assert stopped.returncode == 143, stopped.stderr[-3000:]
  assert "stopped on SIGTERM after A step 1" in stopped.stderr
  assert saves_logged(stopped.stderr) == [1, 3]
  assert not os.path.exists(os.path.join(run, "eval_final.json"))
  assert sorted(a_rows(run)) == [1]
  restarted = train(run, cfg)
  assert restarted.returncode == 0, restarted.stderr[-3000:]
  assert (
      "resumed from checkpoint: LoopState(loop=0, phase='A', a_steps=1"
      in restarted.stderr
  )
  assert saves_logged(restarted.stderr) == saved[1:]
  assert_same_run(run, base, 3)


@pytest.mark.slow
def test_sigterm_in_b_phase_stops_at_the_next_b_step_and_redoes_b(
    baseline, tmp_path
):
  """SIGTERM in B's 2nd of 3 steps (loop 0): the process exits with 143
  after that B step, not after B's phase, saving nothing (B is redone from
  A on resume, as after a kill there); the restart ends like the
  uninterrupted run."""
  cfg, _ = CASES["rspo"]
  base, _ = baseline("rspo")
  run = str(tmp_path / "run")
  copy_warm_start(base, run)
  stopped = train(run, cfg, "b_phase:2", {faults.SIGNAL_VAR: "TERM"})
  assert stopped.returncode == 143, stopped.stderr[-3000:]
  assert "stopped on SIGTERM after A step 0" in stopped.stderr
  assert saves_logged(stopped.stderr) == []
  metrics = os.path.join(run, "metrics.jsonl")
  assert len(read_metrics(metrics, "B")) == 2 and not a_rows(run)
  restarted = train(run, cfg)
  assert restarted.returncode == 0, restarted.stderr[-3000:]
  assert "resumed from checkpoint" not in restarted.stderr
  assert_same_run(run, base, 3)
