"""Spell task x GRPO: sparsity as a knob (third_party_envs/spell.py).

`--config=configs/spell_grpo.py:env.kwargs.word_length=6` spells 6-letter
words (a random policy wins (1/5)^6); `env.kwargs.dense=misaligned` gives B
a farmable dense reward; `env.kwargs.expert_digits=5` a warm start that
knows half the cipher, with `env.kwargs.expert_unknown=guess` one that
guesses the rest; `env.kwargs.show_digit=True` names the next digit;
`env.kwargs.cipher_digits=1` hides one letter, the same in every word.
env.max_steps follows the word (L + slack turns) unless `arg` sets it; a
`--config.env.kwargs.*` flag comes after this file, so set env.max_steps
with it.
"""

from configs import base


def fit_turns(c, arg):
  """env.max_steps = word_length + slack, unless `arg` sets env.max_steps."""
  keys = {item.split("=")[0].strip() for item in (arg or "").split(",")}
  if "env.max_steps" not in keys:
    c.env.max_steps = c.env.kwargs.word_length + c.env.kwargs.slack
  return c


def get_config(arg=None):
  return fit_turns(base.make_config("spell", "grpo", arg), arg)
