"""The launchers' XLA flags (launch/xla_flags.py): which host gets which,
yours win, and a flag this jaxlib does not know stops launch/train.py with
one line."""

import os
import subprocess
import sys

import pytest

from rspo_launch import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_flags_go_first_and_yours_win():
  env = {"RSPO_XLA_PLATFORM": "gpu",
         "XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION --xla_dump_to=d"}
  got = xla_flags.apply(env)
  flags = env["XLA_FLAGS"].split()
  assert got == {"XLA_FLAGS": env["XLA_FLAGS"]}
  assert flags[0] == "--xla_gpu_enable_latency_hiding_scheduler=true"
  assert flags[-2:] == ["--xla_gpu_enable_command_buffer=FUSION",
                        "--xla_dump_to=d"]
  assert "--xla_gpu_enable_command_buffer=" not in flags  # yours, once
  assert len(flags) == len(xla_flags.GPU) + 1


def test_platforms():
  tpu = {"RSPO_XLA_PLATFORM": "tpu", "LIBTPU_INIT_ARGS": "--x=1"}
  xla_flags.apply(tpu)
  assert tpu["LIBTPU_INIT_ARGS"].split() == [f for f, _ in xla_flags.TPU] + [
      "--x=1"]
  assert "XLA_FLAGS" not in tpu
  for env in ({"RSPO_XLA_PLATFORM": "none"}, {"JAX_PLATFORMS": "cpu"}):
    assert xla_flags.apply(env) == {} and "XLA_FLAGS" not in env
  with pytest.raises(ValueError, match="RSPO_XLA_PLATFORM"):
    xla_flags.platform({"RSPO_XLA_PLATFORM": "cuda"})


def test_this_jaxlib_knows_the_gpu_flags_and_not_a_made_up_one():
  env = dict(os.environ, RSPO_XLA_PLATFORM="gpu",
             XLA_FLAGS="--xla_made_up_flag=1")
  xla_flags.apply(env)
  assert xla_flags.check(env) == (
      "this jaxlib's XLA does not know the flag --xla_made_up_flag=1 in"
      " XLA_FLAGS (set in your XLA_FLAGS)")
  env["XLA_FLAGS"] = " ".join(env["XLA_FLAGS"].split()[:-1])  # ours only
  assert xla_flags.check(env) is None


def test_train_stops_on_an_unknown_flag_with_one_line():
  env = dict(os.environ, RSPO_XLA_PLATFORM="gpu", JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_made_up_flag=1")
  proc = subprocess.run(
      [sys.executable, "launch/train.py", "--dry_run"], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      "error: this jaxlib's XLA does not know the flag --xla_made_up_flag=1"
      " in XLA_FLAGS (set in your XLA_FLAGS)"]
