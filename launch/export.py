r"""Exports a run's latest policy A as a Hugging Face directory.

  python launch/export.py --config=<the run's --config> --workdir=runs/x \
      --out=DIR [--max_bytes=N]

Writes DIR (config.json, model.safetensors in the params' dtype, the run's
tokenizer, export.json; rspo_jax/policy_export.py), which
``model.checkpoint_dir=DIR`` evaluates or trains from. Prints one JSON line
({'exported', 'bytes', 'step', 'a_steps'}); over ``--max_bytes`` of params
nothing is written ('exported': false, status 0).
"""

import json
import logging
import os

from absl import app, flags
from ml_collections import config_flags

from configs import base as config_base

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "The run's config (its run.json --config).",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")
_OUT = flags.DEFINE_string("out", None, "HF directory to write.")
_MAX_BYTES = flags.DEFINE_integer(
    "max_bytes", None, "Do not export params larger than this (bytes)."
)


def main(argv):
  del argv
  logging.basicConfig(level=logging.INFO)
  cfg = _CONFIG.value
  if cfg is None or not _WORKDIR.value or not _OUT.value:
    raise app.UsageError("--config, --workdir and --out are required")
  config_base.validate(cfg)
  from rspo_jax import policy_export

  info = policy_export.export_latest_policy(
      cfg,
      os.path.abspath(_WORKDIR.value),
      os.path.abspath(_OUT.value),
      max_bytes=_MAX_BYTES.value,
  )
  print(json.dumps(info), flush=True)


def cli():
  """The ``rspo-export`` console script."""
  from rspo_launch import run_absl

  run_absl(main, __name__)


if __name__ == "__main__":
  cli()
