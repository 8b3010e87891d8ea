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
  env = {
      "RSPO_XLA_PLATFORM": "gpu",
      "XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION --xla_dump_to=d",
  }
  got = xla_flags.apply(env)
  flags = env["XLA_FLAGS"].split()
  assert got == {"XLA_FLAGS": env["XLA_FLAGS"]}
  assert flags[0] == "--xla_gpu_enable_latency_hiding_scheduler=true"
  assert flags[-2:] == [
      "--xla_gpu_enable_command_buffer=FUSION",
      "--xla_dump_to=d",
  ]
  assert "--xla_gpu_enable_command_buffer=" not in flags  # yours, once
  assert len(flags) == len(xla_flags.GPU) + 1


def test_platforms():
  tpu = {"RSPO_XLA_PLATFORM": "tpu", "LIBTPU_INIT_ARGS": "--x=1"}
  xla_flags.apply(tpu)
  assert tpu["LIBTPU_INIT_ARGS"].split() == [f for f, _ in xla_flags.TPU] + [
      "--x=1"
  ]
  assert "XLA_FLAGS" not in tpu
  for env in ({"RSPO_XLA_PLATFORM": "none"}, {"JAX_PLATFORMS": "cpu"}):
    assert xla_flags.apply(env) == {} and "XLA_FLAGS" not in env
  with pytest.raises(ValueError, match="RSPO_XLA_PLATFORM"):
    xla_flags.platform({"RSPO_XLA_PLATFORM": "cuda"})


def test_this_jaxlib_knows_the_gpu_flags_and_not_a_made_up_one():
  env = dict(
      os.environ, RSPO_XLA_PLATFORM="gpu", XLA_FLAGS="--xla_made_up_flag=1"
  )
  xla_flags.apply(env)
  assert xla_flags.check(env) == (
      "this jaxlib's XLA does not know the flag --xla_made_up_flag=1 in"
      " XLA_FLAGS (set in your XLA_FLAGS)"
  )
  env["XLA_FLAGS"] = " ".join(env["XLA_FLAGS"].split()[:-1])  # ours only
  assert xla_flags.check(env) is None


def test_train_stops_on_an_unknown_flag_with_one_line():
  env = dict(
      os.environ,
      RSPO_XLA_PLATFORM="gpu",
      JAX_PLATFORMS="cpu",
      XLA_FLAGS="--xla_made_up_flag=1",
  )
  proc = subprocess.run(
      [sys.executable, "launch/train.py", "--dry_run"],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      "error: this jaxlib's XLA does not know the flag --xla_made_up_flag=1"
      " in XLA_FLAGS (set in your XLA_FLAGS)"
  ]


def _fake_libtpu(tmp_path, names) -> str:
  """A stand-in library: the flag names as NUL-ended strings among other
  bytes, as a compiled library holds its flags' names."""
  path = tmp_path / "libtpu.so"
  path.write_bytes(
      b"\x7fELF\0junk\0"
      + b"".join(n.encode() + b"\0" for n in names)
      + b"more\0"
  )
  return str(path)


def test_tpu_flags_this_libtpu_does_not_know_are_dropped(tmp_path):
  """Every default TPU flag known, a made-up one of yours and a default
  the library lacks: those two dropped, one warning each, naming whose;
  the rest kept in order."""
  ours = [xla_flags.flag_name(f) for f, _ in xla_flags.TPU]
  lib = _fake_libtpu(tmp_path, ours[1:] + ["xla_tpu_other"])
  env = {
      "RSPO_XLA_PLATFORM": "tpu",
      "TPU_LIBRARY_PATH": lib,
      "LIBTPU_INIT_ARGS": "--xla_tpu_made_up_flag=1 --xla_tpu_other=2",
  }
  xla_flags.apply(env)
  warnings = xla_flags.check_tpu(env)
  assert env["LIBTPU_INIT_ARGS"].split() == [
      f for f, _ in xla_flags.TPU[1:]
  ] + ["--xla_tpu_other=2"]
  assert warnings == [
      f"this libtpu does not know {xla_flags.TPU[0][0]}: dropped from"
      " LIBTPU_INIT_ARGS (one of launch/xla_flags.py's TPU defaults)",
      "this libtpu does not know --xla_tpu_made_up_flag=1: dropped from"
      " LIBTPU_INIT_ARGS (set in your LIBTPU_INIT_ARGS)",
  ]
  # A name that is only the start of a known one is not known.
  assert not xla_flags.library_knows(lib)("xla_tpu_oth")


def test_tpu_flags_go_unchecked_without_a_libtpu(tmp_path):
  env = {
      "LIBTPU_INIT_ARGS": "--xla_tpu_made_up_flag=1",
      "TPU_LIBRARY_PATH": str(tmp_path / "absent.so"),
  }
  assert xla_flags.libtpu_path(env) is None
  assert xla_flags.check_tpu(env) == [
      "no libtpu found (TPU_LIBRARY_PATH, the libtpu package):"
      " LIBTPU_INIT_ARGS left unchecked"
  ]
  assert env["LIBTPU_INIT_ARGS"] == "--xla_tpu_made_up_flag=1"
  known = {"xla_a"}
  assert xla_flags.check_tpu(
      {"LIBTPU_INIT_ARGS": "--xla_a=1 --xla_b"}, known.__contains__
  ) == [
      "this libtpu does not know --xla_b: dropped from LIBTPU_INIT_ARGS"
      " (set in your LIBTPU_INIT_ARGS)"
  ]


def test_train_drops_an_unknown_tpu_flag_with_a_warning(tmp_path):
  """launch/train.py on a 'TPU' host (the fake library): the dry run goes
  on, warning about the made-up flag."""
  lib = _fake_libtpu(
      tmp_path, [xla_flags.flag_name(f) for f, _ in xla_flags.TPU]
  )
  env = dict(
      os.environ,
      RSPO_XLA_PLATFORM="tpu",
      JAX_PLATFORMS="cpu",
      TPU_LIBRARY_PATH=lib,
      LIBTPU_INIT_ARGS="--xla_tpu_made_up=1",
  )
  proc = subprocess.run(
      [sys.executable, "launch/train.py", "--dry_run"],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert (
      "this libtpu does not know --xla_tpu_made_up=1: dropped from"
      " LIBTPU_INIT_ARGS (set in your LIBTPU_INIT_ARGS)"
  ) in proc.stderr
