"""A user's own environment at run time, and the workdir (issue 53): every
mistake ends with one line and exit 1, nothing passes silently.

The rows of the issue's table, against ``tests/data/key_env.py`` (a
"find the key" environment and one class per mistake):

  reward NaN, GRPO alone or RSPO    EnvError naming class, method, task, turn
  reset() returns a str or a dict   the same
  no dense reward, RSPO's oracle    stops at start: dense_reward, prm, rspo=0
  --workdir a file, under /proc     one line at start
  --workdir of another config       one line at start (and at the restore)
  metrics.wandb_project, no wandb   one line at start

In-process checks carry the bulk; a few subprocess runs of launch/train.py
show the exit status and the single line (each stops before any model is
built, ~5 s).
"""

import logging
import math
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from configs import base as config_base
from env_failures_test import ReplyEngine
from rspo_jax import models, preflight, warm_start
from rspo_jax.errors import ConfigError, EnvError, MissingPackage
from rspo_jax.rollout import prompts
from rspo_jax.rollout.collect import CollectConfig, CollectRequest, collect
from rspo_jax.rollout.engine import SamplingParams
from rspo_jax.rollout.unbarriered import collect_unbarriered
from rspo_launch import exit_on_user_error
from third_party_envs import base, contract
from third_party_envs.vector import VectorEnv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
DOC = "(docs/custom_env.md, section 1)"


@pytest.fixture(autouse=True)
def user_code_on_path(monkeypatch):
  monkeypatch.syspath_prepend(DATA)
  monkeypatch.setenv(
      "PYTHONPATH",
      os.pathsep.join(
          [ROOT, DATA] + [p for p in [os.environ.get("PYTHONPATH")] if p]
      ),
  )
  prompts.spec_for.cache_clear()


def _step(**fields):
  return base.EnvStep(
      **{"observation": "o", "admissible_actions": ["a"], **fields}
  )


# ----------------------------------------------------------- the contract


@pytest.mark.parametrize(
    "out, why",
    [
        ("text", "a str ('text'); expected a third_party_envs.base.EnvStep"),
        (
            {"observation": "o"},
            "a dict ({'observation': 'o'}); expected a"
            " third_party_envs.base.EnvStep",
        ),
        (None, "a NoneType (None); expected a third_party_envs.base.EnvStep"),
        (_step(reward=math.nan), "reward=nan; expected a finite number"),
        (_step(score=np.float32("inf")), "score=inf; expected a finite number"),
        (
            _step(dense_reward=-math.inf),
            "dense_reward=-inf; expected a finite number",
        ),
        (_step(reward="10"), "reward='10' (a str); expected a finite number"),
        (_step(done=None), "done=None (a NoneType); expected a bool"),
        (_step(observation=3), "observation=3 (a int); expected a str"),
        (
            base.EnvStep(observation="o", admissible_actions="go"),
            "admissible_actions='go'; expected a list of str",
        ),
        (_step(info=[]), "info=[]; expected a dict"),
    ],
)
def test_contract_names_what_came_back_and_what_was_expected(out, why):
  assert contract.problem(out) == why


def test_contract_takes_numpy_values_and_declared_defaults():
  assert contract.problem(_step()) is None
  assert (
      contract.problem(
          _step(reward=np.float32(10.0), won=np.bool_(True), done=1, score=True)
      )
      is None
  )


def test_the_dense_reward_default_is_detectable_and_zero():
  """EnvStep.dense_reward's default is 0.0 to arithmetic, yet tells "not
  set" apart from a 0.0 given, also after a trip through a worker's pipe."""
  unset, given = _step(), _step(dense_reward=0.0)
  assert unset.dense_reward == 0.0 and unset.dense_reward + 1.5 == 1.5
  assert not base.sets_dense_reward(unset) and base.sets_dense_reward(given)
  assert not base.sets_dense_reward(pickle.loads(pickle.dumps(unset)))
  assert type(float(unset.dense_reward)) is float


# ------------------------------------------------------- VectorEnv, workers


NAN = (
    "environment 'key_env:NanReward': NanReward.step() on task 0 of"
    " 'train', turn 1, returned reward=nan; expected a finite number"
    f" {DOC}"
)
STR = (
    "environment 'key_env:StrReset': StrReset.reset() on task 0 of"
    " 'train', turn 0, returned a str ('You are in the hall. No key"
    f" here.'); expected a third_party_envs.base.EnvStep {DOC}"
)
LATE = (
    "environment 'key_env:LateNanReward': LateNanReward.step() on task 1"
    " of 'train', turn 2, returned reward=nan; expected a finite number"
    f" {DOC}"
)


@pytest.mark.parametrize("use_processes", [False, True])
def test_vector_env_stops_on_a_broken_contract(use_processes):
  """In-process and in a worker: the call raises EnvError, one line; the
  other instances' results are in first (no worker left waiting)."""
  for name, message in (
      ("key_env:NanReward", NAN),
      ("key_env:StrReset", STR),
      (
          "key_env:DictReset",
          "DictReset.reset() on task 0" " of 'train', turn 0, returned a dict",
      ),
  ):
    venv = VectorEnv(name, {}, 2, num_workers=1, use_processes=use_processes)
    try:
      with pytest.raises(EnvError) as e:
        venv.reset([0, 1])
        venv.step(["go hall", "go hall"])
      assert message in str(e.value) and "\n" not in str(e.value)
      assert venv.num_failures == 0  # a fault to fix, not a failure
    finally:
      venv.close()


def test_a_reward_outside_the_declared_range_warns_once(caplog):
  import key_env

  caplog.set_level(logging.WARNING, logger=contract.__name__)
  venv = VectorEnv("key_env:BigReward", {}, 2, use_processes=False)
  try:
    for _ in range(2):  # two wins each: one warning
      venv.reset([0, 1])
      venv.step([f"go {key_env.key_room('train', t)}" for t in (0, 1)])
      assert [s.reward for s in venv.step(["take key"] * 2)] == [100, 100]
  finally:
    venv.close()
  [warning] = [r.getMessage() for r in caplog.records]
  assert warning.startswith(
      "environment 'key_env:BigReward': BigReward.step() on task 0 of"
      " 'train', turn 2, returned reward=100.0, outside"
      " BigReward.reward_range=(0, 10)"
  )


def test_key_hunts_search_expert_wins_from_what_it_sees():
  """The 'search' expert (docs/custom_env.md's learning run) wins every
  task in <= 4 steps and its action is a function of the observation; the
  default expert still walks straight to the key."""
  import key_env

  env, seen = key_env.SearchingKeyHunt(), {}
  assert env.num_tasks("train") == env.num_tasks("valid_seen") == 64
  for task_id in range(64):
    step, turns = env.reset(task_id, "valid_seen"), 0
    while (action := env.expert_action()) is not None:
      assert seen.setdefault(step.observation, action) == action
      step, turns = env.step(action), turns + 1
    assert step.won and turns <= 4
  direct = key_env.KeyHunt()
  assert direct.num_tasks("train") == 16
  direct.reset(0)
  assert direct.expert_action() == f"go {key_env.key_room('train', 0)}"
  with pytest.raises(ValueError, match="expert='oracle'"):
    key_env.KeyHunt(expert="oracle")


# ------------------------------------------------------------ collections


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  texts = [
      prompts.build_prompt(
          "key_env:KeyHunt",
          "find the key",
          f"You are in the {r}.",
          ["go hall"],
          [],
          0,
      )
      for r in ("hall", "kitchen")
  ] * 10
  return models.train_tokenizer(texts, 300, str(tmp_path_factory.mktemp("tok")))


@pytest.mark.parametrize("play", [collect, collect_unbarriered])
@pytest.mark.parametrize("use_processes", [False, True])
def test_a_collection_stops_at_the_first_nan(tokenizer, play, use_processes):
  """Turn by turn or each episode on its own, in-process or in workers:
  task 1's NaN at turn 2 stops the collection with its one line."""
  name = "key_env:LateNanReward"
  venv = VectorEnv(name, {}, 4, num_workers=1, use_processes=use_processes)
  cfg = CollectConfig(env_name=name, max_steps=4, max_prompt_tokens=256)
  engine = ReplyEngine(tokenizer, "<think>x</think><action>go hall</action>")
  try:
    with pytest.raises(EnvError) as e:
      play(
          engine,
          venv,
          tokenizer,
          CollectRequest([0, 1], 2, SamplingParams(max_new_tokens=16)),
          cfg,
      )
  finally:
    venv.close()
  assert str(e.value) == LATE

  @exit_on_user_error
  def run():
    raise e.value

  with pytest.raises(SystemExit) as stop:  # what the launchers print
    run()
  assert str(stop.value) == f"error: {LATE}"


def test_the_warm_start_checks_the_contract_too():
  """The expert episodes (tokenizer, behaviour cloning) play the user
  environment outside any VectorEnv."""
  with pytest.raises(
      EnvError,
      match="StrReset.reset\\(\\) on task 0 of"
      " 'train', turn 0, returned a str",
  ):
    warm_start.expert_episodes(
        "key_env:StrReset", {}, range(2), split="train", max_steps=4
    )


def test_a_user_dense_reward_function_is_checked_too():
  from rspo_jax.types import StepRecord

  def half_nan(records):
    for r in records:
      r.dense_reward = math.nan if r.step_idx else 0.5

  records = [
      StepRecord(
          task_id=7,
          group_id=0,
          traj_id=0,
          step_idx=t,
          prompt_ids=None,
          response_ids=None,
          behavior_logp=None,
      )
      for t in range(2)
  ]
  with pytest.raises(EnvError) as e:
    contract.checked_dense_fn(half_nan, "mine:half_nan")(records)
  assert str(e.value) == (
      "rspo.dense_reward='mine:half_nan' set dense_reward=nan on a record of"
      " task 7, step 1; expected a finite number (docs/custom_env.md,"
      " section 3)"
  )


# ------------------------------------------------------------- at start


def _config(overrides: str):
  return config_base.make_config("toy", "grpo", overrides)


NO_DENSE = (
    "rspo.dense_reward=oracle trains Agent B on the environment's dense"
    " reward, but 'key_env:NoDenseReward' sets none (NoDenseReward.step()"
    " left EnvStep.dense_reward at its default in 2 steps of task 0):"
    " implement dense_reward (set EnvStep.dense_reward in"
    " NoDenseReward.step(); docs/custom_env.md, section 1), or set"
    " rspo.dense_reward=prm (or a function of yours, section 3), or rspo=0"
)


def test_rspo_on_an_environment_without_dense_reward_stops_at_start():
  with pytest.raises(ConfigError) as e:
    preflight.check_environment(_config("env.name=key_env:NoDenseReward"))
  assert str(e.value) == NO_DENSE
  for fine in (
      "rspo=0",
      "rspo.dense_reward=prm",
      "rspo.data_source=outcome",
      "rspo.dense_reward=spell_env:prefix_progress",
  ):
    preflight.check_environment(
        _config(f"env.name=key_env:NoDenseReward,{fine}")
    )
  preflight.check_environment(_config("env.name=key_env:KeyHunt"))


def test_the_probe_episode_finds_a_broken_contract_at_start():
  with pytest.raises(
      EnvError,
      match="NanReward.step\\(\\) on task 0 of"
      " 'train', turn 1, returned reward=nan",
  ):
    preflight.check_environment(_config("env.name=key_env:NanReward,rspo=0"))


def test_workdir_problems_are_one_line(tmp_path):
  afile = tmp_path / "afile"
  afile.write_text("")
  cases = {
      str(afile): f"--workdir={str(afile)!r} is a file, not a directory;",
      "/proc/rspo_run": "--workdir='/proc/rspo_run' is under /proc, the"
      " kernel's virtual filesystem",
      str(afile / "run"): f"--workdir={str(afile / 'run')!r} cannot be"
      " created or written (NotADirectoryError",
  }
  for workdir, message in cases.items():
    with pytest.raises(ConfigError) as e:
      preflight.check_workdir(workdir)
    assert str(e.value).startswith(message), str(e.value)
  preflight.check_workdir(str(tmp_path / "new" / "run"))
  assert (tmp_path / "new" / "run").is_dir()


def test_another_configurations_checkpoints_are_named_at_start(tmp_path):
  """A real orbax checkpoint of a GRPO run; RSPO started on its workdir
  stops before building anything, and the restore itself refuses it in
  one line too."""
  import jax.numpy as jnp
  from rspo_jax.checkpoint import RunCheckpointer

  grpo = _config("rspo=0")
  saved = dict(preflight.config_fingerprint(grpo), n_params=2)
  ckpt = RunCheckpointer(str(tmp_path / "checkpoints"))
  ckpt.save(3, {"policy": {"w": jnp.zeros(2)}}, {"fingerprint": saved})
  ckpt.close()
  preflight.check_workdir(str(tmp_path), grpo)  # the same config: resumes
  with pytest.raises(ConfigError) as e:
    preflight.check_workdir(str(tmp_path), _config(""))
  assert str(e.value) == (
      f"--workdir={str(tmp_path)!r} holds checkpoints of another"
      f" configuration ({tmp_path}/checkpoints/3: rspo False (now True)),"
      " which this run would resume; pass a new --workdir, or the"
      " configuration that wrote them"
  )
  ckpt = RunCheckpointer(str(tmp_path / "checkpoints"))
  try:
    with pytest.raises(
        ConfigError,
        match="was written by another"
        " configuration: .*; pass another --workdir",
    ):
      ckpt.restore(
          {"policy": {"w": jnp.zeros(2)}}, fingerprint=dict(saved, rspo=True)
      )
  finally:
    ckpt.close()


@pytest.mark.skipif(
    preflight.importlib.util.find_spec("wandb") is not None,
    reason="wandb is installed",
)
def test_a_missing_optional_package_is_one_line():
  with pytest.raises(MissingPackage) as e:
    preflight.check_packages(_config("metrics.wandb_project=mine"))
  assert str(e.value) == (
      "metrics.wandb_project='mine' logs to Weights & Biases, but wandb is"
      " not installed: pip install 'rspo_jax[wandb]' (or pip install"
      " wandb), or set metrics.wandb_project=''"
  )
  assert isinstance(e.value, ImportError)
  preflight.check_packages(_config(""))


# ---------------------------------------------------------------- the CLI


def _train(overrides: str, workdir: str, *flags, env=None):
  cmd = [
      sys.executable,
      os.path.join(ROOT, "launch", "train.py"),
      f"--config={ROOT}/configs/toy_grpo.py:{overrides}",
      f"--workdir={workdir}",
      "--no_progress",
      *flags,
  ]
  return subprocess.run(
      cmd,
      capture_output=True,
      text=True,
      timeout=300,
      env=dict(os.environ, XLA_FLAGS="", **(env or {})),
  )


@pytest.mark.parametrize(
    "overrides, workdir, line",
    [
        ("env.name=key_env:NanReward,rspo=0", "run", f"error: {NAN}"),
        ("env.name=key_env:StrReset", "run", f"error: {STR}"),
        ("env.name=key_env:NoDenseReward", "run", f"error: {NO_DENSE}"),
        (
            "env.name=key_env:KeyHunt",
            "/proc/rspo_run",
            "error: --workdir='/proc/rspo_run' is under /proc",
        ),
        (
            "env.name=key_env:KeyHunt,metrics.wandb_project=mine",
            "run",
            "error: metrics.wandb_project='mine' logs to Weights & Biases",
        ),
    ],
)
def test_train_stops_with_exit_1_and_one_line(
    tmp_path, overrides, workdir, line
):
  if "wandb" in overrides and preflight.importlib.util.find_spec("wandb"):
    pytest.skip("wandb is installed")
  out = _train(overrides, str(tmp_path / workdir))
  assert out.returncode == 1, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1].startswith(line)
  assert "Traceback" not in out.stderr


def test_debug_shows_the_traceback(tmp_path):
  afile = tmp_path / "afile"
  afile.write_text("")
  line = f"error: --workdir={str(afile)!r} is a file, not a directory"
  for how in (dict(flags=["--debug"]), dict(env={"RSPO_DEBUG": "1"})):
    out = _train(
        "env.name=key_env:KeyHunt",
        str(afile),
        *how.get("flags", []),
        env=how.get("env"),
    )
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "preflight.py" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(line)
