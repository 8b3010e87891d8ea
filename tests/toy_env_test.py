"""The toy number line's task-shape knobs: line_size, min/max_distance,
direction, expert_below, and the misaligned dense reward
dense_target_offset (third_party_envs/toy.py)."""

import random

import pytest

from third_party_envs import toy

SPLITS = ("train", "valid_seen", "valid_unseen", "test")


def original_task(split, task_id):
  """toy_task before the knobs existed (commit cbfa4a0), verbatim."""
  rng = random.Random(f"toy:{split}:{task_id}")
  start = rng.randrange(10)
  target = rng.choice([v for v in range(10) if v != start])
  return start, target


def tasks(split="train", **kwargs):
  env = toy.ToyEnv(**kwargs)
  return [
      toy.toy_task(
          split,
          i,
          env.line_size,
          env.min_distance,
          env.max_distance,
          env.direction,
      )
      for i in range(env.num_tasks(split))
  ]


def test_defaults_are_the_original_tasks():
  for split in SPLITS:
    n = toy.ToyEnv().num_tasks(split)
    assert tasks(split) == [original_task(split, i) for i in range(n)]
  env = toy.ToyEnv()
  env.reset(0)
  assert (env._start, env._target) == (5, 4)  # vector_test's task 0
  assert env.tokenizer_words() == []


def test_tasks_by_hand():
  assert tasks("valid_seen", min_distance=4)[:3] == [(8, 2), (2, 8), (4, 8)]
  assert tasks(
      "valid_seen",
      line_size=12,
      min_distance=3,
      max_distance=5,
      direction="down",
  )[:3] == [(11, 7), (5, 1), (7, 3)]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min_distance=4),
        dict(min_distance=5),
        dict(line_size=20, min_distance=10),
        dict(line_size=12, min_distance=3, max_distance=5),
        dict(min_distance=4, direction="up"),
        dict(line_size=14, min_distance=2, max_distance=6, direction="down"),
    ],
)
def test_distances_and_directions_respected(kwargs):
  size = kwargs.get("line_size", 10)
  near, far = kwargs["min_distance"], kwargs.get("max_distance", size)
  sign = {"both": 0, "up": 1, "down": -1}[kwargs.get("direction", "both")]
  for split in SPLITS:
    got = tasks(split, **kwargs)
    assert got == tasks(split, **kwargs)  # deterministic
    for start, target in got:
      assert 0 <= start < size and 0 <= target < size
      assert near <= abs(target - start) <= far
      assert (target - start) * sign >= 0
    if sign == 0:  # both directions occur
      assert {t > s for s, t in got} == {True, False}


def test_reset_plays_the_task_and_the_expert_wins_in_distance_steps():
  env = toy.ToyEnv(
      line_size=12, min_distance=3, max_distance=5, direction="down"
  )
  step = env.reset(0, "valid_seen")  # (11, 7) above
  assert step.observation == "The current number is 11."
  assert step.task == "reach the number 7"
  dense = []
  while not step.done:
    step = env.step(env.expert_action())
    dense.append(step.dense_reward)
  assert step.won and len(dense) == 4 and sum(dense) == pytest.approx(1.0)
  assert env.tokenizer_words() == ["10", "11"]


def test_expert_below_abstains_past_what_it_knows():
  env = toy.ToyEnv(min_distance=4, expert_below=7)
  env.reset(0, "valid_seen")  # (8, 2): 8 >= 7
  assert env.expert_action() is None
  env.reset(1, "valid_seen")  # (2, 8): 8 >= 7
  assert env.expert_action() is None
  known = [
      i
      for i, (s, t) in enumerate(tasks("valid_seen", min_distance=4))
      if max(s, t) < 7
  ]
  assert known
  env.reset(known[0], "valid_seen")
  assert env.expert_action() in ("inc", "dec")


def play(env, actions):
  """(dense rewards, last step) of ``actions`` from the current state."""
  dense = []
  for a in actions:
    step = env.step(a)
    dense.append(step.dense_reward)
  return dense, step


def test_decoy_short_of_the_target_pays_for_stopping_short():
  # valid_seen task 1 is (2, 8): |x0 - n| = 6; decoy m = 8 - 2 = 6.
  env = toy.ToyEnv(min_distance=4, dense_target_offset=-2)
  env.reset(1, "valid_seen")
  dense, step = play(env, ["inc"] * 6)  # 3 4 5 6 toward m, 7 8 past it
  assert dense == pytest.approx([1 / 6] * 4 + [-1 / 6] * 2)
  assert step.won and step.done and step.reward == 10.0
  env.reset(1, "valid_seen")
  dense, step = play(env, ["inc"] * 4 + ["inc", "dec"] * 4)  # dither at 6
  assert sum(dense) == pytest.approx(4 / 6)  # > 2 / 6 of the winning path
  assert not step.won and step.done and step.reward == 0.0


def test_decoy_out_of_reach_flips_the_sign_of_progress():
  # (2, 8), decoy m = 8 - 24 = -16: every x of 12 steps stays above it.
  env = toy.ToyEnv(min_distance=4, dense_target_offset=-24)
  env.reset(1, "valid_seen")
  dense, _ = play(env, ["dec", "dec", "inc", "bad"])
  assert dense == pytest.approx([1 / 6, 1 / 6, -1 / 6, 0.0])
  aligned = toy.ToyEnv(min_distance=4)
  aligned.reset(1, "valid_seen")
  assert play(aligned, ["dec", "dec", "inc", "bad"])[0] == pytest.approx(
      [-1 / 6, -1 / 6, 1 / 6, 0.0]
  )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(line_size=1), "line_size"),
        (dict(min_distance=6), "min_distance"),
        (dict(min_distance=0), "min_distance"),
        (dict(min_distance=4, max_distance=3), "max_distance"),
        (dict(direction="left"), "direction"),
        (dict(dense_target_offset=1.5), "dense_target_offset"),
    ],
)
def test_bad_knobs_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    toy.ToyEnv(**kwargs)
