"""What a training run checks before it builds anything.

launch/train.py calls ``check(cfg, workdir)`` after the config and its
paths (``rspo_launch.check_inputs``); each problem is one ``ConfigError``
line (exit 1, no traceback; ``--debug`` or ``RSPO_DEBUG=1`` shows it):

  workdir      a file, under /proc or /sys, not creatable or not writable,
               or holding checkpoints of another configuration (the
               fingerprint keys of ``config_fingerprint`` differ from the
               newest checkpoint's);
  packages     an optional package the config asks for and that is not
               installed (``MissingPackage``): wandb for
               ``metrics.wandb_project``, torch for
               ``rollout.weight_sync=distributed``;
  environment  a user environment (``env.name=package.module:Class``)
               plays one probe episode, task 0 of ``env.train_split``, with
               its expert's actions (else the first admissible one): every
               result is checked (``third_party_envs/contract.py``), and
               with RSPO on the environment's dense reward
               (``rspo.dense_reward=oracle``) some ``step()`` must set
               ``EnvStep.dense_reward``, or B would train on zeros.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
import tempfile

from rspo_jax.errors import ConfigError, EnvError, MissingPackage
from third_party_envs import base, registry

log = logging.getLogger(__name__)

VIRTUAL_FILESYSTEMS = ("/proc", "/sys")


def check(cfg, workdir: str) -> None:
  """The three checks of the module docstring, in its order."""
  check_workdir(workdir, cfg)
  check_packages(cfg)
  check_environment(cfg)


# ------------------------------------------------------------------ workdir


def check_workdir(workdir: str, cfg=None) -> None:
  """ConfigError unless ``workdir`` is (or can be made) a writable
  directory; with ``cfg``, also when it holds another configuration's
  checkpoints. Creates the directory."""
  flag = f"--workdir={workdir!r}"
  real = os.path.realpath(workdir)
  for top in VIRTUAL_FILESYSTEMS:
    if real == top or real.startswith(top + os.sep):
      raise ConfigError(
          f"{flag} is under {top}, the kernel's virtual filesystem, where no"
          " run can be written; pass --workdir=<a directory on a disk>"
      )
  if os.path.exists(real) and not os.path.isdir(real):
    raise ConfigError(
        f"{flag} is a file, not a directory; pass --workdir=<a new or"
        " existing run directory>"
    )
  try:
    os.makedirs(real, exist_ok=True)
    with tempfile.TemporaryFile(dir=real):
      pass
  except OSError as e:
    raise ConfigError(
        f"{flag} cannot be created or written ({type(e).__name__}:"
        f" {e.strerror or e}); pass --workdir=<a writable directory>"
    ) from e
  if cfg is not None:
    _check_checkpoints(workdir, cfg)


def config_fingerprint(cfg) -> dict:
  """The keys of ``RSPOTrainer.fingerprint`` known before the model is
  built (it adds the parameter count)."""
  return {
      "model": cfg.model.preset,
      "algo": cfg.algo.name,
      "env": cfg.env.name,
      "rspo": bool(cfg.rspo.enabled),
  }


def saved_fingerprint(workdir: str):
  """(checkpoint directory, its fingerprint) of the newest checkpoint in
  ``<workdir>/checkpoints`` (orbax's ``<step>/meta/metadata`` JSON), or
  None when there is none or it cannot be read."""
  steps = []
  for path in glob.glob(
      os.path.join(workdir, "checkpoints", "*", "meta", "metadata")
  ):
    step = os.path.basename(os.path.dirname(os.path.dirname(path)))
    if step.isdigit():
      steps.append((int(step), path))
  if not steps:
    return None
  _, path = max(steps)
  try:
    with open(path) as f:
      return os.path.dirname(os.path.dirname(path)), json.load(f).get(
          "fingerprint", {}
      )
  except (OSError, ValueError, AttributeError):
    return None  # the restore names a damaged checkpoint itself


def _check_checkpoints(workdir: str, cfg) -> None:
  saved = saved_fingerprint(workdir)
  if saved is None:
    return
  directory, fingerprint = saved
  diff = [
      f"{k} {fingerprint[k]!r} (now {v!r})"
      for k, v in config_fingerprint(cfg).items()
      if k in fingerprint and fingerprint[k] != v
  ]
  if diff:
    raise ConfigError(
        f"--workdir={workdir!r} holds checkpoints of another configuration"
        f" ({directory}: {', '.join(diff)}), which this run would resume;"
        " pass a new --workdir, or the configuration that wrote them"
    )


# ------------------------------------------------------------------ packages


def check_packages(cfg) -> None:
  """MissingPackage for an optional package the config needs."""
  project = cfg.metrics.wandb_project
  if project and importlib.util.find_spec("wandb") is None:
    raise MissingPackage(
        f"metrics.wandb_project={project!r} logs to Weights & Biases, but"
        " wandb is not installed: pip install 'rspo_jax[wandb]' (or pip"
        " install wandb), or set metrics.wandb_project=''"
    )
  rollout = cfg.rollout
  if (
      rollout.engine == "sglang"
      and rollout.weight_sync == "distributed"
      and importlib.util.find_spec("torch") is None
  ):
    raise MissingPackage(
        "rollout.weight_sync='distributed' broadcasts the weights with"
        " torch.distributed, but torch is not installed here: pip install"
        " torch, or set rollout.weight_sync=disk"
    )


# --------------------------------------------------------------- environment


def uses_env_dense_reward(cfg) -> bool:
  """RSPO trains Agent B on the environment's own dense reward (not
  RSPO_H, no B; not RSPO_O, B on the outcome)."""
  r = cfg.rspo
  return (
      bool(r.enabled)
      and r.dense_reward in ("oracle", "env")
      and r.data_source == "rspo"
  )


def check_environment(cfg) -> None:
  """The probe episode of the module docstring (user environments only:
  the built-in ones are tested)."""
  name = cfg.env.name
  if not registry.is_import_path(name):
    return
  steps = probe_episode(
      name, dict(cfg.env.kwargs), cfg.env.train_split, cfg.env.max_steps
  )
  if (
      steps
      and uses_env_dense_reward(cfg)
      and not any(base.sets_dense_reward(s) for s in steps)
  ):
    cls = registry.env_class(name).__name__
    raise ConfigError(
        f"rspo.dense_reward={cfg.rspo.dense_reward} trains Agent B on the"
        f" environment's dense reward, but {name!r} sets none ({cls}.step()"
        f" left EnvStep.dense_reward at its default in {len(steps)} steps of"
        f" task 0): implement dense_reward (set EnvStep.dense_reward in"
        f" {cls}.step(); docs/custom_env.md, section 1), or set"
        " rspo.dense_reward=prm (or a function of yours, section 3), or"
        " rspo=0"
    )


def probe_episode(
    name: str, kwargs: dict, split: str, max_steps: int, task_id: int = 0
) -> list:
  """The ``step()`` results of one episode of ``task_id``, each checked
  (``EnvError`` on a broken contract); [] when the environment raised
  (the run's own collections then count and report that, section 5)."""
  steps = []
  try:
    env = registry.make_env(name, **kwargs)
  except Exception as e:  # pylint: disable=broad-except
    log.debug("probe episode: building %s raised %r", name, e)
    return steps
  try:
    obs = env.reset(task_id, split)
    for _ in range(max_steps):
      if obs.done:
        break
      action = (
          env.expert_action() or next(iter(obs.admissible_actions), "") or ""
      )
      obs = env.step(action)
      steps.append(obs)
  except EnvError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    log.debug("probe episode of %s raised %r", name, e)
  finally:
    try:
      env.close()
    except Exception:  # pylint: disable=broad-except
      pass
  return steps
