"""Tests of the toy environment, the registry and the VectorEnv worker pool."""

import gc
import multiprocessing as mp
import os
import re
import signal

import numpy as np
import pytest

from third_party_envs import base
from third_party_envs import registry
from third_party_envs import toy
from third_party_envs import vector


def _alive(pid: int) -> bool:
  """True while the process exists, zombies included."""
  return os.path.exists(f"/proc/{pid}")


@pytest.fixture
def make_vec():
  made = []

  def make(*args, **kwargs):
    kwargs.setdefault("step_timeout_s", 30.0)
    v = vector.VectorEnv(*args, **kwargs)
    made.append(v)
    return v

  yield make
  for v in made:
    v.close()


def _policy(step: base.EnvStep, i: int, t: int) -> str:
  """Moves toward the target, except a non-admissible 'wait' now and then."""
  if (i + t) % 3 == 0:
    return "wait"
  x = int(re.search(r"-?\d+", step.observation).group())
  target = int(step.task.split()[-1])
  return "inc" if x < target else "dec"


def _play(vec, task_ids):
  """Plays every instance to the end; returns all EnvSteps per instance."""
  first = vec.reset(task_ids)
  steps = [[s] for s in first]
  t = 0
  while any(not s[-1].done for s in steps):
    actions = [
        None if s[-1].done else _policy(s[-1], i, t)
        for i, s in enumerate(steps)
    ]
    for i, out in enumerate(vec.step(actions)):
      if actions[i] is None:
        assert out is None
      else:
        steps[i].append(out)
    t += 1
  return steps


# ------------------------------------------------------------------- toy


def test_toy_task_zero_by_hand():
  env = toy.ToyEnv()
  assert toy.toy_task("train", 0) == (5, 4)
  first = env.reset(0)
  assert first.observation == "The current number is 5."
  assert first.task == "reach the number 4"
  assert first.admissible_actions == ["inc", "dec"]
  assert env.expert_action() == "dec"
  bad = env.step("jump")  # not admissible: nothing changes, a step is used
  assert bad.observation == "The current number is 5."
  assert (bad.valid_action, bad.done, bad.reward) == (False, False, 0.0)
  away = env.step("inc")  # 5 -> 6: distance 1 -> 2, dense (1 - 2) / 1
  assert away.dense_reward == -1.0
  env.step("dec")
  won = env.step("dec")
  assert (won.won, won.done, won.reward, won.score) == (True, True, 10.0, 1.0)
  assert won.dense_reward == 1.0
  assert env.expert_action() is None
  with pytest.raises(ValueError, match="finished episode"):
    env.step("inc")


def test_toy_expert_wins_every_task_and_dense_sums_to_one():
  env = toy.ToyEnv()
  for task_id in range(env.num_tasks("test")):
    step, dense = env.reset(task_id, "test"), 0.0
    while not step.done:
      step = env.step(env.expert_action())
      dense += step.dense_reward
    assert step.won and step.reward == base.SUCCESS_REWARD
    assert dense == pytest.approx(1.0)


def test_toy_runs_out_of_steps():
  env = toy.ToyEnv(max_steps=2)
  env.reset(1)  # 7 -> 1 needs 6 steps
  assert env.expert_action() is None  # out of reach
  assert not env.step("dec").done
  last = env.step("dec")
  assert last.done and not last.won and last.reward == 0.0


def test_toy_rejects_bad_input():
  env = toy.ToyEnv()
  with pytest.raises(ValueError, match="out of range"):
    env.reset(256, "train")
  with pytest.raises(ValueError, match="unknown split"):
    env.reset(0, "dev")
  with pytest.raises(ValueError, match="max_steps"):
    toy.ToyEnv(max_steps=0)


def test_registry():
  assert isinstance(registry.make_env("toy", max_steps=3), toy.ToyEnv)
  with pytest.raises(ValueError, match="'toy', 'spell', 'webshop', 'alfworld'"):
    registry.make_env("nethack")


# ------------------------------------------------------------- VectorEnv


def test_processes_equal_in_process_and_groups_share_tasks(make_vec):
  task_ids = [0, 0, 0, 3, 3, 5, 5]
  local = _play(make_vec("toy", {}, 7, use_processes=False), task_ids)
  procs = make_vec("toy", {}, 7, num_workers=3)
  assert [len(procs._workers[w].slots) for w in range(3)] == [3, 2, 2]
  remote = _play(procs, task_ids)
  assert remote == local
  assert local[0][0] == local[1][0] == local[2][0]
  assert local[3][0] == local[4][0] and local[5][0] == local[6][0]
  assert local[0][0] != local[3][0]
  assert [s[-1].won for s in local] == [True] * 7
  assert procs.num_failures == 0 and procs.num_restarts == 0


def test_step_async_and_call_rules(make_vec):
  vec = make_vec("toy", {}, 3, num_workers=2)
  with pytest.raises(ValueError, match="no running episode"):
    vec.step(["inc", None, None])
  with pytest.raises(ValueError, match="unknown split 'dev'"):
    vec.reset([0, 0, 0], "dev")
  with pytest.raises(ValueError, match="task_ids\\[0\\] must be an int"):
    vec.reset([0.5, 0, 0])
  first = vec.reset([np.int64(0), None, 2])
  assert first[1] is None and first[0].observation.endswith("5.")
  with pytest.raises(ValueError, match="expected num_envs=3"):
    vec.step(["inc"])
  with pytest.raises(ValueError, match="must be str or None"):
    vec.step([1, None, None])
  handle = vec.step_async(["wait", None, "wait"])
  with pytest.raises(RuntimeError, match="pending"):
    vec.step(["wait", None, "wait"])
  out = handle.wait()
  assert handle.wait() is out
  assert out[1] is None
  assert (out[0].valid_action, out[0].info["step"]) == (False, 1)


def test_killed_worker_is_restarted_and_episodes_fail(make_vec):
  vec = make_vec("toy", {}, 4, num_workers=2)
  first = vec.reset([0, 0, 1, 1])
  vec.step(["wait"] * 4)
  victim = vec.worker_of(0)
  assert vec.worker_of(1) == victim and vec.worker_of(2) != victim
  old_pid = vec.worker_pids()[victim]
  os.kill(old_pid, signal.SIGKILL)
  out = vec.step(["wait", None, "wait", "wait"])
  assert out[0].done and out[0].info["failed"]
  assert "worker" in out[0].info["error"] and out[1] is None
  assert out[2].info == {"step": 2} and out[3].info == {"step": 2}
  assert vec.num_failures == 2 and vec.num_restarts == 1  # 0 failed, 1 lost
  assert vec.worker_pids()[victim] != old_pid and not _alive(old_pid)
  lost = vec.step([None, "wait", "wait", "wait"])  # 1 comes back failed now
  assert lost[1].done and lost[1].info["failed"]
  assert lost[2].info == {"step": 3}
  assert vec.reset([0, 0, 1, 1]) == first  # the restarted worker works


def test_hanging_step_times_out(make_vec):
  vec = make_vec("toy", {}, 2, num_workers=2, step_timeout_s=1.0)
  vec.reset([0, 1])
  old_pids = vec.worker_pids()
  out = vec.step(["hang", "wait"])
  assert out[0].done and out[0].info["failed"]
  assert "step_timeout_s=1.0" in out[0].info["error"]
  assert not out[1].done and "failed" not in out[1].info
  assert vec.num_failures == 1 and vec.num_restarts == 1
  assert not _alive(old_pids[0]) and vec.worker_pids()[1] == old_pids[1]
  assert vec.reset([2, None])[0].observation == "The current number is 1."


def test_exception_in_step_fails_that_episode_only(make_vec):
  vec = make_vec("toy", {}, 2, num_workers=1)
  vec.reset([0, 1])
  pids = vec.worker_pids()
  out = vec.step(["crash", "wait"])
  assert out[0].done and out[0].info["failed"]
  assert "RuntimeError" in out[0].info["error"]
  assert not out[1].done
  assert vec.num_failures == 1 and vec.num_restarts == 0
  assert vec.worker_pids() == pids
  assert vec.reset([0, None])[0].observation == "The current number is 5."


def test_in_process_exception_fails_that_episode(make_vec):
  vec = make_vec("toy", {}, 2, use_processes=False)
  vec.reset([0, 1])
  out = vec.step(["crash", "inc"])
  assert out[0].info["failed"] and out[1].observation.endswith("8.")
  assert vec.num_failures == 1


def test_bad_construction():
  with pytest.raises(ValueError, match="unknown environment"):
    vector.VectorEnv("nethack", {}, 2)
  before = set(p.pid for p in mp.active_children())
  with pytest.raises(RuntimeError, match="could not build 'toy'"):
    vector.VectorEnv("toy", {"max_steps": 0}, 2, num_workers=2)
  assert set(p.pid for p in mp.active_children()) <= before


def test_close_and_garbage_collection_leave_no_processes():
  vec = vector.VectorEnv("toy", {}, 3, num_workers=3)
  vec.reset([0, 1, 2])
  pids = vec.worker_pids()
  assert all(_alive(p) for p in pids)
  vec.close()
  vec.close()  # idempotent
  assert not any(_alive(p) for p in pids)
  with pytest.raises(RuntimeError, match="closed"):
    vec.reset([0, 1, 2])
  vec = vector.VectorEnv("toy", {}, 2, num_workers=2)
  pids = vec.worker_pids()
  del vec
  gc.collect()
  assert not any(_alive(p) for p in pids)
