"""Spell task x GiGPO (third_party_envs/spell.py; knobs: spell_grpo.py).

GiGPO's step groups key on the observation `Letters so far: c a _ _`: the
episodes of a group that typed the same prefix share a step group.
"""

from configs import base
from configs.spell_grpo import fit_turns


def get_config(arg=None):
  return fit_turns(base.make_config("spell", "gigpo", arg), arg)
