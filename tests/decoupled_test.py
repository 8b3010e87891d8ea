"""Tests of rspo_jax/decoupled.py: B's collection in a background thread
writing group-by-group shards, consumed while it runs."""

import collections
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from rspo_jax import decoupled, replay
from rspo_jax.types import StepRecord

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROUP_SIZE = 2


def make_group(g: int) -> list[StepRecord]:
  """Group ``g``: trajectories ``2g, 2g + 1`` of ``1 + traj_id % 3`` steps;
  outcome reward ``10 * (g % 3)``; arrays that name their record."""
  records = []
  for j in range(GROUP_SIZE):
    tid = g * GROUP_SIZE + j
    n = 1 + tid % 3
    for t in range(n):
      records.append(
          StepRecord(
              task_id=100 + g,
              group_id=g,
              traj_id=tid,
              step_idx=t,
              prompt_ids=np.arange(3 + t, dtype=np.int32) + tid,
              response_ids=np.array([tid, t], np.int32),
              behavior_logp=np.array([-0.5, -1.0 - t], np.float32),
              policy_tag="B",
              outcome_reward=10.0 * (g % 3),
              done=t == n - 1,
          )
      )
  return records


def key(r):
  return (r.traj_id, r.step_idx)


def assert_same(a: StepRecord, b: StepRecord):
  assert (key(a), a.group_id, a.task_id, a.outcome_reward, a.done) == (
      key(b),
      b.group_id,
      b.task_id,
      b.outcome_reward,
      b.done,
  )
  for f in ("prompt_ids", "response_ids", "behavior_logp"):
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f))


# ------------------------------------------------------------ streaming


def test_consumer_starts_after_k_groups_and_reads_each_record_once(tmp_path):
  d, n_groups, k = str(tmp_path / "b"), 6, 2
  started = threading.Event()
  produced = []

  def groups():
    for g in range(n_groups):
      if g == k and not started.wait(60):
        raise RuntimeError("the consumer never started")
      produced.extend(make_group(g))
      yield make_group(g)

  job = decoupled.start_collection(groups(), d, records_per_shard=2)
  try:
    # A's phase may start now: k groups exist, B is still collecting.
    assert job.wait_for_groups(k, timeout_s=60) == k
    assert job.is_alive() and not replay.is_complete(d)
    assert [m.group_id for m in decoupled.list_groups(d)] == [0, 1]
    started.set()
    manifests, got = [], []
    for m, records in decoupled.stream_groups(
        d, timeout_s=60, alive=job.is_alive
    ):
      assert {r.group_id for r in records} == {m.group_id}
      assert sorted({r.traj_id for r in records}) == list(m.traj_ids)
      manifests.append(m)
      got += records
  finally:
    started.set()
  assert job.join(60) == manifests and replay.is_complete(d)
  assert [m.seq for m in manifests] == list(range(n_groups))
  assert [m.task_id for m in manifests] == [100 + g for g in range(n_groups)]
  counts = collections.Counter(key(r) for r in got)
  assert set(counts.values()) == {1}  # nothing read twice
  assert sorted(counts) == sorted(key(r) for r in produced)  # nothing lost
  want = {key(r): r for r in produced}
  for r in got:
    assert_same(r, want[key(r)])
  # Shards rotated inside groups (records_per_shard=2), each shard belongs
  # to exactly one group, and every closed shard is some group's.
  names = [s for m in manifests for s in m.shards]
  assert len(names) == len(set(names)) > n_groups
  assert sorted(names) == sorted(
      os.path.basename(p) for p in replay.list_shards(d)
  )


def test_only_groups_with_a_manifest_are_read_or_sampled(tmp_path):
  d = str(tmp_path / "b")
  decoupled.produce([make_group(g) for g in range(4)], d, records_per_shard=3)
  # Closed shards of a group whose manifest never came (producer killed).
  with replay.ShardWriter(d, prefix="orphan", records_per_shard=2) as w:
    for r in make_group(9):
      w.write(r)
  groups = decoupled.read_groups(d)
  assert [g[0].group_id for g in groups] == [0, 1, 2, 3]
  assert [[t.steps[0].traj_id for t in g] for g in groups] == [
      [0, 1],
      [2, 3],
      [4, 5],
      [6, 7],
  ]
  # Group rewards 0, 10, 20, 0: A's replay selection over the complete
  # groups' trajectories takes group 2's two, then one of group 1's.
  trajs = decoupled.read_trajectories(d)
  assert [t.steps[0].traj_id for t in trajs] == list(range(8))
  best = replay.selection.select(
      trajs, 3, "reward", np.random.default_rng(0)
  ).trajectories
  got = [t.steps[0].traj_id for t in best]
  assert sorted(got[:2]) == [4, 5] and got[2] in (2, 3)
  assert decoupled.wait_for_groups(d, 9, timeout_s=5) == 4  # complete: 4
  with pytest.raises(ValueError, match="another collection"):
    decoupled.produce([make_group(5)], d)
  decoupled.clear(d)
  assert os.listdir(d) == []


# ------------------------------------------------------------ failures


def test_producer_exception_is_a_clear_error_for_the_consumer(tmp_path):
  d = str(tmp_path / "b")

  def groups():
    yield make_group(0)
    yield make_group(1)
    raise RuntimeError("engine exploded")

  job = decoupled.start_collection(groups(), d, records_per_shard=2)
  with pytest.raises(decoupled.ProducerError, match="engine exploded") as e:
    job.wait_for_groups(3, timeout_s=60)
  assert "2 of 3 groups" in str(e.value) and d in str(e.value)
  with pytest.raises(decoupled.ProducerError, match="RuntimeError"):
    job.join(60)
  assert decoupled.wait_for_groups(d, 2, timeout_s=60) == 2
  seen = []
  with pytest.raises(decoupled.ProducerError, match="engine exploded"):
    for m, _ in decoupled.stream_groups(d, timeout_s=60):
      seen.append(m.seq)
  assert seen == [0, 1] and not replay.is_complete(d)
  for path in replay.list_shards(d):  # what was written stays readable
    assert replay.read_shard(path)


def test_bad_group_fails_the_producer_naming_it(tmp_path):
  d = str(tmp_path / "b")
  mixed = make_group(0) + make_group(1)
  job = decoupled.start_collection([make_group(3), mixed], d)
  with pytest.raises(decoupled.ProducerError, match="mixes group_ids"):
    job.join(60)
  assert [m.group_id for m in decoupled.list_groups(d)] == [3]


def test_stalled_producer_times_out_instead_of_hanging(tmp_path):
  d = str(tmp_path / "b")
  release = threading.Event()

  def groups():
    yield make_group(0)
    release.wait(60)

  job = decoupled.start_collection(groups(), d)
  try:
    with pytest.raises(TimeoutError, match="no new group"):
      decoupled.wait_for_groups(d, 2, timeout_s=0.3)
  finally:
    release.set()
  job.join(60)
  assert decoupled.wait_for_groups(d, 2, timeout_s=60) == 1  # complete
  # A producer thread that ended without any marker.
  empty = str(tmp_path / "empty")
  with pytest.raises(decoupled.ProducerError, match="no _COMPLETE"):
    decoupled.wait_for_groups(empty, 1, timeout_s=60, alive=lambda: False)


def test_cancel_stops_before_the_next_group(tmp_path):
  d = str(tmp_path / "b")
  gate = threading.Event()

  def groups():
    yield make_group(0)
    gate.wait(60)
    yield make_group(1)  # written: the current item always finishes
    yield make_group(2)

  job = decoupled.start_collection(groups(), d)
  assert job.wait_for_groups(1, timeout_s=60) == 1
  job.cancel()
  gate.set()
  assert [m.group_id for m in job.join(60)] == [0, 1]
  with pytest.raises(decoupled.ProducerError, match="cancelled"):
    decoupled.wait_for_groups(d, 3, timeout_s=60)


_KILLED_CHILD = """
import os, signal, sys
sys.path[:0] = [{root!r}, {tests!r}]
from decoupled_test import make_group
from rspo_jax import decoupled, replay

n = len(make_group(0)) + len(make_group(1)) + 3
real_write = replay.ShardWriter.write_encoded
calls = []

def write_encoded(self, data):
  if len(calls) == n:  # group 2's 4th record: SIGKILL mid-group
    os.kill(os.getpid(), signal.SIGKILL)
  calls.append(1)
  real_write(self, data)

replay.ShardWriter.write_encoded = write_encoded
decoupled.produce((make_group(g) for g in range(4)), {d!r},
                  records_per_shard=2)
"""


def test_producer_killed_mid_group_leaves_readable_groups(tmp_path):
  d = str(tmp_path / "b")
  code = _KILLED_CHILD.format(root=ROOT, tests=os.path.join(ROOT, "tests"), d=d)
  proc = subprocess.run(
      [sys.executable, "-c", code],
      capture_output=True,
      timeout=120,
      check=False,
  )
  assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
  # Groups 0 and 1 complete; group 2 left one closed shard and an open .tmp.
  assert [m.group_id for m in decoupled.list_groups(d)] == [0, 1]
  got = [r for g in decoupled.read_groups(d) for t in g for r in t.steps]
  want = make_group(0) + make_group(1)
  assert sorted(map(key, got)) == sorted(map(key, want))
  assert (
      sum(len(replay.read_shard(p)) for p in replay.list_shards(d))
      == len(want) + 2
  )
  assert [n for n in os.listdir(d) if n.endswith(".tmp")]
  with pytest.raises(TimeoutError):
    decoupled.wait_for_groups(d, 3, timeout_s=0.3)
  seen = []
  with pytest.raises(TimeoutError):
    for m, _ in decoupled.stream_groups(d, timeout_s=0.3):
      seen.append(m.group_id)
  assert seen == [0, 1]
  assert replay.recover(d) == 1


# ------------------------------------------------------------ real engine


def test_b_collects_on_its_own_devices_while_the_consumer_reads(tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  from rspo_jax import sharding, warm_start
  from rspo_jax.models import hf_io
  from rspo_jax.models import tokenizer as tok_lib
  from rspo_jax.models.config import get_model_config
  from rspo_jax.rollout.collect import CollectConfig, CollectRequest
  from rspo_jax.rollout.engine import SamplingParams
  from rspo_jax.rollout.jax_engine import JaxEngine
  from third_party_envs.vector import VectorEnv

  eps = warm_start.expert_episodes(
      "toy", {"max_steps": 3}, range(8), split="train", max_steps=3
  )
  texts = [t for p in warm_start.episode_texts(eps, "toy", 2) for t in p]
  tok = tok_lib.train_tokenizer(texts, 400, str(tmp_path / "tok"))
  cfg = get_model_config(
      "tiny",
      vocab_size=400,
      hidden_size=32,
      intermediate_size=64,
      num_layers=1,
      num_heads=2,
      num_kv_heads=1,
      head_dim=16,
      max_position_embeddings=512,
      eos_token_id=2,
      bos_token_id=None,
  )
  devices = jax.devices()[4:]  # A would keep devices 0-3
  engine = JaxEngine(
      hf_io.create_model(cfg, seed=0),
      cfg,
      mesh=sharding.make_mesh((-1, 1, 1), devices),
      pad_id=0,
      eos_ids=[2],
      batch_buckets=(8,),
      prompt_buckets=(256,),
      decode_fn=lambda ids: tok.decode(ids, skip_special_tokens=True),
  )
  venv = VectorEnv("toy", {"max_steps": 3}, 4, use_processes=False)
  stats = []
  d = str(tmp_path / "b")
  try:
    groups = decoupled.collect_b_groups(
        engine,
        venv,
        tok,
        CollectRequest(
            [5, 6, 7],
            GROUP_SIZE,
            SamplingParams(max_new_tokens=16, stop_strings=("</action>",)),
            policy_tag="B",
            traj_id_start=1000,
            group_id_start=10,
            seed=1,
        ),
        CollectConfig(env_name="toy", max_steps=3, max_prompt_tokens=256),
        groups_per_call=2,
        stats=stats,
    )
    job = decoupled.start_collection(groups, d, records_per_shard=3)
    assert job.wait_for_groups(1, timeout_s=600) >= 1
    streamed = list(
        decoupled.stream_groups(d, timeout_s=600, alive=job.is_alive)
    )
    job.join(60)
  finally:
    venv.close()
  assert [m.group_id for m, _ in streamed] == [10, 11, 12]
  assert [m.task_id for m, _ in streamed] == [5, 6, 7]
  assert len(stats) == 2  # two collect calls: groups (5, 6), then (7,)
  records = [r for _, rs in streamed for r in rs]
  by_traj = collections.defaultdict(list)
  for r in records:
    by_traj[r.traj_id].append(r.step_idx)
  assert sorted(by_traj) == list(range(1000, 1006))
  assert all(s == list(range(len(s))) for s in by_traj.values())
  for r in records:
    assert r.policy_tag == "B" and np.isnan(r.dense_reward)
    assert r.group_id == 10 + (r.traj_id - 1000) // GROUP_SIZE
    assert len(r.behavior_logp) == len(r.response_ids) > 0
    assert np.all(np.isfinite(r.behavior_logp) & (r.behavior_logp <= 0))
  with pytest.raises(ValueError, match="environments"):
    decoupled.collect_b_groups(
        engine,
        venv,
        tok,
        CollectRequest([1, 2, 3], GROUP_SIZE, SamplingParams()),
        CollectConfig(env_name="toy", max_steps=3),
        groups_per_call=3,
    )
