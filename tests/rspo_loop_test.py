"""The RSPO loop with the micro toy config of rspo_e2e_test: what A's steps
replay (unused trajectories of D with their whole-group advantages), the
update structure (ppo_epochs passes of shuffled mini-batches, pi_old fixed
at the step's start) and B's learner's log pi_B in D.
"""

import collections
import dataclasses

import jax
import numpy as np
import pytest

from rspo_e2e_test import micro_config
from rspo_e2e_test import record_train_batches
from rspo_jax import build, replay
from rspo_jax.replay import replayed
from rspo_jax.types import POLICY_B

# Whole RSPO loops on the toy task: CI's slow stage (`pytest -m slow`).
pytestmark = pytest.mark.slow


def spy_updates(t):
  """Records (on, off, off_adv) of every ``t.update`` call."""
  calls, update = [], t.update

  def spy(learner, critic, on, off, source, step_key, **kw):
    calls.append((on, off, kw.get("off_adv")))
    return update(learner, critic, on, off, source, step_key, **kw)

  t.update = spy
  return calls


def spy_metrics(t):
  rows, write = [], t.metrics.write

  def spy(step, phase, m):
    rows.append((phase, dict(m)))
    return write(step, phase, m)

  t.metrics.write = spy
  return rows


def make_one_win(t):
  """Rewrites D so that its first trajectory is its only win (+10 on its
  last step): a group of 2 with one win."""
  trajs = t.buffer.trajectories()
  for k, traj in enumerate(trajs):
    bonus = (10.0 if k == 0 else 0.0) - (10.0 if traj.steps[-1].won else 0.0)
    for s in traj.steps:
      s.won, s.outcome_reward = k == 0, s.outcome_reward + bonus
    traj.steps[-1].env_reward += bonus
  t.buffer.clear()
  t.buffer.add_trajectories(trajs)
  replay.mark_complete(t.buffer.directory)
  return trajs[0].steps[0].traj_id


def test_a_steps_replay_unused_trajectories_with_group_advantages(tmp_path):
  """alpha = 1/2 of 2 groups x 2: each A step plays 1 fresh group and
  replays 2 of D's 4 trajectories: the win first (reward-based), the
  other 2 in the second step; each carries its advantage against its
  whole group of D."""
  # One update per step: the step's batch holds its rows in order.
  cfg = micro_config(
      "grpo",
      "rspo.k=2,steps=2,train.updates_per_step=1," "rspo.replay_reuse=pass",
  )
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  seen = record_train_batches(t.a)
  try:
    t.b_phase()
    winner = make_one_win(t)
    d = t.buffer.trajectories()
    want = replayed.advantages_in_buffer(
        d, cfg.algo, invalid_action_penalty=cfg.algo.invalid_action_penalty
    )
    assert (want[winner] > 0).all()  # beside a failure in its group
    t.state.phase = "A"
    calls = spy_updates(t)
    drawn = []
    for step in range(2):
      m = t.a_step()
      t.state.a_steps += 1
      on, off, off_adv = calls[-1]
      assert len({r.group_id for r in on}) == 1
      ids = sorted({r.traj_id for r in off})
      assert len(ids) == 2
      drawn.append(ids)
      assert t.state.replay_used == sorted(sum(drawn, []))
      np.testing.assert_allclose(
          off_adv,
          np.concatenate(
              [want[i] for i in dict.fromkeys(r.traj_id for r in off)]
          ),
      )
      # A's batch: fresh rows then replayed rows, one update.
      batch = seen[-1]
      mask = np.asarray(batch.loss_mask) > 0
      off_rows = np.flatnonzero(np.asarray(batch.is_offpolicy))
      assert len(off_rows) == len(off) == m["rows_off"]
      for row, a in zip(off_rows, off_adv):
        np.testing.assert_allclose(
            np.asarray(batch.advantages)[row][mask[row]], a, rtol=1e-6
        )
      tokens = np.array([len(r.response_ids) for r in off])
      assert m["replay_nonzero_adv_frac"] == pytest.approx(
          tokens[off_adv != 0].sum() / tokens.sum()
      )
      assert m["replay_adv_mean"] == pytest.approx(
          (tokens * off_adv).sum() / tokens.sum(), rel=1e-5
      )
      assert m["replay_success_frac"] == np.mean(
          [any(r.won for r in off if r.traj_id == i) for i in ids]
      )
    assert winner in drawn[0]  # successful trajectories first
    assert sorted(sum(drawn, [])) == sorted(
        t_.steps[0].traj_id for t_ in d
    )  # then the unused ones
    t.end_loop()
    assert t.state.replay_used == []
  finally:
    run.close()


def test_ppo_epochs_repeat_mini_batches_with_pi_old_of_the_step_start(tmp_path):
  """train.ppo_epochs = 2, mini_batch_rows = 4: 2 x ceil(n / 4) updates;
  each epoch trains every row once, in the same mini-batches; every
  update's pi_old is the step-start policy's; the metrics are the updates'
  means plus the last update's clip fractions."""
  cfg = micro_config("grpo", "train.mini_batch_rows=4")
  with cfg.unlocked():
    cfg.train.ppo_epochs = 2
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  seen, per_update, train = [], [], t.a.train

  def spy(batch, rng):
    seen.append(batch)
    per_update.append(train(batch, rng))
    return per_update[-1]

  t.a.train = spy
  try:
    t.b_phase()
    t.state.phase = "A"
    before = jax.tree.map(np.array, jax.device_get(t.a.params))
    m = t.a_step()
    n_rows = int(m["rows_on"] + m["rows_off"])
    per_epoch = -(-n_rows // 4)
    assert per_epoch >= 2 and m["epochs"] == 2
    assert len(seen) == m["updates"] == 2 * per_epoch
    epochs = [seen[:per_epoch], seen[per_epoch:]]
    sizes = [len(c) for c in np.array_split(np.arange(n_rows), per_epoch)]

    def rows_of(batches):
      out = []
      for b in batches:
        for row, n in zip(
            np.asarray(b.tokens), np.asarray(b.attention_mask).sum(1)
        ):
          if n:
            out.append(row[:n].tobytes())
      return out

    for ep in epochs:
      real = [int((np.asarray(b.attention_mask).sum(1) > 0).sum()) for b in ep]
      assert real == sizes
    assert collections.Counter(rows_of(epochs[0])) == collections.Counter(
        rows_of(epochs[1])
    )  # every row once per epoch
    assert [set(rows_of([b])) for b in epochs[0]] == [
        set(rows_of([b])) for b in epochs[1]
    ]  # verl: same mini-batches
    for batch in seen:  # pi_old: the params before the first update
      mask = np.asarray(batch.loss_mask) > 0
      want = t.batches.apply(t.a, batch, params=before)
      np.testing.assert_allclose(
          np.asarray(batch.old_logp)[mask], want[mask], atol=1e-5
      )
    assert m["loss"] == pytest.approx(
        np.mean([u["loss"] for u in per_update]), rel=1e-6
    )
    clip_keys = [k for k in per_update[-1] if k.startswith("clip_frac")]
    assert clip_keys
    for k in clip_keys:
      assert m[f"last_{k}"] == per_update[-1][k]
  finally:
    run.close()


def _noisy_b_collections(t, sigma):
  """B's engine log-probs + N(0, sigma^2) noise, in every B collection."""
  collect, noise = t.collect_groups, []

  def spy(learner, n_groups, tag, *args, **kw):
    records, stats = collect(learner, n_groups, tag, *args, **kw)
    if tag == POLICY_B:
      rng = np.random.default_rng(len(noise))
      for r in records:
        e = rng.normal(0.0, sigma, len(r.behavior_logp)).astype(np.float32)
        r.behavior_logp = r.behavior_logp + e
        noise.append(np.abs(e).max() if len(e) else 0.0)
    return records, stats

  t.collect_groups = spy
  return noise


def _capture_b(t):
  copies, copy = [], t.a.copy

  def spy(**kw):
    copies.append(copy(**kw))
    return copies[-1]

  t.a.copy = spy
  return copies


def _learner_logp(t, learner, records):
  batch = t.batches.build(
      records, np.zeros(len(records)), np.zeros(len(records), bool)
  )
  logp = t.batches.apply(learner, batch)
  return [
      logp[i][np.asarray(batch.loss_mask[i]) > 0] for i in range(len(records))
  ]


@pytest.mark.parametrize("recompute", [True, False])
def test_b_learner_log_probs_replace_noisy_engine_ones(recompute, tmp_path):
  """Noise on the engine's log-probs of B's tokens: with
  rspo.recompute_behavior_logp D holds B's learner's log-probs (so
  c = pi_old / pi_B carries no noise) and behavior_logp_max_gap reports
  the noise; without it D holds the noisy engine values."""
  cfg = micro_config("grpo")
  with cfg.unlocked():
    cfg.rspo.recompute_behavior_logp = recompute
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  noise = _noisy_b_collections(t, sigma=0.5)
  copies, rows = _capture_b(t), spy_metrics(t)
  seen = record_train_batches(t.a)
  try:
    t.b_phase()
    (b,) = copies
    stored = [r for r in t.buffer.records() if len(r.response_ids)]
    learner = _learner_logp(t, b, stored)
    gaps = [np.abs(r.behavior_logp - l).max() for r, l in zip(stored, learner)]
    (collect_row,) = [m for p, m in rows if p == "B_collect"]
    if recompute:
      assert max(gaps) < 1e-5
      # Engine vs learner in float32 on CPU: ~1e-6; the rest is the noise
      # of the stored collection (the last len(stored) draws).
      assert collect_row["behavior_logp_max_gap"] == pytest.approx(
          max(noise[-t.buffer.stats()["num_steps"] :]), abs=1e-3
      )
      assert collect_row["behavior_logp_max_gap"] > 0.5
    else:
      assert min(gaps) > 0 and max(gaps) > 0.5
      assert "behavior_logp_max_gap" not in collect_row
    t.state.phase = "A"
    n_seen = len(seen)
    m = t.a_step()
    by_row = {
        (tuple(r.prompt_ids), tuple(r.response_ids)): l
        for r, l in zip(stored, learner)
    }
    n_off = 0
    for batch in seen[n_seen:]:  # every update of A's step
      off = np.flatnonzero(np.asarray(batch.is_offpolicy))
      mask = np.asarray(batch.loss_mask) > 0
      beh = np.asarray(batch.behavior_logp)
      tokens = np.asarray(batch.tokens)
      for row in off:  # A's behaviour log-probs for replayed rows: pi_B's
        n = int(np.asarray(batch.attention_mask)[row].sum())
        resp = tokens[row][mask[row]]
        prompt = tokens[row][: n - len(resp)]
        want = by_row[(tuple(prompt), tuple(resp))]
        got = beh[row][mask[row]]
        if recompute:
          np.testing.assert_allclose(got, want, atol=1e-5)
        else:
          assert np.abs(got - want).max() > 1e-3
        n_off += 1
    assert n_off == m["rows_off"] > 0
  finally:
    run.close()


def test_rspo_h_replays_a_own_previous_loop_with_learner_log_probs(tmp_path):
  """RSPO_H (data_source=history), 2 loops of k = 1: loop 1 replays
  nothing (D empty: all 2 groups fresh); loop 2 replays 2 of A's loop-1
  trajectories, whose behaviour log-probs are A's learner's at the time
  A collected them."""
  cfg = micro_config("grpo", "rspo.data_source=history")
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  calls, update, learner_logp = [], t.update, {}

  def spy(learner, critic, on, off, source, step_key, **kw):
    calls.append((on, off))
    if learner is t.a:  # A's params are still those that collected ``on``
      for r, l in zip(on, _learner_logp(t, t.a, on)):
        learner_logp[(r.traj_id, r.step_idx)] = l
    return update(learner, critic, on, off, source, step_key, **kw)

  t.update = spy
  try:
    t.run()
    (on1, off1), (on2, off2) = calls
    assert not off1 and len({r.group_id for r in on1}) == 2
    assert len({r.group_id for r in on2}) == 1
    assert len({r.traj_id for r in off2}) == 2
    assert {r.traj_id for r in off2} <= {r.traj_id for r in on1}
    for r in off2:
      np.testing.assert_allclose(
          r.behavior_logp, learner_logp[(r.traj_id, r.step_idx)], atol=1e-5
      )
  finally:
    run.close()


def test_ppo_with_one_episode_per_task(tmp_path):
  """PPO as the paper runs it: distinct tasks x 1 episode (group_size 1).
  alpha = 1/2 of 4 x 1: each A step plays 2 fresh tasks and replays 2
  trajectories of D, credited by GAE with A's critic at the step."""
  cfg = micro_config("ppo", "train.batch_tasks=4")
  with cfg.unlocked():  # micro_config validates as GRPO (group_size >= 2)
    cfg.train.group_size = 1
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  calls, rows = spy_updates(t), spy_metrics(t)
  try:
    t.run()
    a_calls = calls[1::2]  # k = 1: B's step, then A's, each loop
    assert len(a_calls) == 2
    for on, off, off_adv in a_calls:
      assert len({r.traj_id for r in on}) == 2 and off_adv is None
      assert len({r.traj_id for r in off}) == 2
    a_rows = [m for p, m in rows if p == "A"]
    assert [m["replay_trajectories"] for m in a_rows] == [2, 2]
    assert all(m["rows_off"] > 0 and "critic_loss" in m for m in a_rows)
  finally:
    run.close()


def _success_and_dense(records):
  won, dense = collections.defaultdict(bool), collections.defaultdict(float)
  for r in records:
    won[r.traj_id] |= bool(r.won)
    dense[r.traj_id] += r.dense_reward
  return np.mean(list(won.values())), np.mean(list(dense.values()))


@pytest.mark.parametrize("lift_tasks", ["first", "fresh"])
def test_b_lift_is_logged_on_the_tasks_of_b_first_collection(
    lift_tasks, tmp_path
):
  """B's phase: its rows count B's steps (b_step 1..k, one loop); the
  stored collection plays the tasks and sampling seeds of B's first
  training collection (rspo.b_lift_tasks='first') and B_collect logs
  b_lift_* = stored - first of the success rate and the dense return per
  trajectory, computed here from the records themselves. A's step then
  logs log pi_B - log pi_old of the replayed tokens, by hand from its
  batch."""
  cfg = micro_config(
      "grpo", f"rspo.b_lift_tasks={lift_tasks}," "train.updates_per_step=1"
  )
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  rows, collected = spy_metrics(t), []
  collect = t.collect_groups

  def spy(learner, n, tag, *a, **kw):
    records, stats = collect(learner, n, tag, *a, **kw)
    if tag == POLICY_B:
      collected.append(
          (stats["task_ids"], [dataclasses.replace(r) for r in records])
      )
    return records, stats

  t.collect_groups = spy
  seen = record_train_batches(t.a)
  try:
    t.b_phase()
    b_rows = [m for p, m in rows if p == "B"]
    assert [m["b_step"] for m in b_rows] == list(range(1, t.k + 1))
    (first_ids, first), *_, (stored_ids, stored) = collected
    assert len(collected) == t.k + 1
    (row,) = [m for p, m in rows if p == "B_collect"]
    assert row["rollout_task_ids"] == stored_ids
    if lift_tasks == "first":
      assert stored_ids == first_ids
    s0, d0 = _success_and_dense(first)
    s1, d1 = _success_and_dense(stored)
    assert row["b_first_success"] == pytest.approx(s0)
    assert row["b_lift_success"] == pytest.approx(s1 - s0)
    assert row["b_lift_dense_return"] == pytest.approx(d1 - d0)
    if lift_tasks == "first":  # won episodes per task, in the tasks' order
      for key, records in (
          ("b_first_wins_by_task", first),
          ("b_stored_wins_by_task", stored),
      ):
        won = collections.defaultdict(bool)
        for r in records:
          won[r.task_id, r.traj_id] |= bool(r.won)
        assert row[key] == [
            sum(w for (task, _), w in won.items() if task == i)
            for i in first_ids
        ]
      assert sum(row["b_stored_wins_by_task"]) - sum(
          row["b_first_wins_by_task"]
      ) == pytest.approx(
          row["b_lift_success"] * len(first_ids) * cfg.train.group_size
      )
    else:
      assert "b_first_wins_by_task" not in row
    t.state.phase = "A"
    m = t.a_step()
    (batch,) = seen[-1:]
    off = np.asarray(batch.is_offpolicy, bool)
    mask = (np.asarray(batch.loss_mask) > 0) & off[:, None]
    gap = np.asarray(batch.behavior_logp) - np.asarray(batch.old_logp)
    assert m["replay_logp_b_minus_old"] == pytest.approx(
        gap[mask].mean(), rel=1e-5
    )
    assert m["replay_log_c_big_frac"] == pytest.approx(
        (np.abs(gap[mask]) > 0.2).mean()
    )
  finally:
    run.close()


def test_b_own_learning_rate_moves_each_weight_by_it_first(tmp_path):
  """rspo.b_lr: B := A with a fresh AdamW at B's learning rate. Adam's
  first update is lr * g / (|g| + eps) per weight: no weight of B moves
  by more than b_lr, and the largest moves by about b_lr; the steps B's
  optimizer compiles are kept for the next loop's B."""
  cfg = micro_config(
      "grpo",
      "rspo.b_lr=0.003,rspo.k=1,"
      "train.updates_per_step=1,train.weight_decay=0.0",
  )
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  try:
    b = t.make_b()
    assert b.tx is not t.a.tx
    before = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(b.params))]
    on, _ = t.collect_groups(b, 2, POLICY_B)
    t.update(b, None, on, [], "dense", step_key=1)
    after = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(b.params))]
    move = max(np.abs(x - y).max() for x, y in zip(before, after))
    assert move == pytest.approx(0.003, rel=0.01)
    assert t._b_steps and t.make_b()._steps is t._b_steps
    assert t.a._steps is not t._b_steps
  finally:
    run.close()


def test_b_warmup_gives_b_a_schedule_state_of_its_own(tmp_path):
  """rspo.b_warmup_steps: B's AdamW warms up from 0, so its optimizer
  state has a schedule count A's lacks; B := A builds it with its own
  shardings and B's first update (lr 0 at count 0) leaves B unchanged.
  With rspo.copy_optimizer_state the shapes differ: one clear error."""
  cfg = micro_config(
      "grpo", "rspo.b_warmup_steps=4,rspo.k=1," "train.updates_per_step=1"
  )
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  try:
    b = t.make_b()
    before = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(b.params))]
    on, _ = t.collect_groups(b, 2, POLICY_B)
    t.update(b, None, on, [], "dense", step_key=1)
    after = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(b.params))]
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    with t.cfg.unlocked():
      t.cfg.rspo.copy_optimizer_state = True
    with pytest.raises(ValueError, match="b_warmup_steps"):
      t.make_b()
  finally:
    run.close()


@pytest.mark.parametrize("b_wins", [False, True])
def test_adaptive_b_trains_until_it_wins_enough_or_b_k_max(b_wins, tmp_path):
  """rspo.b_k_max > k: B takes its k steps, then goes on while its newest
  training collection's win rate is below the target. Here every B
  episode is made a loss (never reached: B trains b_k_max steps) or,
  after B's first collection, a win (reached at once: k steps, and the
  collection that showed it is not trained on). B_stop logs the count."""
  k, k_max = 2, 4
  cfg = micro_config(
      "grpo",
      f"rspo.k={k},rspo.b_k_max={k_max},rspo.b_win_multiple=3,"
      "train.updates_per_step=1",
  )
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  rows, calls = spy_metrics(t), spy_updates(t)
  collect, played = t.collect_groups, []

  def rigged(learner, n, tag, *a, **kw):
    records, stats = collect(learner, n, tag, *a, **kw)
    won = b_wins and bool(played)  # B's first collection (B = A): lost
    for r in records:
      r.won = won
    played.append(len(records))
    return records, stats

  t.collect_groups = rigged
  try:
    t.b_phase()
    (stop,) = [m for p, m in rows if p == "B_stop"]
    n = cfg.train.batch_tasks * cfg.train.group_size
    odds = 3 * (1 / n) / (1 - 1 / n)  # A's rate 0, floored at one win
    assert stop["b_win_target"] == pytest.approx(odds / (1 + odds))
    steps = k if b_wins else k_max
    assert stop["b_steps"] == steps
    assert stop["b_target_reached"] == b_wins
    assert len(calls) == steps  # B's updates
    b_rows = [m for p, m in rows if p == "B"]
    assert [m["b_step"] for m in b_rows] == list(range(1, steps + 1))
    # training collections (one more, unused, when reached) + the stored
    assert len(played) == steps + b_wins + 1
  finally:
    run.close()
