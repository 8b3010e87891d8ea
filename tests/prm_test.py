"""Tests for rspo_jax.prm: features, head training, save/load, dense rewards.

Synthetic task, no tokenizer: every step's reply is one action token, ids
4..13 "good" and 14..23 "bad", after a random prompt of ids 30..63; an
episode has 4 steps and outcome R = 2.5 * (number of good steps), so R is
additive over steps and a per-step head can rank episodes exactly. The
action is the row's last token: in a random (untrained) backbone the last
token's own identity dominates its hidden state, whereas a trailing EOS would
leave only an attention-diluted trace of the action to read.
"""

import dataclasses
import json
import os
import stat
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rspo_jax import models, prm, replay
from rspo_jax import sharding as shd
from rspo_jax.types import StepRecord, group_trajectories

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD, BAD = np.arange(4, 14), np.arange(14, 24)
STEPS_PER_EP = 4


_hidden = nnx.jit(lambda m, t, p, a: m(t, p, a, return_logits=False)[1])


def _cfg():
  return models.get_model_config(
      "tiny",
      num_layers=2,
      vocab_size=64,
      hidden_size=32,
      intermediate_size=64,
      num_heads=4,
      num_kv_heads=2,
      head_dim=8,
  )


def make_records(n_traj: int, seed: int, traj_start: int = 0):
  rng = np.random.default_rng(seed)
  records = []
  for n in range(n_traj):
    good = rng.random(STEPS_PER_EP) < 0.5
    outcome = 2.5 * good.sum()
    for t in range(STEPS_PER_EP):
      prompt = rng.integers(30, 64, size=int(rng.integers(5, 13)))
      action = rng.choice(GOOD if good[t] else BAD)
      records.append(
          StepRecord(
              task_id=n % 7,
              group_id=n // 4,
              traj_id=traj_start + n,
              step_idx=t,
              prompt_ids=prompt.astype(np.int32),
              response_ids=np.array([action], np.int32),
              behavior_logp=np.array([-0.5], np.float32),
              env_reward=outcome if t == STEPS_PER_EP - 1 else 0.0,
              outcome_reward=outcome,
              won=bool(good.all()),
              done=t == STEPS_PER_EP - 1,
          )
      )
  return records


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("prm") / "backbone")
  cfg = _cfg()
  models.save_hf_model(models.create_model(cfg, seed=1), cfg, path)
  return path


@pytest.fixture(scope="module")
def trained(backbone_dir):
  """(scorer, records, metrics) of a head trained on 96 episodes."""
  records = make_records(96, seed=0)
  _, backbone = models.load_hf_model(backbone_dir)
  feats = prm.extract_step_features(
      backbone, records, batch_rows=64, length_multiple=16
  )
  head, metrics = prm.train_prm_head(
      feats,
      records,
      hidden=32,
      steps=300,
      lr=3e-3,
      seed=0,
      holdout_frac=0.25,
      batch_trajs=32,
  )
  scorer = prm.PRMScorer(
      backbone,
      head,
      backbone_dir=backbone_dir,
      head_hidden=32,
      reward_scale=0.1,
      metrics=metrics,
  )
  return scorer, records, feats, metrics


# ------------------------------------------------------------------ ranks


def test_rankdata_and_spearman_hand_values():
  np.testing.assert_array_equal(
      prm.rankdata([3, 1, 3, 2]), [3.5, 1.0, 3.5, 2.0]
  )
  assert prm.spearman([1, 2, 3, 4], [10, 20, 30, 400]) == pytest.approx(1.0)
  assert prm.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
  # Ranks x = [1,2,3,4], y = [1.5,1.5,3.5,3.5]: r = 4 / sqrt(5 * 4).
  assert prm.spearman([1, 2, 3, 4], [0, 0, 1, 1]) == pytest.approx(
      4 / np.sqrt(20)
  )
  assert np.isnan(prm.spearman([1, 2, 3], [5, 5, 5]))


# ---------------------------------------------------------------- quality


def test_r_squared_auc_prefix_hand_values():
  # y = (1, 0, 0), mean 1/3: SS_tot = 4/9 + 1/9 + 1/9 = 2/3, SS_res = 1/4.
  assert prm.r_squared([1, 0, 0.5], [1, 0, 0]) == pytest.approx(
      1 - 0.25 / (2 / 3)
  )
  assert np.isnan(prm.r_squared([1, 2], [3, 3]))
  # Pairs (win, loss): 0.9>0.4, 0.9>0.1, 0.4=0.4 (half), 0.4>0.1: 3.5 / 4.
  assert prm.auc([0.9, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == pytest.approx(0.875)
  assert prm.auc([0.1, 0.9], [1, 0]) == 0.0
  assert np.isnan(prm.auc([1, 2], [0, 0]))
  np.testing.assert_array_equal(
      prm.prefix_sums([np.array([1.0, 2, 3]), np.array([4.0])], 2), [3, 4]
  )
  assert prm.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)


def test_quality_tiny_hand_example():
  """Three trajectories, the first won. PRM sums (0.9, 0.1, 0.2): R^2 =
  1 - (0.01 + 0.01 + 0.04) / (2/3) = 0.91; oracle sums (1, 0, 0.3):
  1 - 0.09 / (2/3) = 0.865. First-step prefixes (0.2, 0.1, 0.3): the win
  beats one loss of two, AUC 0.5; from t = 2 on it beats both."""
  r_hat = [np.array([0.2, 0.7]), np.array([0.1]), np.array([0.3, -0.4, 0.3])]
  oracle = [np.array([0.2, 0.8]), np.array([0.0]), np.array([0.1, 0.0, 0.2])]
  q = prm.quality(r_hat, oracle, [True, False, False], max_t=4)
  assert (q["num_traj"], q["num_wins"], q["num_steps"]) == (3, 1, 6)
  assert q["r2_traj"] == pytest.approx(0.91)
  assert q["oracle_r2_traj"] == pytest.approx(0.865)
  assert q["mse_traj"] == pytest.approx(0.06 / 3)
  assert q["auc_prefix"] == {1: 0.5, 2: 1.0, 3: 1.0, 4: 1.0}
  assert q["oracle_auc_prefix"] == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
  # |r_hat - d|: 0, .1 | .1 | .2, .4, .1 -> 0.9 / 6.
  assert q["step_mae"] == pytest.approx(0.15)
  s1, s2, s3 = (q["per_step"][t] for t in (1, 2, 3))
  # Step 1: p = (.2, .1, .3), d = (.2, 0, .1); centred (0, -.1, .1) and
  # (.1, -.1, 0): r = .01 / sqrt(.02 * .02) = 0.5.
  assert s1["n"] == 3 and s1["mae"] == pytest.approx(0.1)
  assert s1["pearson"] == pytest.approx(0.5)
  assert s1["prm_mean"] == pytest.approx(0.2)
  assert s1["oracle_mean"] == pytest.approx(0.1)
  assert s2["n"] == 2 and s2["mae"] == pytest.approx(0.25)
  assert s3["n"] == 1 and s3["pearson"] is None  # one point: undefined
  assert 4 not in q["per_step"]
  with pytest.raises(ValueError, match="trajectory 1 has 1 PRM and 2"):
    prm.quality(r_hat, [oracle[0], oracle[0], oracle[2]], [1, 0, 0])


# --------------------------------------------------------------- features


def test_features_are_last_token_hidden_states(backbone_dir):
  _, backbone = models.load_hf_model(backbone_dir)
  records = make_records(3, seed=5)[:7]
  feats = prm.extract_step_features(
      backbone, records, batch_rows=4, length_multiple=8
  )
  assert feats.shape == (7, 32) and feats.dtype == np.float32
  for k in (0, 6):  # one unpadded row, straight through the model
    r = records[k]
    row = jnp.asarray(np.concatenate([r.prompt_ids, r.response_ids])[None])
    h = _hidden(
        backbone, row, jnp.arange(row.shape[1])[None], jnp.ones_like(row)
    )
    np.testing.assert_allclose(feats[k], np.asarray(h)[0, -1], atol=1e-5)
  # Padding, chunking and order do not change a row's features.
  again = prm.extract_step_features(
      backbone, records[::-1], batch_rows=3, length_multiple=64
  )
  np.testing.assert_allclose(again[::-1], feats, atol=1e-5)


def test_features_on_a_mesh_match(backbone_dir):
  mesh = shd.make_mesh((2, 2, 1))
  _, sharded = models.load_hf_model(backbone_dir, mesh=mesh)
  _, plain = models.load_hf_model(backbone_dir)
  records = make_records(2, seed=9)
  a = prm.extract_step_features(
      sharded, records, batch_rows=3, mesh=mesh, length_multiple=16
  )
  b = prm.extract_step_features(
      plain, records, batch_rows=3, length_multiple=16
  )
  np.testing.assert_allclose(a, b, atol=1e-5)


def test_token_ids_beyond_vocab_raise(backbone_dir):
  _, backbone = models.load_hf_model(backbone_dir)
  r = make_records(1, seed=0)[0]
  r.response_ids = np.array([64], np.int32)
  with pytest.raises(ValueError, match="policy_tokenizer_dir"):
    prm.extract_step_features(backbone, [r])


# ---------------------------------------------------------------- training


def test_head_ranks_heldout_episodes(trained):
  _, _, _, m = trained
  assert m["num_train_traj"] == 72 and m["num_heldout_traj"] == 24
  assert m["heldout_spearman"] > 0.8, m
  assert m["train_spearman"] > 0.8, m
  assert m["loss_last"] < 0.25 * m["loss_first"], m
  # Targets are 0.1 * R in {0, .25, .5, .75, 1}: a good fit is well under
  # the variance of the targets (0.0625 * 4 steps * 0.25 = 0.0625).
  assert m["heldout_mse"] < 0.03, m


def test_fresh_episodes_are_ranked_and_scored_per_step(trained):
  scorer, _, _, _ = trained
  fresh = make_records(24, seed=77, traj_start=1000)
  r_hat = scorer.score(fresh)
  assert r_hat.shape == (len(fresh),)
  assert np.all(np.abs(r_hat) < 1.0)
  trajs = group_trajectories(fresh)
  pos = {id(r): i for i, r in enumerate(fresh)}
  r_traj = [sum(r_hat[pos[id(s)]] for s in t.steps) for t in trajs]
  assert prm.spearman(r_traj, [t.outcome_reward for t in trajs]) > 0.8
  # Per step: good actions score above bad ones.
  good = np.array([r.response_ids[0] in GOOD for r in fresh])
  assert r_hat[good].mean() > r_hat[~good].mean() + 0.1


def test_folded_head_equals_standardized_head():
  rng = np.random.default_rng(0)
  h = rng.normal(2.0, 3.0, size=(5, 6)).astype(np.float32)
  mu, sd = h.mean(0), h.std(0) + 0.5
  head = prm.make_head(6, 4, seed=3)
  want = np.asarray(head(jnp.asarray((h - mu) / sd)))
  folded = prm._fold_standardization(nnx.state(head), mu, sd)
  got = prm.score_features(folded, h, 6, 4)
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_training_is_deterministic(trained):
  _, records, feats, m = trained
  sub = records[:64]
  a, ma = prm.train_prm_head(feats[:64], sub, hidden=8, steps=20, seed=4)
  b, mb = prm.train_prm_head(feats[:64], sub, hidden=8, steps=20, seed=4)
  ta, tb = prm.head_tensors(a), prm.head_tensors(b)
  for k in ta:
    np.testing.assert_array_equal(ta[k], tb[k])
  assert ma == mb


def test_bad_training_inputs_raise(trained):
  _, records, feats, _ = trained
  with pytest.raises(ValueError, match="features shape"):
    prm.train_prm_head(feats[:5], records)
  with pytest.raises(ValueError, match="holdout_frac"):
    prm.train_prm_head(feats, records, holdout_frac=1.0)


# ------------------------------------------------------- save, load, dense


def test_save_load_gives_identical_scores(trained, tmp_path):
  scorer, records, _, _ = trained
  old = os.umask(0o022)
  try:
    scorer.save(str(tmp_path))
  finally:
    os.umask(old)
  # Both files readable as open() makes them (the head was 0o600).
  for name in (prm.HEAD_FILE, prm.CONFIG_FILE):
    assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o644, name
  with open(tmp_path / prm.CONFIG_FILE) as f:
    cfg = json.load(f)
  assert cfg["hidden_size"] == 32 and cfg["head_hidden"] == 32
  assert cfg["reward_scale"] == 0.1
  assert cfg["backbone_dir"] == os.path.abspath(scorer.backbone_dir)
  loaded = prm.PRMScorer.load(str(tmp_path))
  np.testing.assert_array_equal(loaded.score(records), scorer.score(records))


def test_save_killed_mid_write_keeps_the_previous_head(
    trained, tmp_path, monkeypatch
):
  """A PRM refresh killed while writing the head leaves the saved head
  loadable (the write goes to a temporary that is renamed when whole);
  writing in place left a torn file no resumed run could load."""
  scorer, records, _, _ = trained
  scorer.save(str(tmp_path))
  want = scorer.score(records)

  def torn_write(tensors, path, metadata=None):
    with open(path, "wb") as f:
      f.write(b"\x00" * 7)  # the first bytes, then the kill
    raise KeyboardInterrupt("killed mid-write")

  monkeypatch.setattr(prm, "save_safetensors", torn_write)
  with pytest.raises(KeyboardInterrupt):
    scorer.save(str(tmp_path))
  monkeypatch.undo()
  loaded = prm.PRMScorer.load(str(tmp_path))
  np.testing.assert_array_equal(loaded.score(records), want)


def test_load_errors(tmp_path):
  with pytest.raises(ValueError, match="no PRM"):
    prm.PRMScorer.load(str(tmp_path))


def test_dense_fn_fills_dense_reward_only(trained, tmp_path):
  scorer, _, _, _ = trained
  scorer.save(str(tmp_path))
  mesh = shd.make_mesh((-1, 1, 1))
  fn = prm.make_prm_dense_fn(str(tmp_path), mesh=mesh, rules=shd.DEFAULT_RULES)
  records = make_records(5, seed=11)
  before = [dataclasses.replace(r) for r in records]
  values = fn(records)
  want = scorer.score(records) / 0.1
  assert fn.tanh_unit == pytest.approx(10.0)  # r_hat / 0.1: 1 tanh = 10
  np.testing.assert_allclose(values, want, atol=1e-5)
  for r, b in zip(records, before):
    assert r.dense_reward == pytest.approx(
        float(want[records.index(r)]), abs=1e-5
    )
    assert r.outcome_reward == b.outcome_reward
    assert r.env_reward == b.env_reward
    np.testing.assert_array_equal(r.prompt_ids, b.prompt_ids)
    np.testing.assert_array_equal(r.response_ids, b.response_ids)
  raw = prm.make_prm_dense_fn(
      str(tmp_path), mesh=mesh, rules=shd.DEFAULT_RULES, units="raw"
  )
  raw(records)
  np.testing.assert_allclose(
      [r.dense_reward for r in records], want * 0.1, atol=1e-5
  )
  assert raw.tanh_unit == 1.0
  with pytest.raises(ValueError, match="units"):
    prm.make_prm_dense_fn(str(tmp_path), mesh=mesh, rules=(), units="x")


# -------------------------------------------------------- data and driver


def test_jsonl_and_replay_shards_load_the_same(tmp_path):
  records = make_records(4, seed=2)
  records[-1].failed = True  # its whole episode is dropped
  path = tmp_path / "traj.jsonl"
  with open(path, "w") as f:
    for r in records:
      f.write(json.dumps(prm.record_to_json(r)) + "\n")
  buf = replay.ReplayBuffer(str(tmp_path / "shards"))
  buf.add_trajectories(group_trajectories(records))
  for got in (
      prm.load_trajectory_records(str(path)),
      prm.load_trajectory_records(str(tmp_path / "shards")),
  ):
    assert len(got) == 12
    got = sorted(got, key=lambda r: (r.traj_id, r.step_idx))
    for r, w in zip(got, records[:12]):
      assert (r.traj_id, r.step_idx, r.outcome_reward) == (
          w.traj_id,
          w.step_idx,
          w.outcome_reward,
      )
      np.testing.assert_array_equal(r.prompt_ids, w.prompt_ids)
  with pytest.raises(ValueError, match="does not exist"):
    prm.load_trajectory_records(str(tmp_path / "nope"))


def test_retokenize_preserves_text(tmp_path):
  texts = ["search[red shoes] click[buy now] <think>ok</think>"] * 20
  a = models.train_tokenizer(texts, 300, str(tmp_path / "a"))
  b = models.train_tokenizer(texts + ["zzz qqq"] * 50, 320, str(tmp_path / "b"))
  text = "<|im_start|>user\nsearch[red shoes]<|im_end|>"
  r = StepRecord(
      task_id=0,
      group_id=0,
      traj_id=0,
      step_idx=0,
      prompt_ids=np.array(a.encode(text), np.int32),
      response_ids=np.array(a.encode("click[buy now]"), np.int32),
      behavior_logp=np.zeros(0, np.float32),
  )
  (out,) = prm.retokenize([r], a, b)
  assert b.decode(list(out.prompt_ids), skip_special_tokens=False) == text
  assert b.decode(list(out.response_ids)) == "click[buy now]"
  assert len(out.behavior_logp) == len(out.response_ids)


def test_train_prm_driver_saves_a_loadable_prm(backbone_dir, tmp_path):
  records = make_records(16, seed=3)
  metrics = prm.train_prm(
      backbone_dir,
      records,
      str(tmp_path / "out"),
      hidden=8,
      steps=30,
      holdout_frac=0.25,
  )
  assert metrics["num_heldout_traj"] == 4
  loaded = prm.PRMScorer.load(str(tmp_path / "out"))
  assert loaded.metrics == json.loads(json.dumps(metrics))
  assert loaded.score(records[:3]).shape == (3,)


@pytest.mark.slow
def test_cli_prints_metrics(backbone_dir, tmp_path):
  records = make_records(16, seed=4)
  buf = replay.ReplayBuffer(str(tmp_path / "shards"))
  buf.add_trajectories(group_trajectories(records))
  out = subprocess.run(
      [
          sys.executable,
          os.path.join(ROOT, "launch", "train_prm.py"),
          f"--backbone_dir={backbone_dir}",
          f"--trajectories={tmp_path / 'shards'}",
          f"--out={tmp_path / 'prm'}",
          "--steps=20",
          "--lr=1e-3",
          "--hidden=8",
      ],
      capture_output=True,
      text=True,
      check=True,
      cwd=ROOT,
      env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  metrics = json.loads(out.stdout.strip().splitlines()[-1])
  assert {"train_mse", "heldout_mse", "heldout_spearman"} <= set(metrics)
  assert os.path.exists(tmp_path / "prm" / prm.HEAD_FILE)
