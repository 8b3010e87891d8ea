"""B's phase of a loop: B := copy(A), then k steps of B on the dense reward
(adaptive B: until B wins enough, loop/adaptive_b.py).

The bodies of ``RSPOTrainer.b_phase`` and ``RSPOTrainer.make_b``: they
read and set the trainer's parts (its learners, collector, buffer D,
state, metrics) through the trainer, so a test that replaces one of its
methods (``update``, ``collect_groups``) replaces it here too.
"""

from __future__ import annotations

from rspo_jax import distributed, faults
from rspo_jax import train_step as ts
from rspo_jax.learner import Learner
from rspo_jax.loop import adaptive_b, b_store, host_stats, seeds
from rspo_jax.models import lora
from rspo_jax.types import POLICY_B


def run(trainer) -> None:
  """B := copy(A); k steps of B on the dense reward (RSPO_O: the
  outcome reward); then B's stored collection (``store_replay``)."""
  if trainer.leader:  # multi-host: D (every host's shards) is cleared once
    trainer.buffer.clear()
  distributed.barrier("rspo_replay_cleared")
  trainer.state.replay_used = []
  loop = trainer.state.loop
  b = trainer.make_b()
  b_critic = trainer.critic.copy() if trainer.critic is not None else None
  r, t = trainer.cfg.rspo, trainer.cfg.train
  source = "outcome" if r.data_source == "outcome" else "dense"
  target, i, reached = None, 0, False
  while i < adaptive_b.max_steps(r):  # k steps (adaptive: up to b_k_max)
    on, stats = trainer.collect_groups(b, t.batch_tasks, POLICY_B)
    if i == 0:  # B = A: the start of B's lift
      trainer.b_first = b_store.first_collection(
          on, stats, trainer.state.collections, trainer.multihost
      )
      target = adaptive_b.win_target(
          trainer.b_first.stats["success"],
          t.batch_tasks * t.group_size,
          r.b_win_multiple,
      )
    if i >= trainer.k:  # adaptive B past its k steps: does B win enough?
      check = host_stats.play_stats(on, trainer.multihost)["success"]
      if check >= target:
        reached = True
        break
      if trainer._bar is not None:
        trainer._bar.total += 1
    m = trainer.update(
        b, b_critic, on, [], source, step_key=seeds.b_step_key(loop, i)
    )
    faults.maybe_fail("b_phase")
    m.update({f"rollout_{k}": v for k, v in stats.items()})
    m.update(host_stats.reward_means(on, trainer.multihost))
    m.update(loop=loop, b_step=loop * adaptive_b.max_steps(r) + i + 1)
    trainer.metrics.write(trainer.state.a_steps, "B", m)
    if trainer._bar is not None:
      trainer._bar.set_postfix(
          loop=loop,
          phase="B",
          success=(f"{m['rollout_success_rate']:.2f}"),
          refresh=False,
      )
      trainer._bar.update(1)
    trainer._stop_if_requested(save=False)  # B is redone from A on resume
    i += 1
  if adaptive_b.is_adaptive(r):
    trainer.metrics.write(
        trainer.state.a_steps,
        "B_stop",
        {
            "loop": loop,
            "b_steps": i,
            "b_win_target": target,
            "b_target_reached": reached,
        },
    )
  if trainer.decoupled:
    trainer.decoupled_b.start(
        b,
        trainer.state,
        sync_engine=trainer.sync_engine,
        replay_of=b_store.replay_of(trainer.cfg, trainer.b_first),
    )
  else:
    trainer.store_replay(b)
  del b, b_critic  # B exists only during its phase (and its collection)


def make_b(trainer) -> Learner:
  """B := copy(A): A's parameters; A's Adam moments or fresh ones
  (``rspo.copy_optimizer_state``); A's optimizer, or one of B's own
  learning rate / warm-up (``rspo.b_lr``, ``rspo.b_warmup_steps``; 0 =
  A's). B's own optimizer (``trainer._b_tx``) and its jitted steps
  (``trainer._b_steps``) are kept across loops."""
  r, t = trainer.cfg.rspo, trainer.cfg.train
  lr = r.b_lr or t.lr
  warmup = r.b_warmup_steps or t.warmup_steps
  if lr == t.lr and warmup == t.warmup_steps:
    return trainer.a.copy(copy_opt_state=r.copy_optimizer_state)
  if trainer._b_tx is None:
    trainer._b_tx = ts.make_optimizer(
        lr,
        grad_clip=t.grad_clip,
        weight_decay=t.weight_decay,
        warmup_steps=warmup,
        adapter_lr_multiplier=lora.lr_multiplier(trainer.cfg),
    )  # the LoRA rule, as A's
  return trainer.a.copy(
      copy_opt_state=r.copy_optimizer_state,
      tx=trainer._b_tx,
      steps=trainer._b_steps,
  )
