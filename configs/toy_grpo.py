"""Toy environment x GRPO: the smallest end-to-end config (tests, smoke)."""

from configs import base


def get_config(arg=None):
  return base.make_config("toy", "grpo", arg)
