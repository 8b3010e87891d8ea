"""rollout.overlap (rspo_jax/overlap.py): A's next collection plays during
A's update, one A step stale, its clip centred on pi_old / pi_behaviour.

Unit tests first (the loss, the thread's errors, the key); then two short
toy runs of the base algorithm, built once for the module: overlap off and
on, two A steps each (the second step's rows are prefetched when on).
"""

import os
import re
import threading
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import toy_grpo
from rspo_e2e_test import MICRO
from rspo_e2e_test import params_of
from configs import webshop_grpo
from rspo_jax import build, losses, overlap, plan
from rspo_jax.errors import ConfigError
from rspo_jax.metrics import read_metrics

# ------------------------------------------------------------ the loss


def _fresh_row(logp, old, beh):
  """One fresh row of two tokens, A = +1 (alpha 0: J_on alone)."""
  f = lambda x: jnp.log(jnp.full((1, 2), x, jnp.float32))
  ones = jnp.ones((1, 2), jnp.float32)
  return (
      f(logp),
      f(old),
      f(beh),
      f(logp),
      ones,
      ones,
      jnp.zeros((1,), bool),
      None,
  )


def _loss(args, overlap):
  return losses.mixed_objective(
      *args,
      losses.LossConfig(
          alpha=0.0,
          clip_eps=0.2,
          kl_coef=0.0,
          entropy_coef=0.0,
          overlap=overlap,
      ),
  )


def test_stale_fresh_rows_clip_around_pi_old_over_pi_behaviour():
  """pi = 0.8, pi_old = 0.5, pi_behaviour = 0.4: r = 2, c = 1.25, the
  window [1.05, 1.45], so the objective is 1.45 A; without
  ``overlap`` the row is PPO's: r = 1.6, held at 1.2 A."""
  args = _fresh_row(0.8, 0.5, 0.4)
  loss, m = _loss(args, True)
  np.testing.assert_allclose(
      [loss, m["ratio_mean_on"]], [-1.45, 2.0], rtol=1e-6
  )
  loss, m = _loss(args, False)
  np.testing.assert_allclose([loss, m["ratio_mean_on"]], [-1.2, 1.6], rtol=1e-6)


def test_behaviour_equal_to_pi_old_is_ppo_exactly():
  """Rows of lag 0 get behaviour := pi_old (update.py): the same numbers,
  bit for bit, with or without ``overlap``."""
  args = _fresh_row(0.7, 0.5, 0.5)
  (a, ma), (b, mb) = _loss(args, True), _loss(args, False)
  assert float(a) == float(b)
  assert all(float(ma[k]) == float(mb[k]) for k in ma)


def test_the_key_is_off_by_default_validated_and_reaches_the_loss():
  cfg = toy_grpo.get_config()
  assert cfg.rollout.overlap == 0
  assert not build.policy_loss_config(cfg, rspo=True).overlap
  cfg = toy_grpo.get_config("rollout.overlap=1")
  assert build.policy_loss_config(cfg, rspo=False).overlap
  with pytest.raises(ConfigError, match=re.escape("rollout.overlap=2")):
    toy_grpo.get_config("rollout.overlap=2")


# ------------------------------------------------------------ devices


def _layout(devices):
  return {"mesh": {"data": 1, "fsdp": devices, "tensor": 1}}


def test_overlap_on_several_devices_stops_with_one_line(tmp_path):
  """Overlap's thread would launch compiled programs (the engine's
  decode, a log-prob pass) beside the update's collectives on the same
  devices: refused on more than one device, at the plan and at start,
  in one line naming the keys; allowed where the thread only talks HTTP
  (SGLang without the log-prob pass)."""
  cfg = toy_grpo.get_config("rollout.overlap=1")
  assert plan.overlap_problem(cfg, _layout(1)) is None
  problem = plan.overlap_problem(cfg, _layout(8))
  assert problem.startswith("rollout.overlap=1 on 8 devices:")
  assert "\n" not in problem and "set rollout.overlap=0" in problem
  assert "in-process engine's prefill and decode" in problem
  sglang = toy_grpo.get_config(
      "rollout.overlap=1,rollout.engine=sglang,rollout.turn_barriers=0"
  )
  assert "behaviour log-prob pass" in plan.overlap_problem(sglang, _layout(8))
  with sglang.unlocked():
    sglang.rspo.recompute_behavior_logp = False
  assert plan.overlap_problem(sglang, _layout(8)) is None
  assert plan.overlap_problem(toy_grpo.get_config(), _layout(8)) is None
  # A run on the tests' 8 CPU devices stops before anything is built.
  with cfg.unlocked():
    cfg.mesh.shape = (-1, 1, 1)
  with pytest.raises(ConfigError, match="rollout.overlap=1 on 8 devices"):
    build.build_run(cfg, str(tmp_path), progress=False)
  assert not os.listdir(tmp_path)


def test_plan_counts_the_snapshot_and_the_collection_beside_the_update():
  """1.5B WebShop GRPO on one GPU with overlap: the snapshot is one more
  float32 copy of the weights (w P: 4 bytes x P); the train phase holds
  the thread's prefill (the rollout transient) beside the update."""
  off = webshop_grpo.get_config("model=qwen2.5-1.5b")
  on = webshop_grpo.get_config("model=qwen2.5-1.5b,rollout.overlap=1")
  mcfg = plan.plan_model_config(off)
  mem = {
      k: plan.memory_per_device(c, mcfg, (1, 1, 1))
      for k, c in (("off", off), ("on", on))
  }
  assert mem["off"]["overlap_snapshot_GB"] == 0.0
  assert mem["on"]["overlap_snapshot_GB"] == pytest.approx(
      4 * mcfg.num_params() / 2**30
  )
  assert mem["on"]["resident_GB"] == pytest.approx(
      mem["off"]["resident_GB"] + mem["on"]["overlap_snapshot_GB"]
  )
  assert mem["on"]["train_transient_GB"] == pytest.approx(
      mem["off"]["train_transient_GB"]
      + max(
          mem["off"]["rollout_transient_GB"], mem["off"]["logprob_transient_GB"]
      )
  )
  p = plan.make_plan(with_gpu1(on), "w", {})
  assert p["stop_by"] == "memory" or p["fits"]
  assert "| overlap: the next collection's weights |" in plan.table(p)
  assert "overlap" not in plan.table(plan.make_plan(with_gpu1(off), "w", {}))


def with_gpu1(cfg):
  from configs.mesh import gpu1

  mesh = gpu1.get_config()
  with cfg.unlocked():
    cfg.mesh.update(mesh)
    cfg.mesh.shape = tuple(mesh.shape)
  return cfg


# ------------------------------------------------------------ the thread


def _boom_in_the_environment(timer):
  del timer
  raise ValueError("environment step failed")


def test_an_error_in_the_thread_is_raised_in_the_main_thread_with_traceback():
  p = overlap.Prefetch(
      _boom_in_the_environment, weights_step=4, collection=9, task_ids=[1]
  )
  with pytest.raises(overlap.OverlapError, match="after A step 4") as e:
    p.result()
  assert isinstance(e.value.__cause__, ValueError)
  assert "_boom_in_the_environment" in str(e.value)  # the thread's frames
  assert "_boom_in_the_environment" in "".join(
      traceback.format_exception(e.value.__cause__)
  )


def test_the_thread_runs_beside_the_caller_and_returns_its_value():
  go = threading.Event()

  def play(timer):
    assert go.wait(30)  # the caller runs on meanwhile
    with timer.phase("generation"):
      return "rows"

  p = overlap.Prefetch(play, weights_step=0, collection=1, task_ids=[0])
  go.set()
  assert p.result() == "rows"
  assert set(p.seconds()) == {"overlap_generation_s", "overlap_collect_s"}


# ------------------------------------------------------------ the loop

# The base algorithm (no B phase), one group of 2, two A steps; a random
# policy (no warm start) and a large learning rate, so one step moves it.
TOY = (
    MICRO + ",rspo=0,steps=2,sft.enabled=False,train.batch_tasks=1,"
    "env.max_steps=2,rollout.max_new_tokens=8,train.lr=1e-3"
)


def _run(tmp_dir, overlap_on: int):
  """A run of TOY to its end; records, per A update (step order): the
  parameters before it, the first batch trained and its metrics. The run
  stays open (closed by the fixture)."""
  cfg = toy_grpo.get_config(f"{TOY},rollout.overlap={overlap_on}")
  with cfg.unlocked():  # overlap runs on one device (plan.overlap_problem)
    cfg.mesh.shape = (1, 1, 1)
  run = build.build_run(cfg, str(tmp_dir), progress=False)
  t, seen = run.trainer, []
  update, train = t.update, t.a.train

  def spy_update(learner, *args, **kw):
    seen.append(
        {
            "params": params_of(learner),
            "stale_on": kw["stale_on"],
            "batches": [],
        }
    )
    return update(learner, *args, **kw)

  def spy_train(batch, rng):
    m = train(batch, rng)
    seen[-1]["batches"].append((batch, m))
    return m

  t.update, t.a.train = spy_update, spy_train
  t.run()
  t.ckpt.wait()
  return run, seen, read_metrics(str(tmp_dir / "metrics.jsonl"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  made = {}
  try:
    for on in (0, 1):
      made[on] = _run(tmp_path_factory.mktemp(f"overlap{on}"), on)
    yield made
  finally:
    for run, _, _ in made.values():
      run.close()


def _a_rows(metrics):
  return [r for r in metrics if r.get("phase") == "A"]


def test_off_logs_nothing_new_and_lag_0_changes_no_number(runs):
  """Off: no overlap_* metric, no collect_wait phase. On, A's first step
  (nothing prefetched yet: lag 0) is off's bit for bit -- its metrics and
  the weights it leaves -- while its next collection plays beside it."""
  (_, off, m_off), (_, on, m_on) = runs[0], runs[1]
  assert not any(
      k.startswith("overlap") or k.startswith("collect_wait")
      for r in m_off
      for k in r
  )
  first_off, first_on = _a_rows(m_off)[0], _a_rows(m_on)[0]
  assert first_on["overlap_policy_lag"] == 0.0
  same = {
      k: v
      for k, v in first_off.items()  # all but seconds and rates
      if not k.endswith("_s") and k != "time"
  }
  assert {k: first_on[k] for k in same} == same
  for x, y in zip(off[1]["params"], on[1]["params"]):  # after step 1
    np.testing.assert_array_equal(x, y)


def test_on_the_second_step_trains_on_rows_of_the_first_steps_weights(runs):
  """On: step 2's rows were played on the weights before step 1's update
  (lag 1, logged); their behaviour log-probs are those weights' (not
  pi_old's), and the loss's ratio at the first update is pi_old /
  pi_behaviour on them (it would be exactly 1 if they were taken for
  pi_old's own samples)."""
  run, seen, metrics = runs[1]
  rows = _a_rows(metrics)
  assert [r["overlap_policy_lag"] for r in rows] == [0.0, 1.0]
  assert [s["stale_on"] for s in seen] == [False, True]
  assert rows[1]["overlap_logp_gap_on"] > 0
  assert rows[1]["overlap_collect_s"] > 0
  batch, m = seen[1]["batches"][0]
  mask = (np.asarray(batch.loss_mask) > 0) & ~np.asarray(batch.is_offpolicy)[
      :, None
  ]
  theta_0 = jax.tree.unflatten(
      jax.tree.structure(run.trainer.a.params), seen[0]["params"]
  )
  want = np.asarray(run.trainer.a.apply(batch, params=theta_0))
  beh, old = np.asarray(batch.behavior_logp), np.asarray(batch.old_logp)
  np.testing.assert_allclose(beh[mask], want[mask], atol=1e-5)
  assert np.abs(beh[mask] - old[mask]).mean() > 1e-3
  gaps = np.concatenate(
      [  # every update's rows: the step's start
          np.abs(np.asarray(b.old_logp) - np.asarray(b.behavior_logp))[
              (np.asarray(b.loss_mask) > 0)
              & ~np.asarray(b.is_offpolicy)[:, None]
          ]
          for b, _ in seen[1]["batches"]
      ]
  )
  assert rows[1]["overlap_logp_gap_on"] == pytest.approx(gaps.mean(), rel=1e-4)
  ratio = np.exp(old[mask] - beh[mask]).mean()  # logp = pi_old here
  assert abs(ratio - 1) > 1e-4
  assert m["ratio_mean_on"] == pytest.approx(ratio, rel=1e-5)


def test_an_error_in_the_background_collection_stops_the_next_step(runs):
  """The collection thread raises; the next A step raises it, with the
  thread's traceback, instead of waiting for rows that never come."""
  t = runs[1][0].trainer

  def broken(*args, **kw):
    assert threading.current_thread() is not threading.main_thread()
    raise ValueError("environment worker lost")

  t._play = broken  # pylint: disable=protected-access
  t._start_prefetch(1)  # pylint: disable=protected-access
  with pytest.raises(
      overlap.OverlapError, match="environment worker lost"
  ) as e:
    t.a_step()
  assert "in broken" in str(e.value)
  assert t.prefetch is None
