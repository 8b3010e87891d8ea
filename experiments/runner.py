"""Runs the grid's commands: the shared warm start, its evaluation, the
training runs; each logged to ``<workdir>/train.log``, resumable.

  shared warm start  python launch/sft.py --config=configs/<env>_grpo.py:
                     seed=0,<extra> --workdir=<root>/warm_start_<env>
                     (``done.json`` marks it made), then launch/eval.py of
                     it into its ``eval_start.json``, copied by every run;
  a run              python launch/train.py --config=<spec.config_arg>
                     --workdir=<root>/<name> --no_progress [--mesh=...];
                     a finished one (under root or in the archive) is
                     skipped, another started with another config refused.

Each returns a status dict (``run``, ``status``: skipped / done / failed,
``error``), printed as one JSON line by experiments/reproduce.py.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Iterable, Optional, Sequence

import run_archive as ra
from checkout import checkout_env
from grid import ROOT, RunSpec, config_key, start_run
from run_files import (
    code_version,
    LOG,
    RUN_JSON,
    START,
    is_finished,
    run_config,
    warm_start_workdir,
    write_json,
)

TRAIN_PY = os.path.join(ROOT, "launch", "train.py")
SFT_PY = os.path.join(ROOT, "launch", "sft.py")
EVAL_PY = os.path.join(ROOT, "launch", "eval.py")


def run_logged(
    cmd: list[str], workdir: str, env: Optional[dict]
) -> tuple[int, float]:
  """Runs ``cmd`` from the repo root, appending its output to
  ``<workdir>/train.log`` after a timestamped command line; (rc, wall s).

  Its environment is ``checkout_env``'s (experiments/checkout.py): a study
  run from a pinned worktree runs that worktree's rspo_jax and launch/."""
  env = checkout_env(env)
  t0 = time.time()
  with open(os.path.join(workdir, LOG), "a") as log:
    log.write(f"# {datetime.datetime.now().isoformat()} {' '.join(cmd)}\n")
    log.flush()
    rc = subprocess.run(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env
    ).returncode
  return rc, round(time.time() - t0, 1)


def run_eval(
    python: str,
    flags: list[str],
    workdir: str,
    env: Optional[dict],
    out_path: str,
    out: dict,
) -> Optional[dict]:
  """``python launch/eval.py <flags> --out=<out_path>`` through
  ``run_logged``; adds its ``wall_s`` and ``rc`` to ``out``. Returns
  ``out`` marked failed when it exited non-zero or wrote nothing, else
  None (the evaluation is at ``out_path``)."""
  rc, wall_s = run_logged(
      [python, EVAL_PY, *flags, f"--out={out_path}"], workdir, env
  )
  out.update(wall_s=wall_s, rc=rc)
  if rc != 0 or not os.path.exists(out_path):
    return {
        **out,
        "status": "failed",
        "error": f"exit code {rc}; see {os.path.join(workdir, LOG)}",
    }
  return None


def sft_config_arg(env: str, extra: str = "") -> str:
  """The env's config at seed 0 (every cell's SFT settings are the same)."""
  path = os.path.join(ROOT, "configs", f"{env}_grpo.py")
  return f"{path}:" + ",".join(p for p in ("seed=0", extra.strip(" ,")) if p)


def sft_command(
    env: str,
    root: str,
    extra: str = "",
    python: str = sys.executable,
    mesh: str = "",
) -> list[str]:
  cmd = [
      python,
      SFT_PY,
      f"--config={sft_config_arg(env, extra)}",
      f"--workdir={warm_start_workdir(root, env)}",
  ]
  return cmd + ([f"--mesh={os.path.abspath(mesh)}"] if mesh else [])


def shared_warm_start(
    env: str,
    root: str,
    extra: str = "",
    python: str = sys.executable,
    mesh: str = "",
    env_vars: Optional[dict] = None,
    archive: str = "",
) -> dict:
  """Behaviour-clones the env's starting policy once (launch/sft.py).

  Every run of the env then starts from ``<root>/warm_start_<env>/
  warm_start`` (``model.checkpoint_dir``), as the paper's runs all start
  from one instruct model: baseline and RSPO, every algorithm and seed
  differ only in RL. ``done.json`` marks it finished (a crashed SFT is
  redone); one made with another config argument is refused, and so is
  another config than the one of ``archive``'s warm start (its archived
  evaluations are of that one). The archive holds no weights: a made
  policy reports ``matches_archive``, whether its weights are those the
  archive's policy.json records (the very policy the archived runs
  started from; None when it records none).
  """
  workdir = warm_start_workdir(root, env)
  policy = os.path.join(workdir, "warm_start")
  done, config = os.path.join(workdir, "done.json"), sft_config_arg(env, extra)
  out = {"run": f"warm_start_{env}", "workdir": workdir, "policy": policy}
  archived = (
      os.path.join(archive, os.path.basename(workdir), "done.json")
      if archive
      else ""
  )
  for path, flag in ((done, "--root"), (archived, "--archive")):
    made = (
        json.load(open(path)).get("config")
        if path and os.path.exists(path)
        else config
    )
    if config_key(made) != config_key(config):
      return {
          **out,
          "status": "failed",
          "error": (
              f"{os.path.dirname(path)} was made with --config={made!r}, not"
              f" {config!r}; use another {flag}"
          ),
      }
  if os.path.exists(done):
    return {**out, "status": "skipped"}
  os.makedirs(workdir, exist_ok=True)
  rc, wall_s = run_logged(
      sft_command(env, root, extra, python, mesh), workdir, env_vars
  )
  out.update(wall_s=wall_s, rc=rc)
  if rc != 0:
    return {
        **out,
        "status": "failed",
        "error": f"exit code {rc}; see {os.path.join(workdir, LOG)}",
    }
  write_json(done, {"config": config})
  if archived:
    out["matches_archive"] = ra.matches_archive(
        policy, os.path.dirname(archived)
    )
  return {**out, "status": "done"}


def shared_start_eval(
    env: str,
    root: str,
    extra: str = "",
    python: str = sys.executable,
    env_vars: Optional[dict] = None,
    out_name: str = START,
    eval_flags: Sequence[str] = (),
    archive: str = "",
) -> dict:
  """Evaluates the shared warm start once (launch/eval.py, the runs' eval
  split and tasks, greedy unless ``eval_flags`` say otherwise, seed 0)
  into ``<root>/warm_start_<env>/eval_start.json``. Every run of the env
  copies it as its own ``eval_start.json`` (launch/train.py then skips its
  start evaluation): the same policy on the same tasks gives the same
  numbers. ``out_name``
  and ``eval_flags`` (e.g. the study's T = 0.4 evaluation) make another
  evaluation of it. One in ``archive`` is copied into root instead (skipped)
  unless root's policy is not the archived one (``matches_archive``), and
  a new one is archived."""
  workdir = warm_start_workdir(root, env)
  path = os.path.join(workdir, out_name)
  tag = (
      ""
      if out_name == START
      else (out_name.replace(START.split(".")[0], "").split(".")[0])
  )
  out = {"run": f"start_eval{tag}_{env}", "workdir": workdir, "eval": path}
  if os.path.exists(path):
    return {**out, "status": "skipped"}
  policy = os.path.join(workdir, "warm_start")
  if (
      archive
      and ra.matches_archive(policy, ra.archived_dir(workdir, archive))
      is not False
      and ra.restore(workdir, archive, out_name)
  ):
    return {**out, "status": "skipped", "from_archive": archive}
  config = f"{sft_config_arg(env, extra)},model.checkpoint_dir={policy}"
  tmp = path + ".tmp"
  failed = run_eval(
      python,
      [f"--config={config}", *(eval_flags or (GREEDY_EVAL,))],
      workdir,
      env_vars,
      tmp,
      out,
  )
  if failed:
    return failed
  os.replace(tmp, path)
  if archive:
    ra.archive_run(workdir, archive)
  return {**out, "status": "done"}


# The studies' own evaluations, start and end of every run, are greedy
# (their "greedy" column), whatever a config's rollout.eval_temperature
# (CPU WebShop: 0.4); sampled_eval.py adds T = 0.4 and 1. A flag beside
# --config, so a run's config argument, and what it is compared with, stay
# those of the runs trained before the default changed.
GREEDY_TRAIN = "--config.rollout.eval_temperature=0.0"
GREEDY_EVAL = "--temperature=0"


def command(
    spec: RunSpec,
    root: str,
    extra: str = "",
    python: str = sys.executable,
    mesh: str = "",
) -> list[str]:
  cmd = [
      python,
      TRAIN_PY,
      f"--config={spec.config_arg(extra)}",
      GREEDY_TRAIN,
      f"--workdir={os.path.join(root, spec.name)}",
      "--no_progress",
  ]
  return cmd + ([f"--mesh={os.path.abspath(mesh)}"] if mesh else [])


def from_start_run(spec: RunSpec, root: str) -> RunSpec:
  """The run starting from the final policy of its ``start_from`` run,
  ``<root>/<that run>/final_policy`` (the archiver's export), named after
  every other override so that it wins over the shared warm start's, and
  from that policy's held-out evaluation (its eval_final.json) as its
  start-of-RL evaluation. A run without ``start_from`` is returned as is."""
  dep = start_run(spec)
  if dep is None:
    return spec
  policy = f"model.checkpoint_dir={os.path.join(root, dep, ra.FINAL_POLICY)}"
  return dataclasses.replace(
      spec,
      late_overrides=",".join(p for p in (spec.late_overrides, policy) if p),
      start_eval=os.path.join(root, dep, "eval_final.json"),
  )


def _run_one(
    spec: RunSpec,
    root: str,
    extra: str,
    python: str,
    mesh: str,
    env: dict,
    archive: str = "",
) -> dict:
  spec = from_start_run(spec, root)
  workdir = os.path.join(root, spec.name)
  out = {"run": spec.name, "workdir": workdir}
  config = spec.config_arg(extra)
  found = ra.run_dir(root, archive, spec.name)
  if is_finished(found):  # under root, else in the archive
    where = {} if found == workdir else {"archived": found}
    trained = run_config(found)
    if trained is not None and config_key(trained) != config_key(config):
      return {
          **out,
          **where,
          "status": "failed",
          "error": (
              f"{found} was trained with --config={trained!r}, not {config!r};"
              f" use another {'--archive' if where else '--root'}"
          ),
      }
    return {**out, **where, "status": "skipped"}
  dep = start_run(spec)
  if dep is not None and ra.local_policy(root, dep) is None:
    return {
        **out,
        "status": "failed",
        "error": (
            f"starts from {dep}'s final policy, which is not in"
            f" {os.path.join(root, dep, ra.FINAL_POLICY)}: train --variants"
            f" {spec.start_from} under this --root with --archive (the"
            " archiver exports it), or regenerate it with the command in"
            " its archived policy.json"
        ),
    }
  os.makedirs(workdir, exist_ok=True)
  meta_path = os.path.join(workdir, RUN_JSON)
  code = code_version(ROOT)
  if os.path.exists(meta_path):
    meta = json.load(open(meta_path))
    if meta.get("config") != config:
      return {
          **out,
          "status": "failed",
          "error": (
              f"{workdir} was started with --config={meta.get('config')!r},"
              f" not {config!r}; use another --root"
          ),
      }
    last_code = (meta.get("resumed_with") or [meta])[-1]
    last_code = {k: last_code[k] for k in ("commit", "dirty") if k in last_code}
    if code and code != last_code:  # resumed on other code: say so
      meta.setdefault("resumed_with", []).append(code)
      write_json(meta_path, meta)
  else:
    write_json(meta_path, {"config": config, "name": spec.name, **code})
  own_eval = os.path.join(workdir, START)
  if (
      spec.start_eval
      and os.path.exists(spec.start_eval)
      and not os.path.exists(own_eval)
  ):
    shutil.copyfile(spec.start_eval, own_eval + ".tmp")
    os.replace(own_eval + ".tmp", own_eval)
  rc, wall_s = run_logged(
      command(spec, root, extra, python, mesh), workdir, env
  )
  out.update(wall_s=wall_s, rc=rc)
  if rc == 0 and is_finished(workdir):
    if archive:
      ra.archive_run(workdir, archive, python)
    return {**out, "status": "done"}
  return {
      **out,
      "status": "failed",
      "error": f"exit code {rc}; see {os.path.join(workdir, LOG)}",
  }


def run_grid(
    specs: Iterable[RunSpec],
    root: str,
    extra: str = "",
    parallel: int = 1,
    python: str = sys.executable,
    echo: bool = True,
    mesh: str = "",
    archive: str = "",
) -> list[dict]:
  """Runs the unfinished specs, ``parallel`` at a time; one dict per spec.

  Status is 'skipped' (already finished, under root or in ``archive``),
  'done' (then archived) or 'failed' (with 'error'). A failed run does not
  stop the others. The runs that start from another's final policy
  (``start_from``) run after all the others.
  """
  if parallel < 1:
    raise ValueError(f"--parallel must be >= 1, got {parallel}")
  specs, root = list(specs), os.path.abspath(root)
  env = dict(os.environ)
  if parallel > 1:  # several JAX processes share the accelerator
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  results = {}
  waves = [[s for s in specs if not s.start_from]]
  waves.append([s for s in specs if s.start_from])
  for wave in waves:
    results.update(
        _run_wave(wave, root, extra, parallel, python, echo, mesh, env, archive)
    )
  return [results[s.name] for s in specs]


def _run_wave(
    specs, root, extra, parallel, python, echo, mesh, env, archive
) -> dict[str, dict]:
  """run_grid's runs of one wave, ``parallel`` at a time, by name."""
  results = {}
  with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
    futures = {
        pool.submit(
            _run_one, s, root, extra, python, mesh, env, archive
        ): s.name
        for s in specs
    }
    for f in concurrent.futures.as_completed(futures):
      name = futures[f]
      try:
        r = f.result()
      except OSError as e:  # e.g. a bad --python, an unwritable --root
        r = {
            "run": name,
            "status": "failed",
            "error": f"{type(e).__name__}: {e}",
        }
      results[name] = r
      if echo:
        print(json.dumps(r), flush=True)
  return results
