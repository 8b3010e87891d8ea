r"""Trains an agent with RSPO (or a base algorithm) from a config file.

  python launch/train.py                                  # embedded default
  python launch/train.py --config=configs/webshop_grpo.py
  python launch/train.py --config=configs/webshop_grpo.py:rspo=0,seed=200
  python launch/train.py --config=configs/alfworld_gigpo.py:model=qwen2.5-7b \
      --mesh=configs/mesh/gpu16.py --dry_run

The embedded default (configs/webshop_grpo.py at CPU scale) starts from the
committed warm start configs/warm_starts/webshop_nano (its MAKE.txt says how
it was made); ``:sft.enabled=True,model.checkpoint_dir=`` behaviour-clones
the policy at start instead (~20 minutes on 2 CPU cores).

The run lives in ``--workdir`` (default: the config's ``workdir``); started
again with the same workdir it resumes from the latest checkpoint. SIGTERM
(preemption) finishes the step in progress, checkpoints it and exits with
143 (rspo_jax/preemption.py).

On a GPU or TPU host the XLA flags of launch/xla_flags.py are set first
(each with its reason there; ``RSPO_XLA_PLATFORM=none`` leaves them out).

A mistake a person fixes ends the run with one line, ``error: ...``, and
status 1: a config key or value, a path, the workdir (a file, unwritable,
another configuration's checkpoints), an optional package the config needs,
an environment that breaks its contract (a NaN reward, ``reset()`` that
returns a string; rspo_jax/preflight.py, third_party_envs/contract.py).
``--debug`` (or ``RSPO_DEBUG=1``) shows its traceback too.

It ends with a summary (start -> end with a paired 95 % interval, where the
files are; also ``summary.txt``), per-task results in ``eval_start.json``
and ``eval_final.json`` and the learning curves in ``curves.png``. Library
logs (JAX, orbax, absl, ...) stay at WARNING; ``--log_level=info`` shows
them.

Multi-host: start one copy per host (``srun``, ``--worker=all``, a JobSet)
with ``RSPO_COORDINATOR`` / ``RSPO_NUM_PROCESSES`` / ``RSPO_PROCESS_ID`` or a
detected cluster (docs/scale_out.md) and a ``--workdir`` on a filesystem all
hosts share. Every process trains and evaluates its share; only process 0
writes ``eval_*.json`` and metrics and prints.
"""

import json
import logging
import os
import sys
import time

from absl import flags
from ml_collections import config_flags
from rspo_launch import check_inputs

_DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "configs",
    "webshop_grpo.py",
)
_CONFIG = config_flags.DEFINE_config_file(
    "config",
    _DEFAULT_CONFIG,
    "Experiment config file (file.py:overrides).",
    lock_config=True,
)
_MESH = config_flags.DEFINE_config_file(
    "mesh", None, "Optional mesh config (configs/mesh/*.py).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run",
    False,
    "Print the resolved plan (with the remat policy and"
    " prefill blocks it chose) and exit without training; a plan that does"
    " not fit the devices exits 1 with one line naming the key to change"
    " (as a run without --dry_run does, unless --allow_plan_overflow).",
)
_ALLOW_OVERFLOW = flags.DEFINE_bool(
    "allow_plan_overflow",
    False,
    "Run (or dry-run with exit 0) although"
    " the memory plan does not fit the devices; without it such a run"
    " stops at start with exit 1 and one line naming the key to change.",
)
_NO_PROGRESS = flags.DEFINE_bool("no_progress", False, "Hide progress bars.")
_DEBUG = flags.DEFINE_bool(
    "debug",
    False,
    "An error that ends the run with one line (a config"
    " value, the workdir, a missing package, the environment's contract)"
    " also shows its full traceback; so does RSPO_DEBUG=1.",
)
_LOG_LEVEL = flags.DEFINE_enum(
    "log_level",
    "warning",
    ["debug", "info", "warning", "error"],
    "Level of library logs (JAX, orbax, absl, rspo_jax); this script's own"
    " lines are always shown. info: every library's progress lines.",
)

log = logging.getLogger("rspo_launch.train")
CURVES = "curves.png"
SUMMARY = "summary.txt"


def main(argv):
  del argv
  began = time.monotonic()
  _quiet_libraries(_LOG_LEVEL.value)  # no JAX: the flags below come first
  _xla_flags()
  cfg = _CONFIG.value
  if _MESH.value is not None:
    with cfg.unlocked():  # shape, and hosts x devices for the plan
      cfg.mesh.update(_MESH.value)
      cfg.mesh.shape = tuple(_MESH.value.shape)
  from configs import base as config_base

  config_base.validate(cfg)  # again: --config.<key>=... bypassed get_config's
  workdir = _WORKDIR.value or cfg.workdir
  from rspo_jax import plan

  if _ALLOW_OVERFLOW.value:  # read by plan.resolve_run in every process
    os.environ[plan.ALLOW_ENV] = "1"
  if _DRY_RUN.value:
    p = plan.make_plan(cfg, workdir)
    print(json.dumps(p, indent=1))
    if p.get("stop"):  # one line naming the config key to change
      from rspo_jax.errors import ConfigError

      if p["stop_by"] == "memory" and plan.overflow_allowed(os.environ):
        log.warning(
            "the memory plan does not fit (%s given): %s",
            plan.ALLOW_FLAG,
            p["stop"],
        )
        return
      raise ConfigError(
          p["stop"]
          + (
              ""
              if p["stop_by"] != "memory"
              else f" ({plan.ALLOW_FLAG} runs it anyway)"
          )
      )
    return
  check_inputs(cfg)  # paths and servers exist
  from rspo_jax import preflight

  # The workdir, optional packages, a user environment's probe episode.
  preflight.check(cfg, workdir)
  from rspo_jax import build, compile_cache, distributed, preemption

  # Before anything compiles: a restart reads its programs back.
  compile_cache.enable(compile_cache.cache_dir(cfg, workdir))
  distributed.initialize()  # multi-host: SLURM / TPU / RSPO_* env; else no-op
  leader = distributed.is_leader()
  if not leader:  # one log for the job
    logging.getLogger().setLevel(logging.WARNING)
    log.setLevel(logging.WARNING)
  log.info(
      "run directory %s; starting from %s",
      workdir,
      cfg.model.checkpoint_dir or "behaviour cloning",
  )
  if cfg.model.lora_rank > 0:
    from rspo_jax.models import lora

    log.info("LoRA rank %d: %s", cfg.model.lora_rank, lora.lr_line(cfg))
  run = build.build_run(cfg, workdir, progress=not _NO_PROGRESS.value)
  run.trainer.stop.install()  # SIGTERM: checkpoint, then exit 143
  try:
    resumed = run.trainer.try_resume()
    start_eval_path = os.path.join(workdir, "eval_start.json")
    # Every process evaluates (its share) or none does.
    missing = distributed.global_max(int(not os.path.exists(start_eval_path)))
    if missing:
      log.info("evaluating the starting policy (%s split)", cfg.env.eval_split)
      start = run.evaluate(run.trainer.a, 0)
      if leader:
        _write_json(start_eval_path, start)
      run.trainer.metrics.write(0, "eval", start)
      distributed.barrier("rspo_eval_start")
    start = json.load(open(start_eval_path))
    if not (missing or resumed or _has_start_row(workdir)):
      # given (experiments/reproduce.py's shared evaluation); a restart before
      # the first checkpoint finds its own row already written
      run.trainer.metrics.write(0, "eval", start)
    log.info(
        "start of RL: success %.3f, score %.3f%s",
        start["success_rate"],
        start["score"],
        " (resumed)" if resumed else "",
    )
    try:
      run.trainer.run(evaluate=run.evaluate)
    except preemption.Preempted as e:
      log.warning("%s", e)
      raise SystemExit(preemption.EXIT_CODE) from None
    log.info("evaluating the trained policy (%s split)", cfg.env.eval_split)
    final = run.evaluate(run.trainer.a, run.trainer.state.a_steps)
    run.trainer.metrics.write(run.trainer.state.a_steps, "eval", final)
    if leader:
      _write_json(os.path.join(workdir, "eval_final.json"), final)
      curves = _plot(workdir)
      text = summary(
          cfg,
          workdir,
          start,
          final,
          run.trainer.state,
          time.monotonic() - began,
          curves,
      )
      with open(os.path.join(workdir, SUMMARY), "w") as f:
        f.write(text + "\n")
      print(text)
  finally:
    run.close()


def _xla_flags() -> None:
  """The GPU / TPU host's XLA flags (launch/xla_flags.py), set before JAX
  starts; a GPU flag this jaxlib does not know ends the run with one line,
  a TPU flag the installed libtpu does not know is dropped with a
  warning."""
  from rspo_jax.errors import ConfigError
  from rspo_launch import xla_flags

  set_now = xla_flags.apply(os.environ)
  if set_now.get("XLA_FLAGS"):
    problem = xla_flags.check(os.environ)
    if problem:
      raise ConfigError(problem)
  if set_now.get("LIBTPU_INIT_ARGS"):
    for warning in xla_flags.check_tpu(os.environ):
      log.warning("%s", warning)


def _quiet_libraries(level: str) -> None:
  """Library logs (JAX, orbax, absl, rspo_jax, ...) at ``level``; this
  script's own lines at INFO, timestamped, on stderr."""
  numeric = getattr(logging, level.upper())
  root = logging.getLogger()
  root.setLevel(numeric)
  for handler in root.handlers:  # absl's; also drops records of loggers
    # that set their own level (bm25s: DEBUG, at import)
    handler.addFilter(lambda record: record.levelno >= numeric)
  if not log.handlers:
    own = logging.StreamHandler(sys.stderr)
    own.setFormatter(
        logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S")
    )
    log.addHandler(own)
  log.propagate = False
  log.setLevel(logging.INFO)
  if numeric > logging.INFO:  # an import-time note: this package needs no
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # torch


def _plot(workdir: str) -> str:
  """``<workdir>/curves.png`` (launch/plot.py's ``plot_run``), or "" with a
  warning: a figure is no reason to fail a finished run."""
  from rspo_launch import plot

  path = os.path.join(workdir, CURVES)
  try:
    plot.plot_run(workdir, path)
  except (ValueError, OSError) as e:
    log.warning("no learning curves drawn: %s", e)
    return ""
  return path


def summary(
    cfg,
    workdir: str,
    start: dict,
    final: dict,
    state,
    wall_s: float,
    curves: str = "",
) -> str:
  """What a person reads at the end: start -> end success and score with a
  paired 95 % interval over the same goals (rspo_jax/intervals.py), RSPO's
  mechanism from ``<workdir>/metrics.jsonl`` (:func:`_mechanism`), the
  wall time and where the run's files are."""
  algo = cfg.algo.name.upper()
  name = f"RSPO+{algo}" if cfg.rspo.enabled else algo
  k, steps = cfg.rspo.k, state.a_steps
  loops = -(-steps // k)
  loops = (
      f" ({loops} loop{'s' * (loops != 1)} of k = {k})"
      if cfg.rspo.enabled
      else ""
  )
  temperature = cfg.rollout.eval_temperature
  lines = [
      f"{name} on {cfg.env.name}: {steps} A step{'s' * (steps != 1)}"
      f"{loops}, {wall_s / 60:.1f} min",
      f"held-out {cfg.env.eval_split} goals: {final['num_tasks']},"
      f" {f'temperature {temperature:g}' if temperature else 'greedy'}",
  ]
  paired = False
  for key, mean, scale in (("won", "success_rate", 100), ("score", "score", 1)):
    d = _paired(start, final, key)
    pct, digits = (" %", 1) if scale == 100 else ("", 3)
    row = (
        f"  {'success' if scale == 100 else 'score':<9}"
        f"{start[mean] * scale:.{digits}f}{pct} ->"
        f" {final[mean] * scale:.{digits}f}{pct}"
    )
    if d is not None:
      paired = True
      row = (
          f"{row:<32}{d['mean'] * scale:+.{digits}f}"
          f"{' points' if scale == 100 else ''}"
          f" [{d['lo'] * scale:+.{digits}f}, {d['hi'] * scale:+.{digits}f}]"
      )
    lines.append(row)
  if paired:
    lines.append("  (end - start on the same goals, paired 95 % interval)")
  lines += _mechanism(workdir)
  files = [
      ("eval_start.json, eval_final.json", "per-goal results"),
      ("metrics.jsonl, tb/", "every step's metrics; TensorBoard logs"),
      ("checkpoints/", "orbax checkpoints; the same command resumes"),
      (SUMMARY, "this summary"),
  ]
  if curves:
    files.insert(0, (CURVES, "learning curves of A and B"))
  lines.append(f"files in {workdir}/")
  lines += [f"  {f:<34}{what}" for f, what in files]
  return "\n".join(lines)


def _mechanism(workdir: str) -> list:
  """Whether RSPO acted, in the summary's words: B's lift (its first
  batch's success and its stored collection's, which replays those tasks,
  averaged over loops), adaptive B's steps a loop, and the share of wins
  among the trajectories A replayed, over the A steps that replayed any;
  [] for a run without them."""
  from rspo_jax.metrics import read_metrics

  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  lifts = [
      (r["b_first_success"], r["b_stored_success"])
      for r in read_metrics(path, "B_collect")
      if r.get("b_first_success") is not None
  ]
  # (trajectories, wins) of the A steps that replayed any: a step with
  # nothing replayed logs replay_success_frac 0 (replayed.metrics).
  wins = [
      (
          r["replay_trajectories"],
          r["replay_trajectories"] * r["replay_success_frac"],
      )
      for r in read_metrics(path, "A")
      if r.get("replay_trajectories")
  ]
  lines = []
  if lifts:
    first, stored = (100 * sum(x) / len(lifts) for x in zip(*lifts))
    row = f"  {'B lift':<9}{first:.1f} % -> {stored:.1f} %"
    lines.append(
        f"{row:<32}{stored - first:+.1f} points on B's first"
        f" batch's tasks, {len(lifts)} loop{'s' * (len(lifts) != 1)}"
    )
  stops = read_metrics(path, "B_stop")  # adaptive B (loop/adaptive_b.py)
  if stops:
    lines.append(
        f"  {'B steps':<9}"
        + ", ".join(str(r["b_steps"]) for r in stops)
        + f" a loop; target reached in"
        f" {sum(bool(r['b_target_reached']) for r in stops)} of {len(stops)}"
    )
  if wins:
    trajectories, won = (sum(x) for x in zip(*wins))
    lines.append(
        f"  {'replay':<9}{100 * won / trajectories:.0f} % of"
        f" A's replayed trajectories were B's wins,"
        f" {len(wins)} A step{'s' * (len(wins) != 1)}"
    )
  return lines


def _paired(start: dict, final: dict, key: str):
  """final - start of ``key`` over the start's goals (intervals.
  paired_difference), or None when either lacks per-task outcomes."""
  from rspo_jax import intervals

  try:
    before = intervals.outcome_matrix(start["per_task"], key)
    tasks = sorted({int(e["task_id"]) for e in start["per_task"]})
    after = intervals.outcome_matrix(final["per_task"], key, tasks)
    return intervals.paired_difference(after, before)
  except (KeyError, ValueError):  # an evaluation from before per_task
    return None


def _has_start_row(workdir) -> bool:
  """Whether metrics.jsonl already has the start evaluation (step 0)."""
  from rspo_jax.metrics import read_metrics

  path = os.path.join(workdir, "metrics.jsonl")
  return os.path.exists(path) and any(
      r["step"] == 0 for r in read_metrics(path, "eval")
  )


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
