"""Environment steps per second, both environments: one JSON line per
(environment, batch size).

  python bench/envs.py [--batch_sizes=1,16,128] [--envs=webshop,alfworld]

Runs ``bench/envs_webshop.py`` and ``bench/envs_alfworld.py`` (each can also
be run alone with its own flags); see their docstrings for the policy used.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch_sizes", default="1,16,128")
  p.add_argument("--envs", default="webshop,alfworld")
  args = p.parse_args(argv)
  rc = 0
  for env in args.envs.split(","):
    script = os.path.join(HERE, f"envs_{env}.py")
    if not os.path.exists(script):
      raise SystemExit(f"unknown environment {env!r}: no {script}")
    rc |= subprocess.call(
        [sys.executable, script, f"--batch_sizes={args.batch_sizes}"]
    )
  return rc


if __name__ == "__main__":
  sys.exit(main())
