"""End to end: two RSPO loops of the smallest config, for each base algorithm,
on the real toy environment in worker processes with the in-process engine.

Each phase is checked for what it must do (issue: 'The RSPO training loop').
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import toy_grpo
from rspo_jax import build, replay

# End-to-end RSPO loops and the train CLI: CI's slow stage (`pytest -m slow`).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MICRO = (
    "model.overrides=num_layers=1;hidden_size=64;intermediate_size=128;"
    "num_heads=2;num_kv_heads=1;head_dim=32,model.tokenizer_vocab=300,"
    "sft.steps=8,sft.num_episodes=16,sft.batch_rows=16,"
    "train.batch_tasks=2,train.group_size=2,rspo.alpha=0.5,rspo.k=1,"
    "steps=2,env.max_steps=4,env.num_eval_tasks=4,env.num_workers=1,"
    "rollout.max_new_tokens=16,rollout.max_prompt_tokens=256"
)


def micro_config(algo: str, extra: str = ""):
  cfg = toy_grpo.get_config(MICRO + ("," + extra if extra else ""))
  with cfg.unlocked():
    cfg.algo.name = algo
  return cfg


def params_of(learner):
  return [
      np.asarray(x) for x in jax.tree.leaves(jax.device_get(learner.params))
  ]


def record_train_batches(learner):
  """Wraps ``learner.train`` to record every batch it is given."""
  seen, train = [], learner.train

  def spy(batch, rng):
    seen.append(batch)
    return train(batch, rng)

  learner.train = spy
  return seen


def changed(a, b):
  return any(not np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("algo", ["grpo", "ppo", "gigpo"])
def test_two_rspo_loops(algo, tmp_path):
  cfg = micro_config(algo)
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  seen = record_train_batches(t.a)  # what A is trained on
  a_updates = 0
  try:
    for loop in range(2):
      a_before = params_of(t.a)
      trained_b = []
      orig_update = t.update

      def update_spy(learner, critic, on, off, source, step_key, **kw):
        if learner is not t.a:
          trained_b.append((params_of(learner), source))
        return orig_update(learner, critic, on, off, source, step_key, **kw)

      t.update = update_spy
      t.b_phase()
      t.update = orig_update
      # B's phase: B trained on the dense reward, A untouched.
      assert trained_b and all(src == "dense" for _, src in trained_b)
      assert not changed(a_before, params_of(t.a))
      assert changed(trained_b[0][0], a_before) or len(trained_b) == 1
      # The buffer holds outcome rewards only, with B's log-probs.
      stored = t.buffer.records()
      assert stored and replay.is_complete(t.buffer.directory)
      for r in stored:
        assert r.policy_tag == "B"
        assert np.isnan(r.dense_reward)
        assert r.outcome_reward == pytest.approx(
            10.0 * r.won
            + sum(-0.1 for s in stored if s.traj_id == r.traj_id and s.invalid)
        )
        assert len(r.behavior_logp) == len(r.response_ids)
      t.state.phase = "A"
      n_seen = len(seen)
      m = t.a_step()
      t.state.a_steps += 1
      step = seen[n_seen:]  # the step's updates
      assert len(step) == m["updates"] >= 1
      a_updates += len(step)
      off = np.concatenate(
          [
              np.asarray(b.is_offpolicy)[np.asarray(b.loss_mask).sum(1) > 0]
              for b in step
          ]
      )
      # Half the samples replayed: the step holds both sources.
      assert off.any() and (~off).any()
      assert m["rows_off"] == off.sum() and m["rows_on"] == (~off).sum()
      # Replayed rows are centred on pi_old / pi_B: behaviour != old there,
      # on-policy rows have behaviour == old (plain PPO).
      gaps = []
      for batch in step:
        rows_off = np.asarray(batch.is_offpolicy)[:, None]
        mask = np.asarray(batch.loss_mask) > 0
        beh = np.asarray(batch.behavior_logp)
        old = np.asarray(batch.old_logp)
        gaps += list(np.abs(beh - old)[rows_off & mask])
        np.testing.assert_array_equal(
            beh[~rows_off & mask], old[~rows_off & mask]
        )
      assert max(gaps) > 1e-4
      assert changed(a_before, params_of(t.a))
      t.end_loop()
      t.save()
      t.buffer.clear()
      assert t.buffer.num_trajectories == 0
    assert t.state.loop == 2 and t.a.step == a_updates  # optimizer steps
  finally:
    run.close()


def test_train_cli_runs_and_resumes(tmp_path):
  """launch/train.py end to end; a second start resumes and does nothing."""
  workdir = str(tmp_path / "run")
  cmd = [
      sys.executable,
      os.path.join(ROOT, "launch/train.py"),
      f"--config={ROOT}/configs/toy_grpo.py:{MICRO}",
      f"--workdir={workdir}",
      "--no_progress",
  ]
  env = dict(os.environ, XLA_FLAGS="")
  out = subprocess.run(
      cmd, capture_output=True, text=True, env=env, timeout=1200
  )
  assert out.returncode == 0, out.stderr[-3000:]
  final = json.load(open(os.path.join(workdir, "eval_final.json")))
  assert 0.0 <= final["success_rate"] <= 1.0
  rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in rows if r["phase"] == "A"] == [1, 2]
  assert any(r["phase"] == "B" for r in rows)


def test_prm_dense_reward_in_the_loop(tmp_path):
  """dense_reward=prm: a PRM is trained at start on the starting policy's
  trajectories, saved, and B's dense rewards are its scores."""
  # 5 groups of 2 = 10 episodes, more than the 4 environments: played in
  # rounds of 2 groups.
  cfg = micro_config(
      "grpo",
      "rspo.dense_reward=prm,rspo.prm_steps=20,"
      "rspo.prm_train_groups=5,rspo.prm_refresh_loops=1",
  )
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  try:
    assert t.venv.num_envs == 4
    m = json.loads((tmp_path / "prm" / "prm_config.json").read_text())
    m = m.get("metrics", m)
    assert m["num_train_traj"] + m["num_heldout_traj"] == 10
    scores = []
    orig = t.dense_fn

    def spy(records):
      scores.append(orig(records))
      return scores[-1]

    t.dense_fn = spy
    t.b_phase()
    assert scores and all(np.isfinite(s).all() for s in scores)
    # PRM units: r_hat / reward_scale with |r_hat| < 1.
    assert all(np.abs(s).max() < 10.0 for s in scores)
    t.state.phase = "A"
    t.a_step()
    before = os.path.getmtime(tmp_path / "prm" / "prm_config.json")
    t.end_loop()  # prm_refresh_loops=1: the head is refit on A's trajectories
    assert os.path.getmtime(tmp_path / "prm" / "prm_config.json") >= before
    assert t.dense_fn is not spy
  finally:
    run.close()


def test_decoupled_placement_runs_two_loops(tmp_path):
  """rollout.placement=decoupled: B's stored groups are collected in the
  background on B's own engine; A replays them; the loop ends cleanly."""
  cfg = micro_config("grpo", "rollout.placement=decoupled")
  run = build.build_run(cfg, str(tmp_path), progress=False)
  try:
    state = run.trainer.run()
    assert state.a_steps == 2 and state.loop == 2
    rows = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    a_rows = [r for r in rows if r["phase"] == "A"]
    assert len(a_rows) == 2 and all(r["rows_off"] > 0 for r in a_rows)
    # One "time" row per A step: exclusive seconds by phase add up to the
    # step's wall time; A's own episodes per second.
    times = [r for r in rows if r["phase"] == "time"]
    assert [r["step"] for r in times] == [1, 2]
    for r in times:
      phases = {
          k[:-2]
          for k in r
          if k.endswith("_s") and k != "wall_s" and not k.endswith("_per_s")
      }
      assert {
          "weight_sync",
          "generation",
          "environment",
          "prompts",
          "logprobs",
          "update",
          "checkpoint",
          "other",
      } <= phases
      assert all(r[f"{p}_s"] >= 0 for p in phases)
      assert sum(r[f"{p}_s"] for p in phases) == pytest.approx(r["wall_s"])
      assert r["generation_s"] > 0 and r["update_s"] > 0
    assert all(r["episodes_per_s"] > 0 for r in a_rows)
    assert [r["step"] for r in rows if r["phase"] == "B_time"] == [0, 1]
    for r in a_rows:  # B's learner recomputed log pi_B in B's thread
      assert 0.0 <= r["behavior_logp_max_gap"] < 0.1
      assert 0.0 <= r["replay_nonzero_adv_frac"] <= 1.0
    assert not os.listdir(tmp_path / "replay_b") or not any(
        f.endswith(".array_record") for f in os.listdir(tmp_path / "replay_b")
    )
  finally:
    run.close()


def test_mini_batches_train_every_row_once_from_the_rollout_policy(tmp_path):
  """train.mini_batch_rows: one step's rows in several optimizer updates,
  each row in exactly one, all with old log-probs of the pre-step params."""
  cfg = micro_config("grpo", "train.mini_batch_rows=4")
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  seen = record_train_batches(t.a)
  try:
    t.b_phase()
    t.state.phase = "A"
    before = jax.tree.map(np.array, jax.device_get(t.a.params))
    m = t.a_step()
    real = [np.asarray(b.loss_mask).sum(1) > 0 for b in seen]
    n_rows = int(m["rows_on"] + m["rows_off"])
    assert len(seen) == m["updates"] == -(-n_rows // 4) >= 2
    assert [int(r.sum()) for r in real] == [
        len(c) for c in np.array_split(np.arange(n_rows), len(seen))
    ]
    for batch in seen:  # old log-probs: the params before the first update
      mask = np.asarray(batch.loss_mask) > 0
      want = t.batches.apply(t.a, batch, params=before)
      np.testing.assert_allclose(
          np.asarray(batch.old_logp)[mask], want[mask], atol=1e-5
      )
    assert changed(jax.tree.leaves(before), params_of(t.a))
  finally:
    run.close()


def test_drop_zero_advantage_rows(tmp_path):
  """train.drop_zero_advantage_rows: A trains on rows with a non-zero
  advantage only; a batch of tied groups is no update at all."""
  import dataclasses  # noqa: PLC0415

  cfg = micro_config(
      "grpo",
      "train.drop_zero_advantage_rows=1,"
      "train.batch_tasks=4,train.group_size=2",
  )
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  seen = record_train_batches(t.a)
  try:
    records, _ = t.collect_groups(t.a, 4, "A")
    tied = [
        dataclasses.replace(r, env_reward=0.0, invalid=False) for r in records
    ]
    before = params_of(t.a)
    m = t.update(t.a, None, tied, [], "outcome", 1)
    assert m["skipped_no_signal"] == 1.0 and not seen
    assert m["adv_nonzero_frac_on"] == m["adv_abs_mean_on"] == 0.0
    assert not changed(before, params_of(t.a))
    # One group wins, the others tie: only the winner's group is trained.
    won_group, winner = tied[0].group_id, tied[0].traj_id
    last = max(r.step_idx for r in tied if r.traj_id == winner)
    mixed = [
        dataclasses.replace(r, env_reward=10.0)
        if r.traj_id == winner and r.step_idx == last
        else r
        for r in tied
    ]
    m = t.update(t.a, None, mixed, [], "outcome", 2)
    assert len(seen) == m["updates"]
    n_group = sum(r.group_id == won_group for r in mixed)
    real = [np.asarray(b.loss_mask).sum(1) > 0 for b in seen]
    assert sum(r.sum() for r in real) == m["rows_on"] == n_group < len(mixed)
    # The metric counts the signal before the drop: the winner's group.
    assert m["adv_nonzero_frac_on"] == pytest.approx(n_group / len(mixed))
    assert m["adv_abs_mean_on"] > 0
    for batch, rows in zip(seen, real):
      adv = np.asarray(batch.advantages)[rows]
      mask = np.asarray(batch.loss_mask)[rows] > 0
      assert (np.abs(adv[mask]) > 0).all()
  finally:
    run.close()
