"""The spell task (third_party_envs/spell.py): tasks, expert, random
success (1/A)^L, the dense rewards, invalid actions, held-out codes,
prompts within the CPU config's budgets, configs."""

import collections
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from configs import spell_gigpo, spell_grpo
from rspo_jax import models, warm_start
from rspo_jax.rollout import prompts
from third_party_envs import registry, spell

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLITS = tuple(spell.SPLIT_SIZES)


def play(env, actions):
  """(dense rewards, last step) of ``actions`` from the current state."""
  dense = []
  for a in actions:
    step = env.step(a)
    dense.append(step.dense_reward)
  return dense, step


def test_tasks_are_pure_and_follow_the_cipher():
  assert spell.cipher(5) == (2, 0, 4, 1, 3, 2, 1, 4, 3, 0)  # the docstring's
  for a in range(2, 11):
    assert sorted(collections.Counter(spell.cipher(a)).values()) == sorted(
        [10 // a + (j < 10 % a) for j in range(a)]
    )  # every letter used
  assert spell.spell_task("train", 0) == ((4, 7, 5, 8), "decd")
  for split in SPLITS:
    for i in (0, 1, 255):
      code, word = spell.spell_task(split, i, 6, 3)
      assert (code, word) == spell.spell_task(split, i, 6, 3)
      assert word == "".join("abc"[spell.cipher(3)[d]] for d in code)
  env = spell.SpellEnv()
  step = env.reset(0)
  assert step.task == "spell the hidden word of 4 letters, code 4 7 5 8"
  assert step.observation == step.anchor_obs == "Letters so far: _ _ _ _"
  assert step.admissible_actions == [f"type[{x}]" for x in "abcde"]
  assert env.tokenizer_words() == step.admissible_actions


@pytest.mark.parametrize("length", [1, 2, 3, 4, 6])
def test_held_out_codes_are_not_train_codes(length):
  def codes(split):
    return {
        spell.code_of(split, i, length) for i in range(spell.SPLIT_SIZES[split])
    }

  train = codes("train")
  for split in spell.HELD_OUT:
    assert not train & codes(split)
  if length >= 4:  # room for distinct splits: none shares a code
    assert len(train) == 1024
    held = [codes(s) for s in spell.HELD_OUT]
    assert [len(h) for h in held] == [256] * 3
    assert not (held[0] & held[1] or held[0] & held[2] or held[1] & held[2])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(word_length=1),
        dict(word_length=3, alphabet_size=2),
        dict(word_length=6, alphabet_size=10, slack=2),
    ],
)
def test_expert_wins_every_task(kwargs):
  env = registry.make_env("spell", **kwargs)
  length = env.word_length
  for split in SPLITS:
    for i in range(env.num_tasks(split)):
      step, dense = env.reset(i, split), []
      while not step.done:
        step = env.step(env.expert_action())
        dense.append(step.dense_reward)
      assert step.won and step.reward == 10.0 and step.score == 1.0
      assert dense == pytest.approx([1 / length] * length)
      assert env.expert_action() is None


def test_expert_thought_names_the_digit_it_reads():
  env = spell.SpellEnv()
  env.reset(0)  # code 4 7 5 8, word decd
  assert (env.expert_thought(), env.expert_action()) == ("digit 4", "type[d]")
  env.step("type[a]")  # wrong: lost, the expert gives up
  assert env.expert_action() is None and env.expert_thought() is None


def test_expert_digits_abstains_on_the_digits_it_does_not_know():
  env = spell.SpellEnv(expert_digits=5)
  env.reset(0)  # code 4 7 5 8
  assert env.expert_action() == "type[d]"
  env.step("type[d]")
  assert env.expert_action() is None  # digit 7
  eps = warm_start.expert_episodes(
      "spell", dict(expert_digits=5), range(1024), split="train", max_steps=4
  )
  # Won only where every digit is below 5: about (1/2)^4 of the tasks.
  assert 30 <= len(eps) <= 100
  for steps in eps:
    assert max(steps[0][0].task.split("code ")[1].split()) < "5"
  known = [i for i in range(1024) if max(spell.code_of("train", i, 4)) < 5]
  assert len(eps) == len(known)
  assert not warm_start.expert_episodes(
      "spell", dict(expert_digits=0), range(64), split="train", max_steps=4
  )


def test_guessing_expert_is_uniform_where_it_does_not_know():
  # expert_unknown='guess': known digits typed right, the others a drawn
  # letter, played to the end; every finished episode is kept for cloning.
  kwargs = dict(expert_digits=2, expert_unknown="guess")
  eps = warm_start.expert_episodes(
      "spell", kwargs, range(1024), split="train", max_steps=4
  )
  assert len(eps) == 1024  # lost episodes kept: 4 letters each
  table = spell.cipher(5)
  right = {True: [], False: []}
  guesses = collections.Counter()
  won = 0
  for task_id, steps in enumerate(eps):
    code = spell.code_of("train", task_id, 4)
    assert len(steps) == 4
    letters = [a[len("type[")] for _, a in steps]
    won += "".join(letters) == "".join("abcde"[table[d]] for d in code)
    for d, x in zip(code, letters):
      ok = x == "abcde"[table[d]]
      right[d < 2].append(ok)
      if d >= 2:
        guesses[x] += 1
  assert all(right[True])  # the digits it knows: always right
  # The others: right about 1 / 5 of the time, every letter about as often.
  assert 0.17 < np.mean(right[False]) < 0.23
  assert min(guesses.values()) > 0.85 * sum(guesses.values()) / 5
  # Wins about (0.2 + 0.8 / 5)^4 = 1.7 % of the words.
  assert 5 <= won <= 35
  # The default expert still abstains: only its won episodes are kept.
  assert (
      len(
          warm_start.expert_episodes(
              "spell",
              dict(expert_digits=2),
              range(1024),
              split="train",
              max_steps=4,
          )
      )
      < 5
  )
  with pytest.raises(ValueError, match="expert_unknown"):
    spell.SpellEnv(expert_unknown="random")


def test_show_digit_names_the_next_positions_digit():
  env = spell.SpellEnv(show_digit=True)
  obs = env.reset(0)  # code 4 7 5 8
  assert obs.observation == "Letters so far: _ _ _ _; next digit 4"
  obs = env.step("type[a]")
  assert obs.observation == "Letters so far: a _ _ _; next digit 7"
  for _ in range(3):
    obs = env.step("type[a]")
  assert obs.done and obs.observation == "Letters so far: a a a a"
  assert spell.SpellEnv().reset(0).observation == "Letters so far: _ _ _ _"


def test_cipher_digits_reads_digits_modulo_d():
  table = spell.cipher(5)
  for split in SPLITS:
    for i in (0, 7, 255):
      code, full = spell.spell_task(split, i)
      assert full == spell.spell_task(split, i, cipher_digits=10)[1]
      _, one = spell.spell_task(split, i, cipher_digits=1)
      assert one == "abcde"[table[0]] * 4  # 'cccc': one letter to find
      _, parity = spell.spell_task(split, i, cipher_digits=2)
      assert parity == "".join("abcde"[table[d % 2]] for d in code)
  env = spell.SpellEnv(cipher_digits=1, expert_digits=0, expert_unknown="guess")
  env.reset(3)
  assert env.expert_action() in env.actions  # a guess: it knows no digit
  dense, step = play(env, ["type[c]"] * 4)
  assert dense == [0.25] * 4 and step.won  # the same letter everywhere


@pytest.mark.parametrize("length, size", [(3, 2), (2, 5), (4, 3)])
def test_random_policy_wins_one_in_a_to_the_l(length, size):
  env = spell.SpellEnv(word_length=length, alphabet_size=size)
  rng = random.Random(0)
  n, wins = 6000, 0
  for e in range(n):
    step = env.reset(e % 1024)
    while not step.done:
      step = env.step(rng.choice(step.admissible_actions))
    wins += step.won
  p = size**-length
  sigma = (n * p * (1 - p)) ** 0.5
  assert abs(wins - n * p) < 5 * sigma  # loose: 5 standard deviations


def test_aligned_dense_pays_only_for_a_growing_correct_prefix():
  env = spell.SpellEnv()
  env.reset(0)  # decd
  dense, step = play(env, ["type[d]", "type[a]", "type[c]", "type[d]"])
  assert dense == [0.25, 0.0, 0.0, 0.0]  # c, d right but after a wrong a
  assert step.done and not step.won and step.reward == 0.0
  assert step.score == 0.75  # three positions right
  env.reset(0)
  dense, step = play(env, ["type[d]", "type[e]", "type[c]", "type[d]"])
  assert sum(dense) == pytest.approx(1.0) and step.won
  assert step.reward == 10.0 and step.observation == "Letters so far: d e c d"


def test_decoy_dense_pays_the_next_letter_and_never_wins():
  env = spell.SpellEnv(dense="decoy")
  env.reset(0)  # decd over abcde: the decoys are e, a, d, e
  dense, step = play(env, ["type[e]", "type[a]", "type[d]", "type[e]"])
  assert dense == [0.25] * 4 and not step.won and step.reward == 0.0
  env.reset(0)
  dense, step = play(env, ["type[d]", "type[e]", "type[c]", "type[d]"])
  assert dense == [0.0] * 4 and step.won  # the win earns no dense reward
  one = spell.SpellEnv(dense="decoy", cipher_digits=1)
  one.reset(3)
  letter = one.word[0]
  assert set(one.word) == {letter} and one.decoy(0) != letter
  dense, step = play(one, [spell.action_of(one.decoy(0))] * 4)
  assert sum(dense) == pytest.approx(1.0) and not step.won


@pytest.mark.parametrize(
    "m, weight, typed, dense",
    [
        # train task 0: decd over abcde, decoys e a d e (test above)
        (0, 1, "decd", [0.25, 0.25, 0.25, 0.25]),  # m = 0: 'aligned'
        (0, 1, "dacd", [0.25, 0.0, 0.0, 0.0]),
        (1, 1, "decd", [0.25, 0.25, 0.25, 0.0]),  # the win: 3 / 4
        (1, 1, "dece", [0.25, 0.25, 0.25, 0.25]),  # the target: 1
        (1, 1, "dace", [0.25, 0.0, 0.0, 0.25]),  # the decoy after a slip too
        (1, 3, "dece", [0.25, 0.25, 0.25, 0.75]),  # beta = 3: 3 / 2
        (2, 1, "decd", [0.25, 0.25, 0.0, 0.0]),  # the win: 2 / 4
        (2, 1, "dede", [0.25, 0.25, 0.25, 0.25]),
        (2, 1, "aade", [0.0, 0.0, 0.25, 0.25]),
        (2, 0.5, "dede", [0.25, 0.25, 0.125, 0.125]),
        (3, 1, "decd", [0.25, 0.0, 0.0, 0.0]),  # the win: 1 / 4
        (3, 1, "cade", [0.0, 0.25, 0.25, 0.25]),
        (4, 1, "ebde", [0.25, 0.0, 0.25, 0.25]),  # m = L: 'decoy'
    ],
)
def test_partial_dense_pays_the_word_then_m_decoys(m, weight, typed, dense):
  env = spell.SpellEnv(dense="partial", decoy_positions=m, decoy_weight=weight)
  env.reset(0)
  assert env.word == "decd" and env.target() == "decd"[: 4 - m] + (
      "eade"[4 - m :]
  )
  got, step = play(env, [spell.action_of(x) for x in typed])
  assert got == dense
  assert step.won == (typed == "decd")
  assert step.reward == (10.0 if typed == "decd" else 0.0)
  if m == 4 and weight == 1:  # the same rewards as 'decoy'
    decoy = spell.SpellEnv(dense="decoy")
    decoy.reset(0)
    assert play(decoy, [spell.action_of(x) for x in typed])[0] == dense


def test_partial_dense_in_the_one_letter_world():
  """D = 1, L = 4: every word is cccc, its decoy d. With m decoy
  positions the win earns (4 - m) / 4, the target c^(4-m) d^m
  (4 - m + beta m) / 4 and never wins; typing d everywhere earns
  beta m / 4: more than the win iff beta m > 4 - m."""
  for m in range(5):
    for weight in (1.0, 2.0):
      env = spell.SpellEnv(
          dense="partial",
          decoy_positions=m,
          decoy_weight=weight,
          cipher_digits=1,
      )
      env.reset(3)
      assert env.word == "cccc" and env.target() == "c" * (4 - m) + "d" * m
      dense, step = play(env, ["type[c]"] * 4)
      assert sum(dense) == pytest.approx((4 - m) / 4) and step.won
      env.reset(3)
      dense, step = play(env, [spell.action_of(x) for x in env.target()])
      assert sum(dense) == pytest.approx((4 - m + weight * m) / 4)
      assert step.won == (m == 0)
      env.reset(3)
      dense, step = play(env, ["type[d]"] * 4)
      assert sum(dense) == pytest.approx(weight * m / 4) and not step.won


def test_misaligned_dense_is_farmed_by_repeating_a_letter_of_the_word():
  env = spell.SpellEnv(dense="misaligned")
  env.reset(0)  # decd: 'e' is in the word, at position 1 only
  dense, step = play(env, ["type[e]"] * 4)
  assert dense == [0.25] * 4 and not step.won
  env.reset(0)
  assert play(env, ["type[a]"] * 4)[0] == [0.0] * 4  # not in the word
  farmed = 0
  for i in range(1024):
    word = spell.spell_task("train", i)[1]
    if len(set(word)) == 1:
      continue  # typing its letter is the win itself
    env.reset(i)
    common = collections.Counter(word).most_common(1)[0][0]
    dense, step = play(env, [spell.action_of(common)] * 4)
    assert sum(dense) == pytest.approx(1.0)  # a win's dense return
    assert not step.won and step.reward == 0.0
    farmed += 1
  assert farmed > 1000


def test_invalid_actions_change_nothing_and_use_a_turn():
  env = spell.SpellEnv()
  env.reset(0)
  step = env.step("type[f]")  # not in a..e
  assert not step.valid_action and step.dense_reward == 0.0
  assert step.observation == "Letters so far: _ _ _ _" and not step.done
  assert env.expert_action() is None  # 3 turns left for 4 letters
  dense, step = play(env, ["type[d]", "type[e]", "type[c]"])
  assert step.done and not step.won and step.score == 0.75
  with pytest.raises(ValueError, match="finished"):
    env.step("type[d]")
  env = spell.SpellEnv(slack=1)  # one spare turn: still winnable
  env.reset(0)
  assert not env.step("spell it").valid_action
  dense, step = play(env, ["type[d]", "type[e]", "type[c]", "type[d]"])
  assert step.won and sum(dense) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(word_length=0), "word_length"),
        (dict(alphabet_size=1), "alphabet_size"),
        (dict(alphabet_size=11), "alphabet_size"),
        (dict(dense="prefix"), "dense"),
        (dict(expert_digits=11), "expert_digits"),
        (dict(slack=-1), "slack"),
        (dict(cipher_digits=0), "cipher_digits"),
        (dict(cipher_digits=11), "cipher_digits"),
        (dict(dense="partial", decoy_positions=5), "decoy_positions"),
        (dict(dense="partial", decoy_positions=-1), "decoy_positions"),
        (dict(decoy_positions=1), "needs dense='partial'"),
        (dict(dense="decoy", decoy_positions=2), "needs dense='partial'"),
        (dict(dense="partial", decoy_weight=0), "decoy_weight"),
        (dict(decoy_weight=2), "needs dense='partial'"),
    ],
)
def test_bad_knobs_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    spell.SpellEnv(**kwargs)


def test_prompts_and_replies_fit_the_cpu_budgets(tmp_path):
  """A tokenizer trained as build.py trains it: the last turn's prompt
  (history 2) within max_prompt_tokens, a reply within max_new_tokens."""
  cfg = spell_grpo.get_config()
  kwargs = dict(cfg.env.kwargs)
  eps = warm_start.expert_episodes(
      "spell", kwargs, range(64), split="train", max_steps=cfg.env.max_steps
  )
  texts = [
      t
      for pair in warm_start.episode_texts(eps, "spell", cfg.env.history_length)
      for t in pair
  ]
  words = spell.SpellEnv(**kwargs).tokenizer_words()
  tok = models.train_tokenizer(
      texts, cfg.model.tokenizer_vocab, str(tmp_path), whole_words=words
  )
  steps = eps[0]
  history = [(obs.observation, a) for obs, a in steps[:-1]]
  obs, action = steps[-1]
  ids, dropped, truncated = prompts.build_prompt_ids(
      tok,
      "spell",
      obs.task,
      obs.observation,
      obs.admissible_actions,
      history,
      len(history),
      max_prompt_tokens=cfg.rollout.max_prompt_tokens,
      history_length=cfg.env.history_length,
  )
  assert (dropped, truncated) == (0, False)
  reply = tok.encode(
      warm_start.step_reply(obs, action), add_special_tokens=False
  )
  assert len(reply) + 1 <= cfg.rollout.max_new_tokens  # + <|im_end|>
  assert tok.convert_ids_to_tokens(reply).count(action) == 1  # one token
  assert prompts.parse_action(warm_start.step_reply(obs, action), "spell") == (
      action,
      True,
  )


def test_configs_and_knob_overrides():
  c = spell_grpo.get_config()
  assert (c.env.name, c.algo.name, c.model.preset) == ("spell", "grpo", "tiny")
  assert dict(c.env.kwargs) == dict(
      word_length=4,
      alphabet_size=5,
      dense="aligned",
      expert_digits=10,
      slack=0,
      expert_unknown="abstain",
      show_digit=False,
      cipher_digits=10,
      decoy_positions=0,
      decoy_weight=1.0,
  )
  assert (
      c.env.max_steps,
      c.rollout.max_new_tokens,
      c.rollout.max_prompt_tokens,
  ) == (4, 16, 256)
  c = spell_gigpo.get_config(
      "env.kwargs.word_length=6,env.kwargs.slack=1,"
      "env.kwargs.dense=misaligned"
  )
  assert c.algo.name == "gigpo" and c.env.max_steps == 7  # L + slack
  assert (c.env.kwargs.word_length, c.env.kwargs.dense) == (6, "misaligned")
  assert (
      spell_grpo.get_config(
          "env.kwargs.word_length=6,env.max_steps=9"
      ).env.max_steps
      == 9
  )
  paper = spell_grpo.get_config("model=qwen2.5-1.5b,env.kwargs.word_length=5")
  assert paper.env.max_steps == 5 and paper.model.preset == "qwen2.5-1.5b"
  with pytest.raises(ValueError, match="word_length"):
    spell_grpo.get_config("env.kwargs.word_length=six")
  c = spell_gigpo.get_config(
      "env.kwargs.dense=partial," "env.kwargs.decoy_positions=2"
  )
  assert (c.env.kwargs.dense, c.env.kwargs.decoy_positions) == ("partial", 2)
  for arg, message in (
      (
          "env.kwargs.dense=partial,env.kwargs.decoy_positions=5",
          r"env.kwargs .*decoy_positions=5.*: decoy_positions must be in"
          r" \[0, word_length = 4\]",
      ),
      (
          "env.kwargs.dense=partial,env.kwargs.decoy_weight=-1",
          "decoy_weight must be > 0",
      ),
      ("env.kwargs.decoy_weight=2", "decoy_weight=2.0 needs"),
      (
          "env.kwargs.dense=partial,env.kwargs.decoy_positions=5,"
          "env.kwargs.word_length=6",
          None,
      ),  # 5 <= 6: fine
      ("env.kwargs.decoy_positions=1", "needs dense='partial'"),
      ("env.kwargs.dense=prefix", "env.kwargs.dense='prefix'"),
  ):
    if message is None:
      spell_grpo.get_config(arg)
      continue
    with pytest.raises(ValueError, match=message) as e:
      spell_grpo.get_config(arg)
    assert "\n" not in str(e.value)  # one line


def test_dry_run_prints_the_plan():
  env = {k: v for k, v in os.environ.items() if not k.startswith("RSPO_")}
  env.update(JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [
          sys.executable,
          "launch/train.py",
          "--config=configs/spell_grpo.py",
          "--dry_run",
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  plan = json.loads(proc.stdout)
  assert "spell" in json.dumps(plan)
