"""The main loop: B's phase when due, A's steps, evaluation, checkpoints.

The body of ``RSPOTrainer.run``: each A step's metrics, its "time" row
and B's "B_time" row, evaluation every ``train.eval_every`` A steps, the
loop's end (``end_loop``, its checkpoint, then ``_after_loop_saved``) and
a stop request honoured between steps. It drives the trainer through its
methods, so a test that replaces one (``a_step``, ``b_phase``) replaces it
here too.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from rspo_jax import checkpoint
from rspo_jax.learner import Learner
from rspo_jax.loop import progress as progress_lib


def run(trainer, evaluate: Optional[Callable[[Learner, int], dict]] = None):
  """Runs ``trainer`` until A has taken ``train.total_steps`` steps;
  ``evaluate(A, a_steps)``'s result is written as an "eval" row. Returns
  the loop's state."""
  c, s = trainer.cfg, trainer.state
  total = c.train.total_steps
  b_steps = trainer.k if trainer.uses_b and not c.rspo.dense_only else 0
  bar = trainer._bar = progress_lib.progress_bar(
      total,
      s.a_steps,
      s.phase,
      trainer.k,
      b_steps,
      trainer.progress,
      trainer.run_name,
  )
  while s.a_steps < total:
    if s.phase == "B":
      t0, steps0 = time.perf_counter(), s.env_steps
      ran_b = trainer.uses_b and not c.rspo.dense_only
      if ran_b:
        trainer.b_phase()
      s.phase = "A"
      with trainer.timer.phase("checkpoint"):
        trainer.save()
      if ran_b:
        trainer.metrics.write(
            s.a_steps,
            "B_time",
            progress_lib.phase_seconds(trainer.timer, t0, steps0, s.env_steps),
        )
      trainer._stop_if_requested(save=False)  # just saved
    t0, steps0 = time.perf_counter(), s.env_steps
    m = trainer.a_step()
    s.a_steps += 1
    m["step_time_s"] = time.perf_counter() - t0
    m["episodes_per_s"] = m.get("rollout_episodes", 0.0) / m["step_time_s"]
    m.update(loop=s.loop, loop_step=(s.a_steps - 1) % trainer.k)
    trainer.metrics.write(s.a_steps, "A", m)
    if (
        evaluate is not None
        and c.train.eval_every
        and s.a_steps % c.train.eval_every == 0
        and s.a_steps < total
    ):
      with trainer.timer.phase("evaluation"):
        if trainer.prefetch is not None:  # it plays on the same engine
          trainer.prefetch.wait()
        result = evaluate(trainer.a, s.a_steps)
      trainer.metrics.write(s.a_steps, "eval", result)
    loop_done = s.a_steps % trainer.k == 0 or s.a_steps == total
    if loop_done:
      trainer.end_loop()
    saved = checkpoint.due(s.a_steps, c.train.checkpoint_every, loop_done)
    with trainer.timer.phase("checkpoint"):
      if saved:
        trainer.save()
      if loop_done and trainer.keeps_loop_data:
        trainer.ckpt.wait()  # the loop's checkpoint on disk before D goes
    trainer.metrics.write(
        s.a_steps,
        "time",
        progress_lib.phase_seconds(trainer.timer, t0, steps0, s.env_steps),
    )
    if loop_done:
      trainer._after_loop_saved()  # a crash before it: finished on resume
    bar.set_postfix(
        loop=m["loop"],
        phase="A",
        success=f"{m.get('rollout_success_rate', 0):.2f}",
        loss=f"{m.get('loss', 0):.3f}",
        refresh=False,
    )
    bar.update(1)
    trainer._stop_if_requested(save=not saved)
  bar.close()
  trainer._bar = None
  return s
