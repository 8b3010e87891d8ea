"""Command-line entry points (installed as ``rspo_launch``; console scripts
``rspo-train``, ``rspo-eval``, ``rspo-sft``, ``rspo-train-prm``,
``rspo-serve-rollout``, ``rspo-plot``). In a checkout each file also runs as
``python launch/<name>.py`` once the package is installed (``pip install -e
.``)."""

import sys


def run_absl(main, module_name: str, **kwargs) -> None:
  """``absl.app.run(main)`` for an entry point defined in ``module_name``:
  ``--help`` lists that module's flags (absl lists the flags of the script
  named by ``sys.argv[0]``, and its docstring as the usage; a console
  script's wrapper has neither), and exits 0 after the help (absl: 1)."""
  from absl import app, flags

  script = sys.modules.get("__main__")
  if script is not None and not script.__doc__:  # the usage text
    script.__doc__ = sys.modules[module_name].__doc__
  for flag in flags.FLAGS.get_flags_for_module(module_name):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  try:
    app.run(main, **kwargs)
  except SystemExit as e:  # absl exits 1 after printing the help asked for
    if e.code == 1 and _HELP.intersection(sys.argv[1:]):
      raise SystemExit(0) from None
    raise


_HELP = {"-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml"}
