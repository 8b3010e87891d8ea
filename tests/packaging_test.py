"""The package: a wheel built from the checkout's package files, installed
into a fresh venv, runs its console scripts from outside the checkout.

The fresh venv gets the wheel with ``--no-deps`` and reaches the
dependencies already installed for this interpreter through a ``.pth`` line
(its site-packages directory; the ``.pth`` files in there, such as this
checkout's editable install, are not processed), so nothing is downloaded
but the build backend (setuptools, as pip's build isolation does).
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the wheel is built from: pyproject.toml's packages and its readme.
SOURCES = (
    "pyproject.toml",
    "README.md",
    "rspo_jax",
    "third_party_envs",
    "configs",
    "launch",
)
PACKAGES = {
    "rspo_jax": "rspo_jax",
    "third_party_envs": "third_party_envs",
    "configs": "configs",
    "launch": "rspo_launch",
}
SCRIPTS = (
    "rspo-train",
    "rspo-eval",
    "rspo-export",
    "rspo-sft",
    "rspo-train-prm",
    "rspo-serve-rollout",
    "rspo-plot",
)


def test_every_launch_cli_is_a_console_script():
  """Each launch/*.py with a ``cli()`` (run_absl's entry point) is one of
  pyproject.toml's console scripts, and SCRIPTS names them all (cheap: no
  wheel built). launch/export.py had a cli() and no script."""
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    scripts = tomllib.load(f)["project"]["scripts"]
  targets = set(scripts.values())
  for path in sorted(glob.glob(os.path.join(ROOT, "launch", "*.py"))):
    with open(path) as f:
      if "\ndef cli():" in f.read():
        module = os.path.splitext(os.path.basename(path))[0]
        assert f"rspo_launch.{module}:cli" in targets, module
  assert sorted(SCRIPTS) == sorted(scripts)


def _run(cmd, **kw):
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
  assert out.returncode == 0, (cmd, out.stdout[-2000:], out.stderr[-3000:])
  return out


def _build_wheel(tmp_path) -> str:
  src = tmp_path / "src"
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
  src.mkdir()
  for name in SOURCES:
    path = os.path.join(ROOT, name)
    if os.path.isdir(path):
      shutil.copytree(path, src / name, ignore=ignore)
    else:
      shutil.copy(path, src / name)
  _run(
      [
          sys.executable,
          "-m",
          "pip",
          "wheel",
          "--no-deps",
          "-q",
          "-w",
          str(tmp_path / "dist"),
          str(src),
      ]
  )
  [wheel] = glob.glob(str(tmp_path / "dist" / "rspo_jax-*.whl"))
  return wheel


def _fresh_venv(path) -> str:
  """A venv whose own site-packages is empty but for a ``.pth`` line
  naming this interpreter's site-packages; returns its bin directory."""
  _run([sys.executable, "-m", "venv", str(path)])
  python = str(path / "bin" / "python")
  purelib = _run(
      [
          python,
          "-c",
          "import sysconfig; print(sysconfig" ".get_paths()['purelib'])",
      ]
  ).stdout.strip()
  with open(os.path.join(purelib, "_rspo_deps.pth"), "w") as f:
    f.write(sysconfig.get_paths()["purelib"] + "\n")
  return str(path / "bin")


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_runs_the_console_scripts(tmp_path):
  wheel = _build_wheel(tmp_path)
  # Every module of the checkout's packages is in the wheel.
  names = set(zipfile.ZipFile(wheel).namelist())
  for top, installed in PACKAGES.items():
    for path in glob.glob(
        os.path.join(ROOT, top, "**", "*.py"), recursive=True
    ):
      rel = os.path.relpath(path, os.path.join(ROOT, top))
      assert f"{installed}/{rel}" in names, (top, rel)
  bin_dir = _fresh_venv(tmp_path / "venv")
  _run(
      [
          os.path.join(bin_dir, "python"),
          "-m",
          "pip",
          "install",
          "-q",
          "--no-deps",
          "--no-index",
          wheel,
      ]
  )
  outside = tmp_path / "elsewhere"
  outside.mkdir()
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="")
  run = lambda *cmd: _run(list(cmd), cwd=outside, env=env)
  where = json.loads(
      run(
          os.path.join(bin_dir, "python"),
          "-c",
          "import json, os, configs, rspo_jax, rspo_launch, third_party_envs;"
          "print(json.dumps({m.__name__: os.path.dirname(m.__file__) for m in"
          " (configs, rspo_jax, rspo_launch, third_party_envs)}))",
      ).stdout
  )
  site = os.path.realpath(tmp_path / "venv")
  assert all(os.path.realpath(d).startswith(site) for d in where.values())
  for script in SCRIPTS:
    assert os.access(os.path.join(bin_dir, script), os.X_OK), script
  train = os.path.join(bin_dir, "rspo-train")
  usage = run(train, "--help").stdout
  assert usage.startswith("Trains an agent with RSPO")
  assert "--config:" in usage and "--[no]dry_run:" in usage
  toy = os.path.join(where["configs"], "toy_grpo.py")
  plan = json.loads(run(train, "--dry_run", f"--config={toy}:seed=3").stdout)
  assert (plan["env"], plan["workdir"]) == ("toy", "runs/toy_grpo")
  default = json.loads(run(train, "--dry_run").stdout)  # the installed
  assert default["env"] == "webshop"  # configs/webshop_grpo.py
  assert "--runs" in run(os.path.join(bin_dir, "rspo-plot"), "--help").stdout
