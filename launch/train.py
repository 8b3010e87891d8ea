r"""Trains an agent with RSPO (or a base algorithm) from a config file.

  python launch/train.py                                  # embedded default
  python launch/train.py --config=configs/webshop_grpo.py
  python launch/train.py --config=configs/webshop_grpo.py:rspo=0,seed=200
  python launch/train.py --config=configs/alfworld_gigpo.py:model=qwen2.5-7b \
      --mesh=configs/mesh/gpu16.py --dry_run

The run lives in ``--workdir`` (default: the config's ``workdir``); started
again with the same workdir it resumes from the latest checkpoint. SIGTERM
(preemption) finishes the step in progress, checkpoints it and exits with
143 (rspo_jax/preemption.py).

Multi-host: start one copy per host (``srun``, ``--worker=all``, a JobSet)
with ``RSPO_COORDINATOR`` / ``RSPO_NUM_PROCESSES`` / ``RSPO_PROCESS_ID`` or a
detected cluster (docs/scale_out.md) and a ``--workdir`` on a filesystem all
hosts share. Every process trains and evaluates its share; only process 0
writes ``eval_*.json`` and metrics and prints.
"""

import json
import logging
import os

from absl import flags
from ml_collections import config_flags
from rspo_launch import check_inputs

_DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "configs", "webshop_grpo.py",
)
_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEFAULT_CONFIG, "Experiment config file (file.py:overrides).",
    lock_config=True,
)
_MESH = config_flags.DEFINE_config_file(
    "mesh", None, "Optional mesh config (configs/mesh/*.py).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Print the resolved plan and exit without training."
)
_NO_PROGRESS = flags.DEFINE_bool("no_progress", False, "Hide progress bars.")


def main(argv):
  del argv
  logging.basicConfig(level=logging.INFO,
                      format="%(asctime)s %(levelname)s %(message)s")
  cfg = _CONFIG.value
  if _MESH.value is not None:
    with cfg.unlocked():  # shape, and hosts x devices for the plan
      cfg.mesh.update(_MESH.value)
      cfg.mesh.shape = tuple(_MESH.value.shape)
  from configs import base as config_base

  config_base.validate(cfg)  # again: --config.<key>=... bypassed get_config's
  workdir = _WORKDIR.value or cfg.workdir
  if _DRY_RUN.value:
    from rspo_jax import plan

    print(plan.describe(cfg, workdir))
    return
  check_inputs(cfg)  # paths and servers exist
  from rspo_jax import build, compile_cache, distributed, preemption

  # Before anything compiles: a restart reads its programs back.
  compile_cache.enable(compile_cache.cache_dir(cfg, workdir))
  distributed.initialize()  # multi-host: SLURM / TPU / RSPO_* env; else no-op
  leader = distributed.is_leader()
  if not leader:  # one log for the job
    logging.getLogger().setLevel(logging.WARNING)
  run = build.build_run(cfg, workdir, progress=not _NO_PROGRESS.value)
  run.trainer.stop.install()  # SIGTERM: checkpoint, then exit 143
  try:
    resumed = run.trainer.try_resume()
    start_eval_path = os.path.join(workdir, "eval_start.json")
    # Every process evaluates (its share) or none does.
    missing = distributed.global_max(
        int(not os.path.exists(start_eval_path)))
    if missing:
      start = run.evaluate(run.trainer.a, 0)
      if leader:
        _write_json(start_eval_path, start)
      run.trainer.metrics.write(0, "eval", start)
      distributed.barrier("rspo_eval_start")
    start = json.load(open(start_eval_path))
    if not (missing or resumed or _has_start_row(workdir)):
      # given (bench/reproduce.py's shared evaluation); a restart before
      # the first checkpoint finds its own row already written
      run.trainer.metrics.write(0, "eval", start)
    logging.info("start of RL: success %.3f, score %.3f (resumed: %s)",
                 start["success_rate"], start["score"], resumed)
    try:
      run.trainer.run(evaluate=run.evaluate)
    except preemption.Preempted as e:
      logging.warning("%s", e)
      raise SystemExit(preemption.EXIT_CODE) from None
    final = run.evaluate(run.trainer.a, run.trainer.state.a_steps)
    run.trainer.metrics.write(run.trainer.state.a_steps, "eval", final)
    if leader:
      _write_json(os.path.join(workdir, "eval_final.json"), final)
      print(json.dumps({"start": start, "final": final}, indent=1))
  finally:
    run.close()


def _has_start_row(workdir) -> bool:
  """Whether metrics.jsonl already has the start evaluation (step 0)."""
  from rspo_jax.metrics import read_metrics

  path = os.path.join(workdir, "metrics.jsonl")
  return os.path.exists(path) and any(
      r["step"] == 0 for r in read_metrics(path, "eval"))


def _write_json(path, obj):
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1)
  os.replace(tmp, path)


def cli():
  """The ``rspo-train`` console script."""
  from rspo_launch import run_absl

  run_absl(main, __name__)


if __name__ == "__main__":
  cli()
