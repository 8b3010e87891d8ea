"""Spell task x GRPO: sparsity as a knob (third_party_envs/spell.py).

`--config=configs/spell_grpo.py:env.kwargs.word_length=6` spells 6-letter
words (a random policy wins (1/5)^6); `env.kwargs.dense=misaligned` gives B
a farmable dense reward; `env.kwargs.expert_digits=5` a warm start that
knows half the cipher, with `env.kwargs.expert_unknown=guess` one that
guesses the rest; `env.kwargs.show_digit=True` names the next digit;
`env.kwargs.cipher_digits=1` hides one letter, the same in every word;
`env.kwargs.dense=partial,env.kwargs.decoy_positions=m` pays the aligned
reward on the first L - m letters and decoys on the last m, each decoy
`env.kwargs.decoy_weight` / L (checked here: 0 <= m <= L, weight > 0,
both only with dense=partial).
env.max_steps follows the word (L + slack turns) unless `arg` sets it; a
`--config.env.kwargs.*` flag comes after this file, so set env.max_steps
with it.
"""

from configs import base
from rspo_jax.errors import ConfigError
from third_party_envs import spell


def fit_turns(c, arg):
  """env.max_steps = word_length + slack, unless `arg` sets env.max_steps;
  ConfigError on a bad dense-reward knob (check_dense)."""
  check_dense(c)
  keys = {item.split("=")[0].strip() for item in (arg or "").split(",")}
  if "env.max_steps" not in keys:
    c.env.max_steps = c.env.kwargs.word_length + c.env.kwargs.slack
  return c


def check_dense(c) -> None:
  """ConfigError naming the key when env.kwargs.dense, decoy_positions
  or decoy_weight is out of range (third_party_envs/spell.py's checks)."""
  kw = c.env.kwargs
  if kw.dense not in spell.DENSE:
    raise ConfigError(
        f"bad config value env.kwargs.dense={kw.dense!r};"
        f" wants one of {', '.join(spell.DENSE)}"
    )
  try:
    spell.check_partial(
        kw.dense, kw.decoy_positions, kw.word_length, kw.decoy_weight
    )
  except ValueError as e:
    raise ConfigError(
        f"bad config value in env.kwargs (dense="
        f"{kw.dense!r}, decoy_positions={kw.decoy_positions},"
        f" decoy_weight={kw.decoy_weight}): {e}"
    ) from None


def get_config(arg=None):
  return fit_turns(base.make_config("spell", "grpo", arg), arg)
