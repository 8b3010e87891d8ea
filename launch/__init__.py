"""Command-line entry points (installed as ``rspo_launch``; console scripts
``rspo-train``, ``rspo-eval``, ``rspo-sft``, ``rspo-train-prm``,
``rspo-serve-rollout``, ``rspo-plot``). In a checkout each file also runs as
``python launch/<name>.py`` once the package is installed (``pip install -e
.``).

Errors a person fixes (a bad flag or override, a bad config value, a path
or server that is not there) end the command with one line on stderr,
``error: ...``, naming the key, the value and what to pass, and status 1
(``rspo_jax.errors.ConfigError``; ``exit_on_user_error``). ``RSPO_DEBUG=1``
(or a launcher's ``--debug``) keeps the traceback as well."""

import functools
import os
import re
import sys


def run_absl(main, module_name: str, **kwargs) -> None:
  """``absl.app.run(main)`` for an entry point defined in ``module_name``:
  ``--help`` lists that module's flags (absl lists the flags of the script
  named by ``sys.argv[0]``, and its docstring as the usage; a console
  script's wrapper has neither), and exits 0 after the help (absl: 1). Bad
  flags and ``ConfigError``s exit with one line (``parse_flags``,
  ``exit_on_user_error``)."""
  from absl import app, flags

  script = sys.modules.get("__main__")
  if script is not None and not script.__doc__:  # the usage text
    script.__doc__ = sys.modules[module_name].__doc__
  for flag in flags.FLAGS.get_flags_for_module(module_name):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  kwargs.setdefault("flags_parser", parse_flags)
  try:
    app.run(exit_on_user_error(main), **kwargs)
  except SystemExit as e:  # absl exits 1 after printing the help asked for
    if e.code == 1 and _HELP.intersection(sys.argv[1:]):
      raise SystemExit(0) from None
    raise


_HELP = {"-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml"}


def exit_on_user_error(fn):
  """``fn`` with a ``ConfigError`` (anywhere in the exception's chain)
  turned into ``SystemExit("error: <its message on one line>")``."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except Exception as e:  # pylint: disable=broad-except
      user_error = _config_error(e)
      if user_error is None:
        raise
      if debug():
        import traceback

        traceback.print_exc()
      raise SystemExit(_line(user_error)) from None

  return wrapped


def debug() -> bool:
  """Tracebacks of user errors too: ``RSPO_DEBUG`` set to anything but
  ``""`` or ``0``, or the launcher's ``--debug`` flag."""
  from absl import flags

  if os.environ.get("RSPO_DEBUG", "") not in ("", "0"):
    return True
  if "debug" in flags.FLAGS and flags.FLAGS.is_parsed():
    return bool(flags.FLAGS["debug"].value)
  return "--debug" in sys.argv[1:]


def parse_flags(argv):
  """absl's flag parsing; whatever goes wrong exits with one line: the
  ``ConfigError`` of a ``file.py:key=value`` override, the field or type a
  ``--config.<key>=<value>`` gets wrong (with the closest keys), a config
  file that is not there, or absl's own one-line reason."""
  from absl import flags

  try:
    remaining = flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    if debug():
      import traceback

      traceback.print_exc()
    reason = _config_error(e) or _field_error(argv) or _last_line(e)
    if "\n" in str(reason) and "Traceback" in str(reason):
      reason = _last_line(reason)  # absl kept only the text of the error
    raise SystemExit(_line(reason)) from None
  for name in _config_flag_names():
    value = flags.FLAGS[name].value
    if type(value).__name__ == "_ErrorConfig":  # ml_collections defers it
      given = next(
          (a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), ""
      )
      raise SystemExit(
          _line(
              f"--{name}={given}: no such config file (pass --{name}=<a file"
              f" of configs/, e.g. configs/webshop_grpo.py>)"
          )
      )
  return remaining


def check_inputs(cfg, workdir=None) -> None:
  """ConfigError when a directory the config names is not there
  (``model.checkpoint_dir``: config.json; the tokenizer:
  ``model.tokenizer_dir`` or the checkpoint's; ``rspo.prm_backbone_dir``;
  ``workdir`` when given: an evaluated run), or when an SGLang server of
  ``rollout.server_urls`` / ``rollout.b_server_urls`` does not answer;
  before anything is built; also when ``env.name`` or
  ``rspo.dense_reward`` is an import path that does not resolve."""
  from rspo_jax.errors import ConfigError
  from third_party_envs import registry

  _check_paths(cfg, workdir)
  try:
    registry.check_env_name(cfg.env.name)
    if registry.is_import_path(cfg.rspo.dense_reward):
      registry.import_function(cfg.rspo.dense_reward, "rspo.dense_reward")
  except ValueError as e:  # registry's message names the path and the fault
    key = "env.name" if cfg.env.name in str(e) else "rspo.dense_reward"
    raise ConfigError(f"{key}: {e}") from None
  if cfg.rollout.engine == "sglang" or cfg.rollout.b_server_urls:
    from rspo_jax import build

    keys = ["rollout.server_urls"] if cfg.rollout.engine == "sglang" else []
    keys += ["rollout.b_server_urls"] if cfg.rollout.b_server_urls else []
    for key in keys:
      build.make_sglang_client(cfg, key).close()


def _check_paths(cfg, workdir) -> None:
  from rspo_jax.errors import ConfigError

  ckpt, tok = cfg.model.checkpoint_dir, cfg.model.tokenizer_dir
  if ckpt and not os.path.isfile(os.path.join(ckpt, "config.json")):
    what = (
        "no config.json in that directory"
        if os.path.isdir(ckpt)
        else "no such directory"
    )
    raise ConfigError(
        f"model.checkpoint_dir={ckpt!r}: {what}; pass"
        " model.checkpoint_dir=<a Hugging Face model directory (config.json,"
        " *.safetensors)>, or model.checkpoint_dir='' to start from the"
        f" preset {cfg.model.preset!r}"
    )
  if (tok or ckpt) and not any(
      os.path.isfile(os.path.join(tok or ckpt, f))
      for f in ("tokenizer.json", "tokenizer_config.json")
  ):
    key = "model.tokenizer_dir" if tok else "model.checkpoint_dir"
    raise ConfigError(
        f"{key}={tok or ckpt!r} holds no tokenizer (tokenizer.json or"
        " tokenizer_config.json); pass model.tokenizer_dir=<a directory"
        " with the model's tokenizer.json>"
    )
  backbone = cfg.rspo.prm_backbone_dir
  if backbone and not os.path.isfile(os.path.join(backbone, "config.json")):
    raise ConfigError(
        f"rspo.prm_backbone_dir={backbone!r}: no Hugging Face model there;"
        " pass rspo.prm_backbone_dir=<a directory with config.json and"
        " *.safetensors>, or '' for the starting policy"
    )
  if workdir is not None and not os.path.isdir(workdir):
    raise ConfigError(
        f"--workdir={workdir!r}: no such directory; pass --workdir=<a run"
        " directory of rspo-train>, or leave it out and pass"
        " model.checkpoint_dir=<a Hugging Face model directory>"
    )


# ------------------------------------------------------------------ helpers


def _line(reason) -> str:
  from rspo_jax.errors import one_line

  return "error: " + one_line(reason)


def _config_error(e):
  """The first ConfigError in ``e``'s chain (cause / context), or the
  message of one quoted in an error's text (absl re-raises a config file's
  ValueError as text: ml_collections' traceback of it), or None."""
  from rspo_jax.errors import ConfigError

  seen = set()
  while e is not None and id(e) not in seen:
    if isinstance(e, ConfigError):
      return e
    quoted = re.findall(r"^\S*ConfigError: (.*)$", str(e), re.M)
    if quoted:
      return quoted[-1]
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return None


def _config_flag_names() -> list:
  from absl import flags

  return [
      name
      for name, flag in flags.FLAGS._flags().items()  # pylint: disable=protected-access
      if type(flag).__name__ == "_ConfigFlag" and name == flag.name
  ]


def _field_error(argv):
  """The ConfigError of the first ``--<config flag>.<key>=<value>`` of
  ``argv`` that names no field or does not convert to its type, or None."""
  import ml_collections
  from absl import flags
  from ml_collections.config_flags import config_flags
  from configs import base
  from rspo_jax.errors import ConfigError

  for name in _config_flag_names():
    overrides = [
        a[len(name) + 3 :].split("=", 1)
        for a in argv[1:]
        if a.startswith(f"--{name}.") and "=" in a
    ]
    if not overrides:
      continue
    given = [a.split("=", 1)[1] for a in argv[1:] if a.startswith(f"--{name}=")]
    try:
      cfg = (
          config_flags.ConfigFileFlagParser(name).parse(given[-1])
          if given
          else flags.FLAGS[name].value
      )
    except Exception:  # pylint: disable=broad-except
      return None  # the file's own error says more
    if not isinstance(cfg, ml_collections.ConfigDict):
      return None
    for key, value in overrides:
      try:
        base.check_override(
            cfg,
            key,
            value,
            what="no config field",
            given=f"--{name}.{key}={value}",
        )
      except ConfigError as e:
        return e
  return None


def _last_line(e) -> str:
  """The last non-empty line of ``e``'s message (absl's reason)."""
  lines = [s for s in str(e).splitlines() if s.strip()]
  return lines[-1].strip() if lines else type(e).__name__
