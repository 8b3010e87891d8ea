"""rspo_jax/timing.py (a hand-driven clock) and the phases ``collect``
books with it."""

import time

import numpy as np
import pytest

from rspo_jax import timing


class Clock:
  """Seconds that move only when the test says so."""

  def __init__(self):
    self.t = 100.0

  def __call__(self):
    return self.t


def test_nested_phases_count_exclusively_and_reset_per_step():
  clock = Clock()
  timer = timing.PhaseTimer(clock)
  with timer.phase("step"):
    clock.t += 1.0  # step alone: 1
    with timer.phase("generation"):
      clock.t += 3.0
      assert timer.active == ("step", "generation")
    with timer.phase("update"):
      clock.t += 2.0
    with timer.phase("generation"):
      clock.t += 0.5
    clock.t += 0.25  # step alone: 1.25 in all
  assert timer.seconds() == {"generation": 3.5, "update": 2.0, "step": 1.25}
  assert timer.calls() == {"generation": 2, "update": 1, "step": 1}
  # The values add up to the wall time spent inside phases: 6.75 s.
  assert sum(timer.seconds().values()) == pytest.approx(6.75)
  assert timer.reset() == {"generation": 3.5, "update": 2.0, "step": 1.25}
  assert timer.seconds() == {} and timer.calls() == {}
  with timer.phase("update"):
    clock.t += 1.0
  assert timer.reset() == {"update": 1.0}


def test_add_books_outside_seconds_and_takes_them_from_the_open_phase():
  clock = Clock()
  timer = timing.PhaseTimer(clock)
  timer.add("environment", 0.5)  # no phase open: booked as it is
  with timer.phase("collection"):
    clock.t += 4.0
    timer.add("generation", 3.0)  # measured elsewhere, inside collection
  assert timer.seconds() == {
      "environment": 0.5,
      "collection": 1.0,
      "generation": 3.0,
  }


def test_wrap_times_every_call_even_when_it_raises():
  clock = Clock()
  timer = timing.PhaseTimer(clock)

  def work(x, fail=False):
    clock.t += x
    if fail:
      raise RuntimeError("boom")
    return 2 * x

  timed = timer.wrap(work, "work")
  assert timed(1.5) == 3.0
  with pytest.raises(RuntimeError, match="boom"):
    timed(0.5, fail=True)
  assert timer.seconds() == {"work": 2.0} and timer.calls() == {"work": 2}
  assert timer.active == ()


def test_compilations_are_counted_by_the_open_phase():
  import jax
  import jax.numpy as jnp

  timer = timing.PhaseTimer(count_compiles=True)
  quiet = timing.PhaseTimer()  # counts nothing
  fn = jax.jit(lambda x: jnp.sin(x) * 3.0 - x)
  with timer.phase("update"):
    fn(np.zeros((3, 5, 7)))  # a shape no other test compiles
    fn(np.zeros((3, 5, 7)))  # cached: no compilation
  with timer.phase("generation"):
    fn(np.zeros((3, 5, 9)))
  fn(np.zeros((3, 5, 11)))
  assert timer.compiles() == {"update": 1, "generation": 1, "none": 1}
  took = timer.compile_seconds()
  assert set(took) == {"update", "generation", "none"}
  assert 0 < took["update"] <= timer.seconds()["update"]
  assert quiet.compiles() == {} and quiet.compile_seconds() == {}
  timer.reset()
  assert timer.compiles() == {} and timer.compile_seconds() == {}


def test_collect_books_its_phases_one_engine_call_per_turn(tmp_path):
  from rspo_jax import models
  from rspo_jax.models.config import get_model_config
  from rspo_jax.rollout import collect as collect_lib
  from rspo_jax.rollout import prompts
  from rspo_jax.rollout.engine import SamplingParams
  from rspo_jax.rollout.jax_engine import JaxEngine
  from third_party_envs.vector import VectorEnv

  texts = [
      prompts.build_prompt(
          "toy",
          f"reach the number {t}",
          f"The current number is {t}.",
          ["inc", "dec"],
          [],
          0,
      )
      for t in range(10)
  ]
  texts += ["<think>up</think><action>inc</action>"] * 20
  tok = models.train_tokenizer(texts, 300, str(tmp_path / "tok"))
  cfg = get_model_config("nano", vocab_size=384, num_layers=1)
  engine = JaxEngine(
      models.create_model(cfg, seed=0),
      cfg,
      pad_id=tok.pad_token_id or 0,
      eos_ids=[tok.convert_tokens_to_ids("<|im_end|>")],
      prompt_buckets=(256, 512),
      decode_fn=lambda ids: tok.decode(ids, skip_special_tokens=True),
  )
  calls = []
  generate = engine.generate
  engine.generate = lambda p, s: calls.append(len(p)) or generate(p, s)
  venv = VectorEnv(
      "toy", {"max_steps": 3, "hang_s": 0.0}, 4, use_processes=False
  )
  ccfg = collect_lib.CollectConfig(
      env_name="toy", max_steps=3, max_prompt_tokens=256
  )
  timer = timing.PhaseTimer()
  t0 = time.perf_counter()
  with timer.phase("a_step"):
    records, stats = collect_lib.collect(
        engine,
        venv,
        tok,
        collect_lib.CollectRequest(
            [3, 5],
            2,
            SamplingParams(max_new_tokens=8, stop_strings=("</action>",)),
            seed=1,
        ),
        ccfg,
        timer=timer,
    )
  wall = time.perf_counter() - t0
  venv.close()
  # One call per turn, with every unfinished episode (4, then fewer).
  turns = max(r.step_idx for r in records) + 1
  assert len(calls) == turns and calls[0] == 4
  assert sum(calls) == len(records) == stats["env_steps"]
  seconds = timer.seconds()
  for name in collect_lib.PHASES:
    assert stats[f"{name}_s"] == pytest.approx(seconds[name]) and (
        seconds[name] > 0
    )
  assert sum(seconds.values()) == pytest.approx(wall, abs=1e-3)
  assert seconds["a_step"] < 0.5 * stats["collect_time_s"]
  # A second collection's statistics count its own seconds only.
  _, again = collect_lib.collect(
      engine,
      VectorEnv("toy", {"max_steps": 3, "hang_s": 0.0}, 4, use_processes=False),
      tok,
      collect_lib.CollectRequest(
          [3, 5], 2, SamplingParams(max_new_tokens=8), seed=1
      ),
      ccfg,
      timer=timer,
  )
  assert again["generation_s"] == pytest.approx(
      timer.seconds()["generation"] - seconds["generation"]
  )
  both = collect_lib.combine_rounds([stats, again])
  assert both["generation_s"] == pytest.approx(
      stats["generation_s"] + again["generation_s"]
  )
  assert np.isfinite(both["collect_time_s"])
