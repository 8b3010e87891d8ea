r"""Warm start: supervised fine-tuning on expert episodes (or your JSONL).

  # the environment's scripted expert (what the embedded default does)
  python launch/sft.py --config=configs/webshop_grpo.py --workdir=runs/x
  # your own trajectories: one JSON object per line,
  #   {"prompt": "<user message>",
  #    "response": "<think>..</think><action>..</action>"}
  python launch/sft.py --config=... --workdir=runs/x --jsonl=trajs.jsonl

Writes ``<workdir>/warm_start`` (HF safetensors + tokenizer), which
``launch/train.py`` picks up as its starting policy. A config whose
``model.checkpoint_dir`` is a committed warm start (CPU WebShop's default,
configs/warm_starts/) is cloned afresh: that directory is what this makes.
"""

import json
import logging
import os

from absl import app, flags
from ml_collections import config_flags

from configs import base as config_base
from rspo_jax.errors import ConfigError
from rspo_launch import check_inputs

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")
_JSONL = flags.DEFINE_string("jsonl", None, "Trajectories to clone instead.")


def main(argv):
  del argv
  logging.basicConfig(level=logging.INFO)
  cfg = _CONFIG.value
  if cfg is None:
    raise app.UsageError("--config is required")
  config_base.validate(cfg)  # --config.<key>=... bypassed get_config's
  if cfg.model.checkpoint_dir in config_base.scales.WARM_START_PRESET:
    with cfg.unlocked():  # clone what configs/warm_starts/*/MAKE.txt did
      cfg.model.checkpoint_dir, cfg.sft.enabled = "", True
  check_inputs(cfg)
  if _JSONL.value and not os.path.isfile(_JSONL.value):
    raise ConfigError(
        f"--jsonl={_JSONL.value!r}: no such file; pass"
        " --jsonl=<a JSONL file of {prompt, response} lines>"
    )
  from rspo_jax import build, models, sharding, warm_start
  from rspo_jax.metrics import MetricsWriter

  workdir = _WORKDIR.value or cfg.workdir
  os.makedirs(workdir, exist_ok=True)
  mesh = sharding.make_mesh(tuple(cfg.mesh.shape))
  tokenizer, tok_dir = build.make_tokenizer(cfg, workdir)
  if not _JSONL.value:
    build.warm_started_policy(
        cfg, tokenizer, tok_dir, mesh, workdir, MetricsWriter(workdir)
    )
  else:
    records = warm_start.jsonl_records(_JSONL.value, tokenizer)
    mcfg = build.model_config(cfg, tokenizer)
    module = models.create_model(mcfg, seed=cfg.seed)
    from rspo_jax import train_step as ts

    learner = build.make_policy_learner(
        cfg,
        module,
        mesh,
        lr=cfg.sft.lr,
        loss_fn=ts.make_sft_loss(cfg.sft.prompt_loss_weight),
    )
    curve = warm_start.train_sft(
        learner,
        records,
        steps=cfg.sft.steps,
        batch_rows=cfg.sft.batch_rows,
        seed=cfg.seed,
        metrics_writer=MetricsWriter(workdir),
    )
    models.save_hf_model(
        learner.module(),
        mcfg,
        os.path.join(workdir, "warm_start"),
        tokenizer_dir=tok_dir,
    )
    print(json.dumps({"final_nll": curve[-1], "rows": len(records)}))
  print(f"warm start written to {os.path.join(workdir, 'warm_start')}")


def cli():
  """The ``rspo-sft`` console script."""
  from rspo_launch import run_absl

  run_absl(main, __name__)


if __name__ == "__main__":
  cli()
