"""The study's sampled evaluations of finished runs (launch/eval.py at
T = 0.4 and T = 1.0, 3 sampling seeds) into ``eval_final_<tag>.json``.

A run finished under root is evaluated from its latest checkpoint, with
the config it was trained with (``trained_config``); one finished in the
archive only, from its local ``<root>/<name>/final_policy/`` when that is
the archived policy (its policy.json sha256; ``with_policy``,
``archived_policy_eval``); without either it is 'unavailable', its error
the one line that regenerates the policy.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Optional

import run_archive as ra
from grid import ROOT, RunSpec, sampled_flags, sampled_names
from run_files import is_finished, run_config, write_json
from runner import run_eval


def trained_config(spec: RunSpec, root: str, extra: str = "") -> str:
  """The ``--config`` a run was trained with (its ``run.json``), else the
  one its spec gives now. An evaluation must build the run as it was
  trained: a spec made without the shared warm start (every run of the env
  already finished) lacks ``model.checkpoint_dir``, and launch/eval.py would
  first behaviour-clone a policy of its own (minutes; then overwritten by
  the checkpoint)."""
  return run_config(os.path.join(root, spec.name)) or spec.config_arg(extra)


def with_policy(config: str, policy: str) -> str:
  """``config`` (``file.py:k=v,...``) starting from the HF directory
  ``policy``: its ``model.checkpoint_dir`` overrides replaced by one naming
  ``policy``, its ``model.tokenizer_dir`` ones dropped (the exported
  policy holds the run's tokenizer; the trained path may be another
  clone's); a config file of another clone (run.json holds absolute
  paths) taken from this one."""
  path, _, overrides = config.partition(":")
  i = path.rfind(f"{os.sep}configs{os.sep}")
  if i >= 0 and not os.path.isfile(path):
    path = ROOT + path[i:]
  kept = [
      p
      for p in overrides.split(",")
      if p
      and not p.startswith(("model.checkpoint_dir=", "model.tokenizer_dir="))
  ]
  return f"{path}:" + ",".join(kept + [f"model.checkpoint_dir={policy}"])


def sampled_final_eval(
    spec: RunSpec,
    root: str,
    extra: str = "",
    python: str = sys.executable,
    env_vars: Optional[dict] = None,
    tag: str = "t04",
    temperature: float = 0.4,
    archive: str = "",
) -> dict:
  """A finished run's final policy at ``temperature``, 3 seeds
  (launch/eval.py on its workdir's latest checkpoint) into
  ``eval_final_<tag>.json``, then archived; skipped when that exists, or
  when ``archive`` holds it for this run (copied into root when the run is
  finished there: the same eval_final.json). A run finished in the archive
  only has no checkpoint: its local ``<root>/<name>/final_policy/``
  (run_archive.local_policy) is evaluated instead (``archived_policy_eval``;
  'failed' when its weights are not the archived ones); without one it is
  'unavailable' (its cell has no interval at this decoding), its error
  naming the command that regenerates the policy. 'failed' when
  unfinished."""
  workdir = os.path.join(root, spec.name)
  name = sampled_names(tag)[1]
  path = os.path.join(workdir, name)
  out = {"run": f"{spec.name}_{tag}", "workdir": workdir, "eval": path}
  if os.path.exists(path):
    return {**out, "status": "skipped"}
  found = ra.run_dir(root, archive, spec.name)
  if found != workdir:  # finished in the archive only
    if os.path.isfile(os.path.join(found, name)):
      return {**out, "status": "skipped", "archived": found}
    policy = ra.local_policy(root, spec.name)
    if not policy:
      return {
          **out,
          "status": "unavailable",
          "error": ra.regenerate_hint(
              found, os.path.join(workdir, ra.FINAL_POLICY)
          ),
      }
    if ra.matches_archive(policy, found) is False:
      return {
          **out,
          "status": "failed",
          "error": (
              f"{policy} is not the archived policy: its {ra.POLICY_WEIGHTS}"
              f" sha256 differs from {os.path.join(found, ra.POLICY_JSON)}'s"
          ),
      }
    return archived_policy_eval(
        spec, root, found, policy, extra, python, env_vars, tag, temperature
    )
  if not is_finished(workdir):
    return {**out, "status": "failed", "error": "the run is unfinished"}
  if ra.same_run(workdir, archive) and ra.restore(workdir, archive, name):
    return {**out, "status": "skipped", "from_archive": archive}
  tmp = path + ".tmp"
  failed = run_eval(
      python,
      [
          f"--config={trained_config(spec, root, extra)}",
          f"--workdir={workdir}",
          *sampled_flags(temperature),
      ],
      workdir,
      env_vars,
      tmp,
      out,
  )
  if failed:
    return failed
  os.replace(tmp, path)
  if archive:
    ra.archive_run(workdir, archive, python)
  return {**out, "status": "done"}


def archived_policy_eval(
    spec: RunSpec,
    root: str,
    found: str,
    policy: str,
    extra: str = "",
    python: str = sys.executable,
    env_vars: Optional[dict] = None,
    tag: str = "t04",
    temperature: float = 0.4,
) -> dict:
  """``sampled_final_eval`` of a run finished in the archive only (``found``
  = ``<archive>/<name>``) from the policy directory ``policy`` (its local
  copy): launch/eval.py with ``--config=<its trained
  config>,model.checkpoint_dir=<policy>`` and a fresh, empty
  ``--workdir`` (``<root>/<name>.final_policy_eval_<tag>``: no checkpoint
  there, so the policy evaluated is the archived one; its train.log is kept
  when the evaluation fails, the directory removed when it succeeds). The
  file is written into ``found`` (``ra.archive_file``), with ``a_steps``
  from the export's export.json and ``policy``: 'final_policy'."""
  name = sampled_names(tag)[1]
  scratch = os.path.join(root, f"{spec.name}.final_policy_eval_{tag}")
  out = {
      "run": f"{spec.name}_{tag}",
      "workdir": scratch,
      "eval": os.path.join(found, name),
      "archived": found,
      "evaluated": f"the archived run's final policy {policy}",
  }
  if os.path.isdir(scratch):  # an earlier attempt's: start empty
    shutil.rmtree(scratch)
  os.makedirs(scratch)
  config = with_policy(run_config(found) or spec.config_arg(extra), policy)
  tmp = os.path.join(scratch, name)
  failed = run_eval(
      python,
      [
          f"--config={config}",
          f"--workdir={scratch}",
          *sampled_flags(temperature),
      ],
      scratch,
      env_vars,
      tmp,
      out,
  )
  if failed:
    return failed
  result = json.load(open(tmp))
  export = os.path.join(policy, "export.json")
  if os.path.isfile(export):  # launch/eval.py saw no checkpoint: 0 steps
    result["a_steps"] = json.load(open(export)).get("a_steps")
  result["policy"] = ra.FINAL_POLICY
  write_json(tmp, result)
  ra.archive_file(tmp, found)
  shutil.rmtree(scratch)
  return {**out, "status": "done"}
