"""Adaptive B's stopping target (loop/adaptive_b.py), by hand, and its
config keys. The loop itself: rspo_loop_test (slow stage)."""

import pytest

from configs import toy_grpo
from rspo_jax.errors import ConfigError
from rspo_jax.loop import adaptive_b


@pytest.mark.parametrize(
    "a_success, episodes, multiple, want",
    [
        # A never wins: floored at one win in 128; odds 10/127.
        (0.0, 128, 10.0, 10 / 137),
        # A at 10 %: odds 1/9, x 10 = 10/9; 10/19.
        (0.1, 128, 10.0, 10 / 19),
        # A at 50 % (odds 1), x 4: B at 80 %.
        (0.5, 16, 4.0, 0.8),
        # A always wins: capped at 15 of 16, odds 15, x 2 = 30: 30/31.
        (1.0, 16, 2.0, 30 / 31),
        # multiple 1: A's own rate.
        (0.25, 64, 1.0, 0.25),
    ],
)
def test_win_target_is_odds_multiple_of_a(a_success, episodes, multiple, want):
  got = adaptive_b.win_target(a_success, episodes, multiple)
  assert got == pytest.approx(want)
  assert 0.0 < got < 1.0


def test_max_steps_and_is_adaptive():
  cfg = toy_grpo.get_config("rspo.k=3")
  assert adaptive_b.max_steps(cfg.rspo) == 3
  assert not adaptive_b.is_adaptive(cfg.rspo)
  cfg = toy_grpo.get_config("rspo.k=3,rspo.b_k_max=7")
  assert adaptive_b.max_steps(cfg.rspo) == 7
  assert adaptive_b.is_adaptive(cfg.rspo)


@pytest.mark.parametrize(
    "override, key",
    [
        ("rspo.k=3,rspo.b_k_max=3", "rspo.b_k_max"),
        ("rspo.k=3,rspo.b_k_max=2", "rspo.b_k_max"),
        ("rspo.b_k_max=20,rspo.b_win_multiple=0", "rspo.b_win_multiple"),
    ],
)
def test_bad_adaptive_b_settings_name_their_key(override, key):
  with pytest.raises(ConfigError, match=key):
    toy_grpo.get_config(override)
