"""Webshop x PPO: RSPO on top of PPO (`:rspo=0` for the baseline).

At CPU scale, and at the paper's with a paper model preset:

  python launch/train.py --config=configs/webshop_ppo.py
  python launch/train.py --config=configs/webshop_ppo.py:model=qwen2.5-1.5b
"""

from configs import base


def get_config(arg=None):
  return base.make_config("webshop", "ppo", arg)
