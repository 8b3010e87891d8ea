"""Errors a person reads (issue 19 item 4): every bad override, on either
``file.py:key=value`` or ``--config.key=value``, and a missing checkpoint,
tokenizer, run directory or SGLang server, end the real CLI with status 1
and one line on stderr naming the key, the bad value and what is accepted
or what to pass; no traceback."""

import json
import os
import socket
import subprocess
import sys

import pytest

from configs import base, toy_grpo
from rspo_jax.errors import ConfigError, did_you_mean

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "configs", "toy_grpo.py")


def _cli(script, *args):
  """(returncode, stdout, stderr) of ``python launch/<script> args``."""
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", script), *args],
      capture_output=True,
      text=True,
      timeout=300,
      cwd=ROOT,
      env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"),
  )
  return out.returncode, out.stdout, out.stderr


def _assert_one_line(script, args, *wanted):
  rc, stdout, stderr = _cli(script, *args)
  lines = [s for s in stderr.splitlines() if s.strip()]
  assert rc == 1 and not stdout.strip(), (rc, stdout, stderr)
  assert len(lines) == 1 and lines[0].startswith("error: "), stderr
  assert "Traceback" not in stderr
  for w in wanted:
    assert w in lines[0], (w, lines[0])
  return lines[0]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# ------------------------------------------------- file.py:key=value (train)


@pytest.mark.parametrize(
    "override, wanted",
    [
        (
            "rspo.alpah=0.1",
            [
                "unknown config key 'rspo.alpah'",
                "(did you mean 'rspo.alpha'?)",
                "rspo.alpah=0.1",
                "known keys of rspo: alpha, b_k_max, b_lift_tasks, b_lr,"
                " b_warmup_steps, b_win_multiple, centre_cap",
            ],
        ),
        (
            "rsop.alpha=0.1",
            [
                "'rsop.alpha'",
                "(did you mean 'rspo.alpha'?)",
                "known top-level keys: algo, env,",
            ],
        ),
        ("rspo.k=abc", ["'rspo.k' expects type int, got 'abc'"]),
        (
            "rspo.enabled=maybe",
            ["'rspo.enabled' wants a bool, got 'maybe'", "true/false"],
        ),
        (
            "env.name=webshp",
            [
                "env.name='webshp' (did you mean 'webshop'?)",
                "one of webshop, alfworld, toy, spell or an import" " path",
            ],
        ),
        (
            "algo.name=grpp",
            [
                "algo.name='grpp' (did you mean 'grpo'?)",
                "one of grpo, ppo, gigpo",
            ],
        ),
        (
            "rspo.dense_reward=orcale",
            [
                "rspo.dense_reward='orcale'",
                "(did you mean 'oracle'?)",
                "one of oracle, prm or an import path",
            ],
        ),
        (
            "rspo.sampling=rewrd",
            ["rspo.sampling='rewrd'", "one of reward, variance, random"],
        ),
        (
            "model=tinyy",
            [
                "unknown model preset 'tinyy'",
                "(did you mean 'tiny'?)",
                "known: nano, tiny,",
                "qwen2.5-7b",
            ],
        ),
        ("rspo.alpha=1.5", ["rspo.alpha=1.5", "wants 0 <= x < 1"]),
        ("nokey", ["'nokey' is not key=value"]),
    ],
)
def test_file_override_errors_are_one_line(override, wanted):
  _assert_one_line("train.py", [f"--config={TOY}:{override}"], *wanted)


# ------------------------------------------------ --config.key=value (train)


@pytest.mark.parametrize(
    "flag, wanted",
    [
        (
            "--config.rspo.alpah=0.1",
            [
                "no config field 'rspo.alpah'",
                "(did you mean 'rspo.alpha'?)",
                "--config.rspo.alpah=0.1",
                "known keys of rspo: alpha,",
            ],
        ),
        ("--config.foo=1", ["no config field 'foo'", "known top-level keys"]),
        ("--config.rspo.k=abc", ["'rspo.k' expects type int, got 'abc'"]),
        (
            "--config.env.name=webshp",
            ["env.name='webshp'", "one of webshop, alfworld, toy"],
        ),
        (
            "--config.model.preset=gpt5",
            ["model.preset='gpt5'", "one of nano, tiny,", "qwen2.5-7b"],
        ),
        (
            "--config.rollout.engine=vllm",
            ["rollout.engine='vllm'", "one of jax, sglang"],
        ),
    ],
)
def test_flag_override_errors_are_one_line(flag, wanted):
  _assert_one_line("train.py", [f"--config={TOY}", flag], *wanted)


def test_missing_config_file_is_one_line():
  _assert_one_line(
      "train.py",
      ["--config=configs/nope.py"],
      "--config=configs/nope.py: no such config file",
      "configs/webshop_grpo.py",
  )


# ------------------------------------------------ eval and sft take the same


def test_eval_and_sft_refuse_bad_overrides_alike():
  _assert_one_line(
      "eval.py",
      [f"--config={TOY}:rspo.sampling=best"],
      "rspo.sampling='best'",
      "one of reward, variance, random",
  )
  _assert_one_line(
      "sft.py",
      [f"--config={TOY}", "--config.rspo.k=x"],
      "'rspo.k' expects type int, got 'x'",
  )


# ------------------------------------------- paths and servers: what to pass


def test_missing_checkpoint_directory_says_what_to_pass(tmp_path):
  nope = str(tmp_path / "nope")
  _assert_one_line(
      "train.py",
      [f"--config={TOY}:model.checkpoint_dir={nope}"],
      f"model.checkpoint_dir='{nope}': no such directory",
      "pass model.checkpoint_dir=<a Hugging Face model",
  )


def test_checkpoint_without_tokenizer_says_what_to_pass(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({}))
  _assert_one_line(
      "eval.py",
      [f"--config={TOY}:model.checkpoint_dir={tmp_path}"],
      f"model.checkpoint_dir='{tmp_path}' holds no tokenizer",
      "pass model.tokenizer_dir=",
  )


def test_missing_eval_workdir_says_what_to_pass(tmp_path):
  _assert_one_line(
      "eval.py",
      [f"--config={TOY}", f"--workdir={tmp_path / 'nope'}"],
      "--workdir=",
      "no such directory",
      "model.checkpoint_dir=",
  )


def test_unreachable_sglang_server_says_what_to_pass():
  url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
  _assert_one_line(
      "train.py",
      [f"--config={TOY}:rollout.engine=sglang,rollout.server_urls={url}"],
      f"rollout.server_urls='{url}': no SGLang server answers at {url}",
      "sglang.launch_server",
      "rollout.server_urls=http://HOST:PORT",
  )
  _assert_one_line(
      "train.py",
      [f"--config={TOY}:rollout.engine=sglang"],
      "rollout.engine=sglang needs rollout.server_urls=",
  )


def test_train_prm_and_serve_rollout_name_missing_inputs(tmp_path):
  nope = str(tmp_path / "nope")
  _assert_one_line(
      "train_prm.py",
      [f"--backbone_dir={nope}", f"--trajectories={nope}", f"--out={tmp_path}"],
      f"--backbone_dir='{nope}'",
      "pass --backbone_dir=",
  )
  _assert_one_line(
      "serve_rollout.py",
      ["--preset", "tinyy"],
      "--preset='tinyy'",
      "(did you mean 'tiny'?)",
      "known: base-100m,",
  )
  _assert_one_line(
      "serve_rollout.py",
      ["--model_path", nope],
      f"--model_path='{nope}'",
      "--preset=",
  )


# ----------------------------------------------------- the helpers, directly


def test_did_you_mean_picks_the_closest_choice():
  assert did_you_mean("webshp", base.ENVS) == " (did you mean 'webshop'?)"
  assert did_you_mean("xyz", base.ENVS) == ""


def test_check_override_leaves_the_config_as_it_was():
  cfg = toy_grpo.get_config()
  base.check_override(cfg, "rspo.k", "3")
  base.check_override(cfg, "mesh.shape", "(1, 1, 1)")  # not a scalar: key
  assert cfg.rspo.k == toy_grpo.get_config().rspo.k
  with pytest.raises(ConfigError, match="'rspo.k' expects type int"):
    base.check_override(cfg, "rspo.k", "3.5")
  with pytest.raises(ConfigError, match="no config field 'rspo.kk'"):
    base.check_override(cfg, "rspo.kk", "3", what="no config field")


def test_import_path_that_does_not_resolve_is_one_line():
  _assert_one_line(
      "train.py",
      [f"--config={TOY}:env.name=no_such_mod:Env"],
      "env.name:",
      "'no_such_mod:Env'",
      "cannot import module 'no_such_mod'",
      "PYTHONPATH",
  )
