"""Bring your own environment and dense reward (docs/custom_env.md).

``tests/data/spell_env.py`` is a user environment outside the packages,
imported by path (``env.name=spell_env:SpellEnv``); its dense reward is a
user function (``rspo.dense_reward=spell_env:prefix_progress``).
"""

import ast
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from rspo_jax.rollout import prompts
from rspo_jax.types import StepRecord
from third_party_envs import base, registry
from third_party_envs.vector import VectorEnv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
ENV = "spell_env:SpellEnv"
DENSE = "spell_env:prefix_progress"
# As tests/rspo_e2e_test.py's MICRO: a 1-layer model, 2 groups of 2, k=1.
MICRO = (
    "model.overrides=num_layers=1;hidden_size=64;intermediate_size=128;"
    "num_heads=2;num_kv_heads=1;head_dim=32,model.tokenizer_vocab=300,"
    "sft.steps=8,sft.num_episodes=16,sft.batch_rows=16,"
    "train.batch_tasks=2,train.group_size=2,rspo.alpha=0.5,rspo.k=1,"
    "steps=2,env.max_steps=4,env.num_eval_tasks=4,env.num_workers=1,"
    "rollout.max_new_tokens=16,rollout.max_prompt_tokens=256"
)


@pytest.fixture(autouse=True)
def user_code_on_path(monkeypatch):
  monkeypatch.syspath_prepend(DATA)
  monkeypatch.setenv(
      "PYTHONPATH",
      os.pathsep.join(
          [DATA] + [p for p in [os.environ.get("PYTHONPATH")] if p]
      ),
  )
  prompts.spec_for.cache_clear()


class PlainSpellEnv(base.TextEnv):
  """A user environment with no ``prompt_spec``: verl-agent's defaults."""

  name = "plain"

  def __init__(self):
    import spell_env

    self.env = spell_env.SpellEnv()

  def num_tasks(self, split):
    return self.env.num_tasks(split)

  def reset(self, task_id, split="train"):
    return self.env.reset(task_id, split)

  def step(self, action):
    return self.env.step(action)

  def expert_action(self):
    return self.env.expert_action()


class HalfSpellEnv(base.TextEnv):
  """A user environment that forgot ``step`` and ``expert_action``."""

  def num_tasks(self, split):
    return 4

  def reset(self, task_id, split="train"):
    return base.EnvStep(observation="", admissible_actions=[])


# ---------------------------------------------------------------- registry


def test_import_path_builds_the_env_with_default_anchors():
  import spell_env

  env = registry.make_env(ENV, max_steps=5)
  assert isinstance(env.env, spell_env.SpellEnv) and env.max_steps == 5
  word = spell_env.word_of("train", 3)
  first = env.reset(3)
  assert first.observation == f"The word is '{word}'. You have typed ''."
  assert first.anchor_obs == first.observation  # GiGPO's default key
  after = env.step(f"type {word[0]}")
  assert (
      after.anchor_obs == f"The word is '{word}'. You have typed "
      f"'{word[0]}'."
  )
  assert after.dense_reward == 0.0 and not after.done


def test_bad_import_paths_say_what_is_wrong():
  cases = {
      "spell_env:Nope": "module 'spell_env' has no attribute 'Nope'",
      "no_such_module:Env": "cannot import module 'no_such_module'",
      "spell_env:word_of": "not a subclass of third_party_envs.base.TextEnv",
      "nethack": "unknown environment 'nethack'",
      "custom_env_test:HalfSpellEnv": "class HalfSpellEnv does not define"
      " expert_action, step (abstract in",
  }
  for name, message in cases.items():
    with pytest.raises(ValueError, match=re.escape(message)):
      registry.make_env(name)
  with pytest.raises(
      ValueError,
      match="rspo.dense_reward 'spell_env:LETTERS'"
      " is 'abcdef', not callable",
  ):
    registry.import_function("spell_env:LETTERS", "rspo.dense_reward")


def test_missing_methods_stop_the_launcher_in_one_line():
  """Checked with the other inputs, before the tokenizer or any worker."""
  from configs import base as config_base
  from rspo_jax.errors import ConfigError
  from rspo_launch import check_inputs

  c = config_base.make_config("toy", "grpo")
  c.env.name = "custom_env_test:HalfSpellEnv"
  with pytest.raises(ConfigError) as e:
    check_inputs(c)
  assert str(e.value) == (
      "env.name: environment 'custom_env_test:HalfSpellEnv': class"
      " HalfSpellEnv does not define expert_action, step (abstract in"
      " third_party_envs.base.TextEnv; docs/custom_env.md, section 1)"
  )


def test_vector_env_runs_the_user_env_in_workers():
  import spell_env

  venv = VectorEnv(ENV, {"max_steps": 4}, 2, num_workers=1)
  try:
    obs = venv.reset([0, 1], split="valid_seen")
    words = [spell_env.word_of("valid_seen", i) for i in (0, 1)]
    assert [o.anchor_obs for o in obs] == [
        f"The word is '{w}'. You have typed ''." for w in words
    ]
    out = venv.step([f"type {w[0]}" for w in words])
    assert [
        o.observation.endswith(f"typed '{w[0]}'.") for o, w in zip(out, words)
    ] == [True, True]
  finally:
    venv.close()


# ---------------------------------------------------------------- prompts


CHOOSE = (
    "\nNow it is your turn to choose one action for the current step.\n"
    "First reason step by step about the current situation. This "
    "reasoning MUST be enclosed within <think> </think> tags.\n"
    "Then pick one admissible action for the current step and give it "
    "within <action> </action> tags.\n"
)
ACTIONS = (
    "Your admissible actions in the current situation are: ['type a',"
    " 'type b', 'type c', 'type d', 'type e', 'type f', 'erase'].\n"
)


def test_prompt_uses_the_env_prompt_spec():
  text = prompts.build_prompt(
      ENV,
      "type the word 'cab'",
      "The word is 'cab'. You have typed ''.",
      ["type a", "type b", "type c", "type d", "type e", "type f", "erase"],
      [],
      0,
  )
  assert text == (
      "You are typing a word one letter at a time. Your task is to: type "
      "the word 'cab'.\n"
      "Your current observation is: The word is 'cab'. You have typed ''.\n"
      + ACTIONS
      + CHOOSE
  )


def test_prompt_defaults_for_an_env_without_a_spec():
  history = [("typed ''", "type c"), ("typed 'c'", "type b")]
  text = prompts.build_prompt(
      "custom_env_test:PlainSpellEnv",
      "type the word 'cab'",
      "typed 'cb'",
      ["type a", "type b", "type c", "type d", "type e", "type f", "erase"],
      history,
      2,
      history_length=1,
  )
  assert text == (
      "You are an expert agent acting in the plain environment. Your task "
      "is to: type the word 'cab'\n"
      "Prior to this step, you have already taken 2 step(s). Below are the "
      "most recent 1 observation(s) and the action(s) you took:\n"
      "[Observation 2: 'typed 'c'', Action 2: 'type b']\n"
      "You are now at step 3 and your current observation is: typed 'cb'\n"
      + ACTIONS
      + CHOOSE
  )


def test_prompt_spec_must_be_a_prompt_spec(monkeypatch):
  monkeypatch.setattr(
      PlainSpellEnv, "prompt_spec", "Spell well.", raising=False
  )
  with pytest.raises(ValueError, match="prompt_spec is str, expected"):
    prompts.build_prompt("custom_env_test:PlainSpellEnv", "t", "o", [], [], 0)


# ------------------------------------------------------------ dense reward


def _record(obs: str, action: str) -> StepRecord:
  return StepRecord(
      task_id=0,
      group_id=0,
      traj_id=0,
      step_idx=0,
      prompt_ids=None,
      response_ids=None,
      behavior_logp=None,
      anchor_obs=obs,
      action=action,
  )


def test_user_dense_reward_fills_records_in_place():
  fn = registry.import_function(DENSE, "rspo.dense_reward")
  obs = "The word is 'cab'. You have typed '{}'."
  records = [
      _record(obs.format(""), "type c"),  # right letter: +1 of 3
      _record(obs.format("c"), "type b"),  # wrong letter: -1 of 3
      _record(obs.format("cb"), "erase"),  # erases the wrong one: +1
      _record(obs.format("ca"), "erase"),  # erases a right one: -1
      _record(obs.format(""), "erase"),  # nothing to erase: 0
      _record(obs.format("c"), "<think>x</think>"),  # no action: 0
      _record("some other text", "type c"),
  ]
  assert fn(records) is None
  assert [r.dense_reward for r in records] == pytest.approx(
      [
          1 / 3 - 0.05,
          -1 / 3 - 0.05,
          1 / 3 - 0.05,
          -1 / 3 - 0.05,
          -0.05,
          -0.05,
          -0.05,
      ]
  )


# ------------------------------------------------------------ the docs


def _doc_blocks(lang):
  text = open(os.path.join(ROOT, "docs", "custom_env.md")).read()
  return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_docs_code_is_the_tested_file():
  """Each of the doc's two blocks is code of the tested file: its
  top-level statements are the file's, compared as ASTs (the doc keeps
  its own line breaks; pyink formats the file)."""
  source = open(os.path.join(DATA, "spell_env.py")).read()
  in_file = {ast.dump(node) for node in ast.parse(source).body}
  blocks = [
      b
      for b in _doc_blocks("python")
      if not b.startswith("from configs import base")
  ]
  assert len(blocks) == 2  # the environment, the dense reward
  for block in blocks:
    nodes = ast.parse(block).body
    assert nodes and all(ast.dump(node) in in_file for node in nodes), block


def test_docs_config_file_builds_the_config(tmp_path):
  [block] = [
      b
      for b in _doc_blocks("python")
      if b.startswith("from configs import base")
  ]
  path = tmp_path / "spell_config.py"
  path.write_text(block)
  spec = importlib.util.spec_from_file_location("spell_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("seed=3")
  assert (c.env.name, c.rspo.dense_reward) == (ENV, DENSE)
  assert (dict(c.env.kwargs), c.env.max_steps, c.seed) == (
      {"max_steps": 6},
      6,
      3,
  )


# ---------------------------------------------------------------- the CLI


def _doc_commands(block):
  """A bash block's command lines: ``(script, overrides, other flags)``."""
  commands = []
  for line in block.splitlines():
    if line.startswith("python launch/"):
      script, config, *flags = shlex.split(line)[1:]
      path, overrides = config.split(":", 1)
      assert path == "--config=configs/toy_grpo.py"
      commands.append(
          (
              script,
              overrides,
              [f for f in flags if not f.startswith("--workdir")],
          )
      )
  return commands


def _run(script, overrides, *flags):
  cmd = [
      sys.executable,
      os.path.join(ROOT, script),
      f"--config={ROOT}/configs/toy_grpo.py:{MICRO},{overrides}",
      *flags,
  ]
  env = dict(os.environ, XLA_FLAGS="")
  out = subprocess.run(
      cmd, capture_output=True, text=True, env=env, timeout=1200
  )
  assert out.returncode == 0, out.stderr[-3000:]


def test_docs_first_try_is_the_tested_micro_run():
  """The first try is the slow test's training run: MICRO, then the full
  command's overrides."""
  first_try, full = _doc_blocks("bash")
  [(script, overrides, flags)] = _doc_commands(first_try)
  [(_, config, _), _] = _doc_commands(full)
  assert script == "launch/train.py" and flags == []
  assert overrides == f"{MICRO},{config}"


@pytest.mark.slow
def test_two_rspo_loops_and_an_evaluation_on_a_user_env(tmp_path):
  """docs/custom_env.md's two commands, micro-sized: GiGPO + RSPO on
  spell_env (anchors defaulted to the observation) with the user dense
  reward for B, then launch/eval.py on the trained run."""
  [_, block] = _doc_blocks("bash")
  (train, config, train_flags), (evaluate, eval_config, eval_flags) = (
      _doc_commands(block)
  )
  assert (train, evaluate) == ("launch/train.py", "launch/eval.py")
  assert (
      config
      == eval_config
      == (f"algo.name=gigpo,env.name={ENV},rspo.dense_reward={DENSE}")
  )
  workdir = str(tmp_path / "run")
  _run(train, config, *train_flags, f"--workdir={workdir}", "--no_progress")
  final = json.load(open(os.path.join(workdir, "eval_final.json")))
  assert 0.0 <= final["success_rate"] <= 1.0
  rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  a_rows = [r for r in rows if r["phase"] == "A"]
  b_rows = [r for r in rows if r["phase"] == "B"]
  assert [r["step"] for r in a_rows] == [1, 2] and len(b_rows) == 2
  # A sees the environment's dense reward (none: 0.0); B's is the user
  # function's, each step one of {+1, 0, -1} / 3 - 0.05.
  assert all(r["dense_reward_mean"] == 0.0 for r in a_rows)
  for r in b_rows:
    assert -1 / 3 - 0.05 <= r["dense_reward_mean"] <= 1 / 3 - 0.05
    assert r["dense_reward_mean"] != 0.0
  out = str(tmp_path / "eval.json")
  assert eval_flags == ["--seeds=0,1,2", "--temperature=0.4"]
  _run(
      evaluate,
      config,
      *eval_flags,
      f"--workdir={workdir}",
      "--num_tasks=4",
      f"--out={out}",
  )
  result = json.load(open(out))
  assert result["from_checkpoint"] is True and result["a_steps"] == 2
  assert (result["split"], result["num_tasks"], result["seeds"]) == (
      "valid_seen",
      4,
      [0, 1, 2],
  )
  assert 0.0 <= result["success_rate"] <= 1.0
