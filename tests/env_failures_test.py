"""An environment that raises: told once per kind, and the run stops.

``VectorEnv`` logs the first failure of each kind (exception type and
raising frame) with its task id and traceback, and appends it to its
``error_log``; ``collect.check_failures`` (and ``evaluate`` with
``max_failed_frac``) stop with one line past
``rollout.max_failed_episode_frac``.
"""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from rspo_jax import models
from rspo_jax.evaluate import evaluate
from rspo_jax.rollout import prompts
from rspo_jax.rollout.collect import (
    CollectConfig,
    CollectRequest,
    TooManyFailures,
    check_failures,
    collect,
)
from rspo_jax.rollout.engine import Engine, GenerationResult, SamplingParams
from rspo_launch import exit_on_user_error
from third_party_envs import failures, toy
from third_party_envs.vector import VectorEnv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRASH = "<think>x</think><action>crash</action>"  # the toy's hidden hook
LOGGER = "third_party_envs.failures"


class StepRaises(toy.ToyEnv):
  """The toy, except that ``step`` raises on any action the scripted
  expert did not just give: the warm start learns as usual, the policy's
  every episode fails."""

  name = "step_raises"
  _expert = None

  def expert_action(self):
    self._expert = super().expert_action()
    return self._expert

  def step(self, action):
    if action != self._expert:
      raise RuntimeError(f"step is broken (action {action!r})")
    return super().step(action)


class ReplyEngine(Engine):
  """Answers ``reply`` to every prompt (log-probs -1)."""

  def __init__(self, tokenizer, reply):
    self.ids = tokenizer.encode(reply, add_special_tokens=False)

  @property
  def weight_version(self):
    return 0

  def update_weights(self, params_or_path, version):
    pass

  def generate(self, prompts_, params):
    return [
        GenerationResult(
            np.asarray(self.ids, np.int32),
            np.full(len(self.ids), -1.0, np.float32),
            "stop",
        )
        for _ in prompts_
    ]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  texts = [
      prompts.build_prompt(
          "toy",
          f"reach the number {t}",
          f"The current number is {x}.",
          ["inc", "dec"],
          [],
          0,
      )
      for t in range(10)
      for x in range(10)
  ] + [CRASH] * 20
  return models.train_tokenizer(texts, 300, str(tmp_path_factory.mktemp("tok")))


def _warnings(caplog):
  return [
      r.getMessage()
      for r in caplog.records
      if r.name == LOGGER and r.levelno == logging.WARNING
  ]


# ----------------------------------------------------------------- kinds


def test_kind_is_the_exception_type_and_the_raising_frame():
  def tb(line, message):
    return (
        "Traceback (most recent call last):\n"
        '  File "/x/vector.py", line 64, in _run_item\n'
        "    return slot, envs[slot].step(item[1]), None\n"
        f'  File "/u/env.py", line {line}, in step\n'
        "    raise RuntimeError(...)\n"
        f"RuntimeError: {message}\n"
    )

  assert failures.error_kind(tb(7, "task 1")) == (
      'RuntimeError at File "/u/env.py", line 7, in step'
  )
  assert failures.error_kind(tb(7, "task 2")) == failures.error_kind(
      tb(7, "task 1")
  )  # another message, same kind
  assert failures.error_kind(tb(9, "task 1")) != failures.error_kind(
      tb(7, "task 1")
  )  # another line raises: another kind
  assert failures.last_line(tb(7, "task 1")) == "RuntimeError: task 1"
  # A worker fault has no traceback: its numbers are blanked.
  worker = "VectorEnv worker {} failed (toy): no reply within 60 s"
  assert failures.error_kind(worker.format(0)) == failures.error_kind(
      worker.format(3)
  )


# ----------------------------------------------------------- VectorEnv


@pytest.mark.parametrize("use_processes", [False, True])
def test_first_failure_of_each_kind_is_logged_once_and_written(
    tmp_path, caplog, use_processes
):
  caplog.set_level(logging.WARNING, logger=LOGGER)
  path = str(tmp_path / "run" / "env_errors.log")
  venv = VectorEnv(
      "toy", {}, 3, num_workers=1, use_processes=use_processes, error_log=path
  )
  try:
    venv.reset([0, 1, 2])
    venv.step(["crash", "crash", "inc"])  # two episodes, one kind
    venv.reset([5, 999, None], split="valid_seen")  # a second kind
    venv.step(["crash", None, None])  # the first kind again
  finally:
    venv.close()
  assert venv.num_failures == 4
  logged = _warnings(caplog)
  assert len(logged) == 2
  assert "environment 'toy' failed an episode (task 0 of 'train')" in (
      logged[0]
  )
  assert "RuntimeError: ToyEnv: 'crash' test action" in logged[0]
  assert "task 999 of 'valid_seen'" in logged[1]
  assert "ValueError: task_id 999 out of range" in logged[1]
  assert all(f"(also in {path})" in m for m in logged)
  text = open(path).read()
  assert text.count("--- ") == 2 and "Traceback" in text
  assert failures.last_line(venv.first_error) == (
      "RuntimeError: ToyEnv: 'crash' test action"
  )


# ------------------------------------------------------- the share check


def test_check_failures_stops_past_the_limit_in_one_line():
  error = 'Traceback ...\n  File "e.py", line 3, in step\nKeyError: 7\n'
  check_failures({"failed_episodes": 2, "episodes": 4}, 0.5, "toy", error)
  check_failures({"failed_episodes": 4, "episodes": 4}, 1.0, "toy", error)
  check_failures({"failed_episodes": 0, "episodes": 0}, 0.0, "toy")
  with pytest.raises(TooManyFailures) as e:
    check_failures({"failed_episodes": 3, "episodes": 4}, 0.5, "pkg:Env", error)
  assert str(e.value) == (
      "environment 'pkg:Env' failed 3 of 4 episodes of a collection, more"
      " than rollout.max_failed_episode_frac=0.5; first error: KeyError: 7"
      " (its traceback is logged above); fix the environment or raise"
      " rollout.max_failed_episode_frac"
  )

  @exit_on_user_error
  def run():
    check_failures({"failed_episodes": 3, "episodes": 3}, 0.5, "toy")

  with pytest.raises(SystemExit) as e:  # what the launchers print
    run()
  assert str(e.value).startswith("error: environment 'toy' failed 3 of 3")
  assert "\n" not in str(e.value)


def test_a_collection_whose_every_step_raises(tokenizer, caplog):
  caplog.set_level(logging.WARNING, logger=LOGGER)
  venv = VectorEnv("toy", {}, 4, use_processes=False)
  cfg = CollectConfig(env_name="toy", max_steps=3, max_prompt_tokens=256)
  try:
    records, stats = collect(
        ReplyEngine(tokenizer, CRASH),
        venv,
        tokenizer,
        CollectRequest([0, 1], 2, SamplingParams(max_new_tokens=16)),
        cfg,
    )
  finally:
    venv.close()
  assert (stats["failed_episodes"], stats["episodes"]) == (4, 4)
  assert all(r.failed for r in records)
  assert len(_warnings(caplog)) == 1  # four failures, one kind
  with pytest.raises(
      TooManyFailures,
      match="failed 4 of 4 episodes .* first"
      " error: RuntimeError: ToyEnv: 'crash' test action",
  ):
    check_failures(stats, 0.5, "toy", venv.first_error)


def test_evaluation_stops_on_a_broken_environment(tokenizer):
  venv = VectorEnv("toy", {}, 2, use_processes=False)
  cfg = CollectConfig(
      env_name="toy", max_steps=3, max_prompt_tokens=256, split="valid_seen"
  )
  engine = ReplyEngine(tokenizer, CRASH)
  try:
    out = evaluate(engine, venv, tokenizer, cfg, [0, 1, 2])  # no limit
    assert out["success_rate"] == 0.0
    with pytest.raises(TooManyFailures, match="failed 3 of 3 episodes"):
      evaluate(engine, venv, tokenizer, cfg, [0, 1, 2], max_failed_frac=0.5)
  finally:
    venv.close()


# ------------------------------------------------------------- the CLI


@pytest.mark.slow
def test_train_cli_with_a_raising_env_exits_1_with_one_line(tmp_path):
  """launch/train.py on ``StepRaises``: the warm start runs, the start
  evaluation's episodes all fail -> one ``error:`` line, status 1, and
  the traceback in the log and in ``<workdir>/env_errors.log``."""
  from custom_env_test import MICRO

  workdir = str(tmp_path / "run")
  env = dict(
      os.environ,
      XLA_FLAGS="",
      PYTHONPATH=os.pathsep.join(
          [os.path.join(ROOT, "tests")]
          + [p for p in [os.environ.get("PYTHONPATH")] if p]
      ),
  )
  out = subprocess.run(
      [
          sys.executable,
          os.path.join(ROOT, "launch", "train.py"),
          f"--config={ROOT}/configs/toy_grpo.py:{MICRO},"
          "env.name=env_failures_test:StepRaises",
          f"--workdir={workdir}",
          "--no_progress",
      ],
      capture_output=True,
      text=True,
      env=env,
      timeout=600,
  )
  assert out.returncode == 1, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(
      "error: environment 'env_failures_test:StepRaises'"
      " failed 4 of 4 episodes"
  ), last
  assert "RuntimeError: step is broken" in last
  assert "rollout.max_failed_episode_frac=0.5" in last
  assert "Traceback" in out.stderr  # the WARNING, once
  assert out.stderr.count("first failure of this kind") == 1
  log = open(os.path.join(workdir, "env_errors.log")).read()
  assert "RuntimeError: step is broken" in log
  assert not os.path.exists(os.path.join(workdir, "eval_start.json"))
