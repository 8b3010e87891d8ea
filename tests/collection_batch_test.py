"""A collection's episodes do not depend on how many groups are collected
together (issue 36 item 4, the A-vs-B first-collection gap).

A's collections hold 12 groups (4 of 16 are replayed), B's 16, on the same
engine and environment pool. Here the same tasks T are collected alone and
with more tasks after them (same weights, same seed, the in-process JAX
engine with its CPU defaults: length-sorted chunks of 8 rows, prompt and
batch buckets, blocked prefill). Row i of a turn draws from the stream
(seed, turn, i), i its position among the unfinished episodes, so T's
episodes keep their positions when the extra groups come after them: every
one of T's episodes must be played token for token the same, its engine
log-probs equal to float tolerance although its rows were bucketed with
other rows; and the learner's teacher-forced log-probs of those tokens must
not depend on the batch they are computed in either.
"""

import numpy as np
import pytest

from rspo_jax import batching, models, sharding, warm_start
from rspo_jax import train_step as ts
from rspo_jax.learner import Learner
from rspo_jax.rollout import collect as collect_lib
from rspo_jax.rollout.engine import SamplingParams
from rspo_jax.rollout.jax_engine import JaxEngine
from third_party_envs.vector import VectorEnv

MAX_STEPS = 5
ENV = {"max_steps": MAX_STEPS}
GROUP = 4
TASKS = [3, 10, 17, 24, 31, 38]  # collected alone (A's 12 groups)
EXTRA = [45, 52]  # ... and with these after them (B's 16)
SEED = 11

# ~70 s on 2 busy CPU cores (behaviour cloning, the engine's compilations):
# CI's slow stage.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  """A tiny policy cloned from the toy expert for 60 steps: it wins some
  episodes and loses others, at different turns, so the unfinished rows of
  a turn change (prompts of 127-204 tokens: three prompt buckets)."""
  eps = warm_start.expert_episodes(
      "toy", ENV, range(64), split="train", max_steps=MAX_STEPS
  )
  texts = [t for pair in warm_start.episode_texts(eps, "toy", 2) for t in pair]
  tok = models.train_tokenizer(texts, 1000, str(tmp_path_factory.mktemp("tok")))
  eos = tok.convert_tokens_to_ids("<|im_end|>")
  cfg = models.get_model_config(
      "tiny",
      vocab_size=1024,
      num_layers=1,
      hidden_size=64,
      intermediate_size=128,
      num_heads=2,
      num_kv_heads=1,
      head_dim=32,
      max_position_embeddings=1024,
      eos_token_id=eos,
      bos_token_id=None,
  )
  learner = Learner(
      models.create_model(cfg, seed=0),
      ts.make_optimizer(3e-3),
      ts.make_sft_loss(0.0),
      mesh=sharding.make_mesh((1, 1, 1)),
      rules=sharding.DEFAULT_RULES,
  )
  records = warm_start.sft_records(
      eps, tok, "toy", history_length=2, max_prompt_tokens=1024
  )
  warm_start.train_sft(
      learner, records, steps=60, batch_rows=16, seed=0, progress=False
  )
  return tok, cfg, learner


@pytest.fixture(scope="module")
def collections(policy):
  """(records, stats, chunks) of T alone and of T + EXTRA; ``chunks``: per
  engine chunk, (turn, request rows, batch bucket, prompt bucket)."""
  tok, cfg, learner = policy
  engine = JaxEngine(
      learner.module(),
      cfg,
      pad_id=tok.pad_token_id or 0,
      eos_ids=[cfg.eos_token_id],
      decode_fn=lambda ids: tok.decode(ids, skip_special_tokens=True),
  )
  venv = VectorEnv(
      "toy", ENV, (len(TASKS) + len(EXTRA)) * GROUP, use_processes=False
  )
  ccfg = collect_lib.CollectConfig(
      env_name="toy", max_steps=MAX_STEPS, max_prompt_tokens=1024
  )
  sampling = SamplingParams(
      temperature=1.0, max_new_tokens=24, stop_strings=("</action>",)
  )
  chunks, turn = [], [0]
  generate, chunk = engine.generate, engine._generate_chunk

  def spy_generate(prompts, params):
    turn[0] = (params.seed % 1_000_003) // 2
    return generate(prompts, params)

  def spy_chunk(rows, ids, *a, **kw):
    chunks.append((turn[0], tuple(ids), len(rows), max(len(r) for r in rows)))
    return chunk(rows, ids, *a, **kw)

  engine.generate, engine._generate_chunk = spy_generate, spy_chunk
  out = {}
  try:
    for name, tasks in (("alone", TASKS), ("more", TASKS + EXTRA)):
      chunks.clear()
      records, stats = collect_lib.collect(
          engine,
          venv,
          tok,
          collect_lib.CollectRequest(tasks, GROUP, sampling, seed=SEED),
          ccfg,
      )
      out[name] = (records, stats, list(chunks))
  finally:
    venv.close()
  return out


def _by_traj(records):
  out = {}
  for r in records:
    out.setdefault(r.traj_id, []).append(r)
  return out


def test_shared_tasks_play_the_same_episodes_alone_and_with_more_groups(
    collections,
):
  alone, stats_alone, chunks_alone = collections["alone"]
  more, _, chunks_more = collections["more"]
  a, m = _by_traj(alone), _by_traj(more)
  shared = len(TASKS) * GROUP
  assert sorted(a) == list(range(shared))
  assert sorted(m) == list(range(shared + len(EXTRA) * GROUP))
  for traj in range(shared):
    assert len(a[traj]) == len(m[traj]), traj
    for x, y in zip(a[traj], m[traj]):
      assert x.task_id == y.task_id and x.step_idx == y.step_idx
      np.testing.assert_array_equal(x.prompt_ids, y.prompt_ids)
      np.testing.assert_array_equal(
          x.response_ids,
          y.response_ids,
          err_msg=f"traj {traj} step {x.step_idx}",
      )
      np.testing.assert_allclose(
          x.behavior_logp, y.behavior_logp, atol=1e-5, rtol=0
      )
      assert (x.action, x.invalid, x.won, x.env_reward) == (
          y.action,
          y.invalid,
          y.won,
          y.env_reward,
      )
  won = [a[t][-1].won for t in range(shared)]
  assert np.mean(won) == stats_alone["success_rate"]

  # Not vacuous: wins and losses, episodes ending at different turns
  # (the unfinished rows of a turn change), valid and invalid replies ...
  assert 0 < np.mean(won) < 1
  assert len({len(a[t]) for t in range(shared)}) > 1
  assert {r.invalid for r in alone} == {False, True}

  # ... and T's rows were bucketed differently: a row of T whose chunk
  # (its rows, batch size or prompt bucket) differs between the two
  # collections at the same turn.
  def row_chunks(chunks):
    return {
        (turn, i): (ids, n, longest)
        for turn, ids, n, longest in chunks
        for i in ids
        if i < shared
    }

  ca, cm = row_chunks(chunks_alone), row_chunks(chunks_more)
  assert ca.keys() <= cm.keys()
  moved = [k for k in ca if ca[k] != cm[k]]
  assert len(moved) > shared // 2
  bucket = lambda n: next(b for b in (128, 192, 256) if b >= n)
  assert any(bucket(ca[k][2]) != bucket(cm[k][2]) for k in moved)


def test_teacher_forced_logprobs_do_not_depend_on_the_batch(
    policy, collections
):
  """The learner's log-probs of T's sampled tokens, alone and in the batch
  of every row of both collections (other row count and padded length),
  agree to float tolerance, and with the engine's."""
  _, _, learner = policy
  alone = collections["alone"][0]
  everything = alone + collections["more"][0]

  def logp(records, width):
    batch = batching.records_to_batch(
        records, np.zeros(len(records)), length_multiple=width
    )
    out = learner.apply(batch)
    mask = np.asarray(batch.loss_mask) > 0
    return [out[j, mask[j]] for j in range(len(records))], batch

  few, few_batch = logp(alone, 16)  # tight rows
  many, many_batch = logp(everything, 512)  # twice as many, twice as wide
  assert many_batch.tokens.shape[0] > few_batch.tokens.shape[0]
  assert many_batch.tokens.shape[1] > few_batch.tokens.shape[1]
  for j, r in enumerate(alone):
    assert len(few[j]) == len(r.response_ids)
    np.testing.assert_allclose(few[j], many[j], atol=1e-5, rtol=0)
    np.testing.assert_allclose(few[j], r.behavior_logp, atol=1e-4, rtol=0)
