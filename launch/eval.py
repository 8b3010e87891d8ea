r"""Evaluates a policy on a fixed split: success rate and score (JSON out).

  # the latest checkpoint of a training run
  python launch/eval.py --config=configs/webshop_grpo.py --workdir=runs/x
  # a Hugging Face model directory (safetensors + tokenizer)
  python launch/eval.py \
      --config=configs/webshop_grpo.py:model.checkpoint_dir=DIR
  # several seeds at temperature 0.4 (the paper's evaluation decoding)
  python launch/eval.py --config=... --workdir=runs/x --seeds=0,1,2 \
      --temperature=0.4 --num_tasks=200 --out=eval.json
"""

import json
import logging

from absl import app, flags
from ml_collections import config_flags

from configs import base as config_base
from rspo_launch import check_inputs

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (its latest checkpoint is evaluated)."
)
_SPLIT = flags.DEFINE_string("split", None, "Split (default: env.eval_split).")
_SEEDS = flags.DEFINE_string("seeds", "0", "Comma-separated decoding seeds.")
_TEMPERATURE = flags.DEFINE_float(
    "temperature", None, "0 = greedy (default: rollout.eval_temperature)."
)
_NUM_TASKS = flags.DEFINE_integer(
    "num_tasks", None, "Tasks of the split (default: env.num_eval_tasks)."
)
_OUT = flags.DEFINE_string("out", None, "Write the JSON result here too.")


def main(argv):
  del argv
  logging.basicConfig(level=logging.INFO)
  cfg = _CONFIG.value
  if cfg is None:
    raise app.UsageError("--config is required")
  with cfg.unlocked():
    if _SPLIT.value:
      cfg.env.eval_split = _SPLIT.value
    if _TEMPERATURE.value is not None:
      cfg.rollout.eval_temperature = _TEMPERATURE.value
    if _NUM_TASKS.value:
      cfg.env.num_eval_tasks = _NUM_TASKS.value
  config_base.validate(cfg)  # --config.<key>=... bypassed get_config's
  check_inputs(cfg, _WORKDIR.value)
  from rspo_jax import build, compile_cache

  workdir = _WORKDIR.value or cfg.workdir
  compile_cache.enable(compile_cache.cache_dir(cfg, workdir))
  run = build.build_run(cfg, workdir, progress=False)
  try:
    resumed = run.trainer.try_resume()
    seeds = [int(s) for s in _SEEDS.value.split(",") if s.strip()]
    result = run.evaluate(run.trainer.a, run.trainer.state.a_steps, seeds=seeds)
    result.update(
        split=cfg.env.eval_split,
        a_steps=run.trainer.state.a_steps,
        from_checkpoint=resumed,
        temperature=float(cfg.rollout.eval_temperature),
    )
  finally:
    run.close()
  text = json.dumps(result, indent=1)
  print(text)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write(text)


def cli():
  """The ``rspo-eval`` console script."""
  from rspo_launch import run_absl

  run_absl(main, __name__)


if __name__ == "__main__":
  cli()
