"""Fuzzing of what a model can send (issue 9, fault 5): arbitrary replies
through the whole collection path, arbitrary action strings into every
environment's ``step``. Never an exception, never a hang; an invalid action
changes nothing. (prompts_test fuzzes ``parse_action`` alone.)
"""

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from rspo_jax import models
from rspo_jax.rollout import prompts
from rspo_jax.rollout.collect import CollectConfig, CollectRequest, collect
from rspo_jax.rollout.engine import Engine, GenerationResult, SamplingParams
from third_party_envs import toy
from third_party_envs.vector import VectorEnv
from third_party_envs.webshop import WebShopEnv

# Toy test hooks ('hang' sleeps, 'crash' raises) are real actions of that
# environment, not arbitrary text; the hooks' handling is vector_test's.
_HOOKS = ("hang", "crash")
SETTINGS = hypothesis.settings(
    deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)

# Text a model might produce: anything, action-shaped strings, tags.
ACTIONS = (
    st.text(max_size=80)
    | st.builds(
        lambda name, arg: f"{name}[{arg}]",
        st.sampled_from(["search", "click", "Click", "buy", ""]),
        st.text(max_size=30),
    )
    | st.builds(
        lambda a: f"<think>x</think><action>{a}</action>", st.text(max_size=30)
    )
    | st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "click[]",
            "search[ ]",
            "click[buy now",
            "[",
            "]",
            "\u202e",
            "🛒" * 50,
            "a" * 5000,
        ]
    )
)


class ReplayEngine(Engine):
  """Answers the given token-id lists, one per prompt, cycling."""

  def __init__(self, replies):
    self.replies, self.i = replies, 0

  @property
  def weight_version(self):
    return 0

  def update_weights(self, params_or_path, version):
    pass

  def generate(self, prompts_, params):
    out = []
    for _ in prompts_:
      ids = self.replies[self.i % len(self.replies)]
      self.i += 1
      out.append(
          GenerationResult(
              np.asarray(ids, np.int32),
              np.full(len(ids), -1.0, np.float32),
              "length",
          )
      )
    return out


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  texts = [
      prompts.build_prompt(
          "toy",
          f"reach the number {t}",
          f"The current number is {t}.",
          ["inc", "dec"],
          [],
          0,
      )
      for t in range(10)
  ]
  texts += ["<think>up</think><action>inc</action>"] * 20
  return models.train_tokenizer(texts, 300, str(tmp_path_factory.mktemp("tok")))


# ------------------------------------------------------------ collect path


@SETTINGS
@hypothesis.given(
    replies=st.lists(
        st.lists(st.integers(0, 400), max_size=24), min_size=1, max_size=6
    ),
    task=st.integers(0, 255),
)
def test_any_reply_through_collect(tokenizer, replies, task):
  """Token ids (inside and past the vocabulary, special tokens, nothing)
  -> records whose penalty and effect follow parse_action exactly."""
  venv = VectorEnv(
      "toy", {"max_steps": 3, "hang_s": 0.0}, 2, use_processes=False
  )
  cfg = CollectConfig(env_name="toy", max_steps=3, max_prompt_tokens=128)
  records, stats = collect(
      ReplayEngine(replies),
      venv,
      tokenizer,
      CollectRequest([task], 2, SamplingParams(max_new_tokens=24)),
      cfg,
  )
  assert stats["episodes"] == 2 and len(records) <= 6
  for r in records:
    text = tokenizer.decode(r.response_ids.tolist(), skip_special_tokens=True)
    action, valid = prompts.parse_action(text, "toy")
    assert (r.action, r.invalid) == (action, not valid)
    assert r.env_reward == pytest.approx(
        10.0 * (r.won and r.done) - 0.1 * r.invalid
    )
  by_traj = {}
  for r in records:
    by_traj.setdefault(r.traj_id, []).append(r)
  for steps in by_traj.values():
    for a, b in zip(steps, steps[1:]):  # inadmissible: the state stays
      if a.action not in toy.ADMISSIBLE and not a.failed:
        assert b.anchor_obs == a.anchor_obs


# ------------------------------------------------------------ environments


@SETTINGS
@hypothesis.given(
    actions=st.lists(ACTIONS | st.sampled_from(toy.ADMISSIBLE), max_size=12),
    task=st.integers(0, 255),
)
def test_toy_step_any_text(actions, task):
  """Arbitrary text interleaved with real moves ends in the state of the
  real moves alone."""
  actions = [a for a in actions if a not in _HOOKS]
  env, ref = toy.ToyEnv(max_steps=100), toy.ToyEnv(max_steps=100)
  s = before = env.reset(task)
  ref.reset(task)
  for a in actions:
    if s.done:
      break
    s = env.step(a)
    if a in toy.ADMISSIBLE:
      assert s.valid_action
      r = ref.step(a)
      assert s.observation == r.observation
    else:
      assert not s.valid_action and s.reward == 0 and s.dense_reward == 0
      assert (s.observation, s.admissible_actions) == (
          before.observation,
          before.admissible_actions,
      )
    before = s


@pytest.fixture(scope="module")
def webshop():
  return WebShopEnv()


@SETTINGS
@hypothesis.given(
    action=ACTIONS, expert_steps=st.integers(0, 4), task=st.integers(0, 99)
)
def test_webshop_step_any_text(webshop, action, expert_steps, task):
  env = webshop
  before = env.reset(task, "train")
  for _ in range(expert_steps):  # search page, results, item, options...
    a = env.expert_action()
    if a is None or a == "click[buy now]":
      break
    before = env.step(a)
  s = env.step(action)
  assert isinstance(s.observation, str) and s.observation
  if not s.valid_action:
    assert (s.observation, s.admissible_actions, s.info) == (
        before.observation,
        before.admissible_actions,
        before.info,
    )
    assert s.reward == 0 and s.dense_reward == 0 and not s.done


@pytest.fixture(scope="module")
def alfworld(tmp_path_factory):
  alf = pytest.importorskip("third_party_envs.alfworld")  # needs textworld
  env = alf.AlfWorldEnv(cache_dir=str(tmp_path_factory.mktemp("alfworld")))
  env.reset(0, "train")
  return env


@SETTINGS
@hypothesis.given(action=ACTIONS)
def test_alfworld_step_any_text(alfworld, action):
  env = alfworld
  if env._last.done:  # pylint: disable=protected-access
    env.reset(0, "train")
  before = env._last  # pylint: disable=protected-access
  expert = env.expert_action()
  s = env.step(action)
  if action.strip() in before.admissible_actions:
    return  # a real command (e.g. 'look'): valid, may move
  assert not s.valid_action and s.observation == "Nothing happens."
  assert s.admissible_actions == before.admissible_actions
  assert s.reward == 0 and s.dense_reward == 0 and s.done == before.done
  assert env.expert_action() == expert  # the state did not move
