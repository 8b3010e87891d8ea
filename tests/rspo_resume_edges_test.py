"""Crash safety of what the RSPO loop keeps on disk besides checkpoints.

In process, on the micro toy config of rspo_e2e_test (k = 1, 2 A steps):
a run "killed" at one point (``Killed`` raised there; whatever it had
written stays on disk, background checkpoint writes finish), then a new
run in the same workdir resumes and finishes. It must end like a run that
was never killed.

1. RSPO_H (``rspo.data_source=history``): at a loop's end A's groups of the
   loop (``replay_next``) replace D (``replay``). Killed around that move
   -- in the loop-end save, after it, between D's removal and the rename,
   after the move (in the next save: the move is not redone) -- the
   resumed run replays the same data: same rows per step, losses and
   parameters. (Before the fix the move came
   before the save: killed in the save, the redone last step of loop 0
   replayed loop 0's own groups, which the uninterrupted run never does.)
2. PRM refresh (``rspo.prm_refresh_loops=1``, k = 2): the head is refit
   at the loop's end on A's trajectories of the loop. Killed after A step
   1's checkpoint, or in the loop-end save, the resumed run refits on the
   same trajectories (same traj ids, same rewards) as the uninterrupted
   one. (Before the fix they lived in memory: the refit saw step 2's only.)
"""

import os
import shutil

import jax
import numpy as np
import pytest

from configs import toy_grpo
from rspo_e2e_test import MICRO
from rspo_jax import build, replay
from rspo_jax.metrics import read_metrics

HISTORY = MICRO + ",rspo.data_source=history"
PRM = (
    MICRO.replace("rspo.k=1,", "rspo.k=2,")
    + ",train.checkpoint_every=1,rspo.dense_reward=prm,rspo.prm_steps=20,"
    "rspo.prm_train_groups=4,rspo.prm_refresh_loops=1"
)
WARM = ("tokenizer", "warm_start", "prm")


class Killed(Exception):
  """Stands for a SIGKILL at the point that raises it."""


def train(workdir: str, cfg: str, kill=None, refits=None):
  """Resumes (if it can) and runs to the end; ``kill(trainer)``
  arms a ``Killed``. Returns A's final parameters (None when killed);
  ``refits`` receives each PRM refit's records."""
  run = build.build_run(toy_grpo.get_config(cfg), workdir, progress=False)
  t = run.trainer
  try:
    t.try_resume()
    if refits is not None:
      refit = t.prm_refresh
      t.prm_refresh = lambda records: refits.append(records) or refit(records)
    if kill is not None:
      kill(t)
    try:
      t.run()
    except Killed:
      return None
    t.ckpt.wait()
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(t.a.params))]
  finally:
    run.close()


def warm_copy(template: str, workdir: str) -> str:
  os.makedirs(workdir)
  for name in WARM:
    if os.path.exists(os.path.join(template, name)):
      shutil.copytree(os.path.join(template, name), os.path.join(workdir, name))
  return workdir


def kill_in_save(phase: str, a_steps: int, after: bool = False):
  """Killed in the save of (``phase``, ``a_steps``): before it is written,
  or (``after``) once it is on disk."""

  def arm(t, monkeypatch=None):
    save = t.save

    def killing_save():
      hit = (t.state.phase, t.state.a_steps) == (phase, a_steps)
      if hit and not after:
        raise Killed
      save()
      if hit:
        t.ckpt.wait()
        raise Killed

    t.save = killing_save

  return arm


def a_rows(workdir: str) -> dict:
  """The last 'A' metrics row of each step (a redone step writes again)."""
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"), "A")
  return {r["step"]: r for r in rows}


def assert_same_run(run: str, params, base: str, base_params) -> None:
  want, got = a_rows(base), a_rows(run)
  assert sorted(got) == sorted(want) == [1, 2]
  for step, row in want.items():
    for key in (
        "rows_on",
        "rows_off",
        "rollout_gen_tokens",
        "rollout_env_steps",
        "updates",
    ):
      assert got[step][key] == row[key], (step, key)
    assert got[step]["loss"] == pytest.approx(row["loss"], rel=1e-5, abs=1e-8)
  for a, b in zip(params, base_params):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
  """Tokenizer, warm start and (PRM config) the starting PRM, made once."""
  done = {}

  def get(cfg: str) -> str:
    if cfg not in done:
      path = str(tmp_path_factory.mktemp("template"))
      run = build.build_run(toy_grpo.get_config(cfg), path, progress=False)
      run.close()
      done[cfg] = path
    return done[cfg]

  return get


@pytest.fixture(scope="module")
def history_baseline(template, tmp_path_factory):
  run = warm_copy(
      template(HISTORY), str(tmp_path_factory.mktemp("base_h") / "run")
  )
  params = train(run, HISTORY)
  rows = a_rows(run)
  assert rows[1]["rows_off"] == 0 and rows[2]["rows_off"] > 0  # D: loop 0's
  return run, params


def kill_mid_move(t, monkeypatch):
  """Killed once D is deleted, before A's groups are renamed onto it."""
  rmtree = shutil.rmtree

  def killing_rmtree(path, *args, **kw):
    rmtree(path, *args, **kw)
    if path == t.buffer.directory:
      raise Killed

  monkeypatch.setattr(shutil, "rmtree", killing_rmtree)


# point -> (the kill, what the restart resumes from: (phase, a_steps)).
# Saves of the run: (A, 0) after loop 0's (empty) B phase, (B, 1) at loop
# 0's end, (A, 1) after loop 1's B phase, (B, 2) at the run's end.
HISTORY_KILLS = {
    "in_loop_end_save": (kill_in_save("B", 1), ("A", 0)),
    "after_loop_end_save": (kill_in_save("B", 1, after=True), ("B", 1)),
    "mid_move": (kill_mid_move, ("B", 1)),
    "after_move": (kill_in_save("A", 1), ("B", 1)),
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(HISTORY_KILLS))
def test_rspo_h_killed_around_the_loop_end_resumes_exactly(
    point, template, history_baseline, tmp_path, monkeypatch
):
  kill, resumes_from = HISTORY_KILLS[point]
  base, base_params = history_baseline
  run = warm_copy(template(HISTORY), str(tmp_path / "run"))
  assert train(run, HISTORY, lambda t: kill(t, monkeypatch)) is None
  monkeypatch.undo()
  resumed = {}

  def note(t):
    resumed["at"] = (t.state.phase, t.state.a_steps)
    if resumed["at"][0] == "B":  # a loop's start: D is loop 0's 4 episodes
      ids = [tr.steps[0].traj_id for tr in t.buffer.trajectories()]
      assert len(ids) == 4 and {i // 100_000 for i in ids} == {1}

  params = train(run, HISTORY, note)
  assert_same_run(run, params, base, base_params)
  assert resumed["at"] == resumes_from


# ------------------------------------------------------------- PRM refresh


def refit_summary(refits) -> list:
  """Per refit: [(traj_id, step_idx, outcome reward)] sorted."""
  return [
      sorted((r.traj_id, r.step_idx, r.outcome_reward) for r in rs)
      for rs in refits
  ]


@pytest.fixture(scope="module")
def prm_baseline(template, tmp_path_factory):
  run = warm_copy(template(PRM), str(tmp_path_factory.mktemp("base_p") / "run"))
  refits = []
  train(run, PRM, refits=refits)
  summary = refit_summary(refits)
  # One loop (k = 2): one refit, on A's fresh group (2 episodes; 2 more
  # replayed) of each step: collections 4 and 5 (B: 1-2, its store: 3).
  assert len(summary) == 1
  assert {tid for tid, _, _ in summary[0]} == {
      400_000,
      400_001,
      500_000,
      500_001,
  }
  return summary


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill",
    [kill_in_save("A", 1, after=True), kill_in_save("B", 2)],
    ids=["after_step_1_saved", "in_loop_end_save"],
)
def test_prm_refit_after_a_resume_sees_the_whole_loop(
    kill, template, prm_baseline, tmp_path
):
  run = warm_copy(template(PRM), str(tmp_path / "run"))
  assert train(run, PRM, kill) is None
  refits = []
  train(run, PRM, refits=refits)
  assert refit_summary(refits) == prm_baseline
  # Cleared after the loop's checkpoint: nothing kept for the next loop.
  assert not replay.list_shards(os.path.join(run, "prm_recent"))
