"""compare.py worker for rspo_jax (run with /work/venv's python).

  python bench/_peer_ours.py --task {train,gen,matmul} --shape JSON ...

train: the RSPO learner step as ``rspo.py`` runs it -- ``Learner.apply`` for
pi_old and pi_ref log-probs (host round trip included), then
``Learner.train`` (mixed objective, backward, AdamW) -- on ``rows`` x
(prompt + response) tokens, 1/8 of the rows off-policy. Also the update and
one log-prob pass alone, and an RL step with generation: ``JaxEngine``
samples the responses (``rows / group`` distinct prompts, ``group`` samples
each) before the learner step.
gen: ``JaxEngine.generate`` of ``resp_len`` new tokens at temperature 1
(log-probs always returned) for each batch size, distinct prompts.
matmul: the best time of a jitted float32 ``n x n`` ``jnp.dot``.
"""

from __future__ import annotations

from pathlib import Path

import _common
import _peer_template as peer

import jax
import numpy as np

from rspo_jax import build, models, sharding
from rspo_jax import train_step as ts
from rspo_jax.learner import Learner
from rspo_jax.rollout.engine import SamplingParams
from rspo_jax.rollout.jax_engine import JaxEngine

LOSS = ts.PolicyLossConfig(
    alpha=0.125, clip_eps=0.2, kl_coef=0.01, entropy_coef=0.001
)


def model_config(shape: dict):
  return models.get_model_config(shape.get("preset", "tiny"))


def make_engine(module, cfg) -> JaxEngine:
  """The engine as the run builds it (``build.make_engine``: the inference
  copy, unrolled for a scanned model). No stop ids: every row generates
  exactly resp_len tokens, as the peers."""
  return JaxEngine(
      build.inference_model(module, cfg),
      build.engine_config(cfg),
      pad_id=_common.PAD_ID,
      eos_ids=(),
  )


def with_logps(learner: Learner, batch, ref_params):
  """pi_old and pi_ref log-probs into the batch (as rspo.py does)."""
  old = learner.apply(batch)
  ref = learner.apply(batch, params=ref_params)
  behavior = np.where(batch.is_offpolicy[:, None], batch.behavior_logp, old)
  return batch._replace(old_logp=old, ref_logp=ref, behavior_logp=behavior)


def rollout_batch(prompts, results, base):
  """A learner batch of the generated rows (responses right-padded)."""
  p, r = len(prompts[0]), base.tokens.shape[1] - len(prompts[0])
  tokens = np.full(base.tokens.shape, _common.PAD_ID, np.int32)
  attn = np.zeros(base.tokens.shape, np.int32)
  for i, (pr, res) in enumerate(zip(prompts, results)):
    n = min(len(res.token_ids), r)
    tokens[i, :p], tokens[i, p : p + n] = pr, res.token_ids[:n]
    attn[i, : p + n] = 1
  loss_mask = base.loss_mask * attn
  return base._replace(
      tokens=tokens,
      attention_mask=attn,
      loss_mask=loss_mask,
      positions=np.maximum(np.cumsum(attn, 1) - 1, 0).astype(np.int32),
      advantages=base.advantages * attn,
  )


def task_train(args, shape):
  cfg = model_config(shape)
  mesh = sharding.make_mesh((1, 1, 1))
  learner = Learner(
      models.create_model(cfg, seed=0),
      ts.make_optimizer(1e-6),
      ts.make_policy_loss(LOSS),
      mesh=mesh,
      rules=sharding.DEFAULT_RULES,
  )
  ref_params = learner.frozen_params()
  rows, p, r = args.rows, args.prompt_len, args.resp_len
  batch = _common.policy_batch(
      rows, p, r, cfg.vocab_size, n_off=max(rows // 8, 1)
  )
  key = jax.random.key(0)
  update = _common.time_calls(
      lambda: learner.train(batch, key), iters=args.iters
  )
  logp = _common.time_calls(lambda: learner.apply(batch), iters=args.iters)
  full = _common.time_calls(
      lambda: learner.train(with_logps(learner, batch, ref_params), key),
      iters=args.iters,
      warmup=0,
  )
  if args.profile_dir:
    with jax.profiler.trace(str(Path(args.profile_dir) / "ours_train")):
      learner.train(with_logps(learner, batch, ref_params), key)

  engine = make_engine(learner.module(), cfg)
  prompts = _common.prompt_ids(rows, p, cfg.vocab_size, group=args.group)
  sp = SamplingParams(temperature=1.0, max_new_tokens=r)

  def rl_step(i=[0]):
    i[0] += 1
    engine.update_weights(build.engine_params(learner.params, cfg), i[0])
    results = engine.generate(prompts, sp)
    b = with_logps(learner, rollout_batch(prompts, results, batch), ref_params)
    return learner.train(b, key)

  rl = _common.time_calls(rl_step, iters=args.iters)
  peer.report_train(
      shape,
      rows=rows,
      seq_len=p + r,
      logp=logp,
      update=update,
      train=full,
      rl=rl,
      first_s=update["first_s"],
  )


def task_gen(args, shape):
  cfg = model_config(shape)
  module = models.create_model(cfg, seed=0)

  def make_generate(n):
    engine = make_engine(module, cfg)
    prompts = _common.prompt_ids(n, args.prompt_len, cfg.vocab_size, seed=n)
    sp = SamplingParams(
        temperature=1.0, top_p=1.0, max_new_tokens=args.resp_len, seed=0
    )

    def generate():
      out = engine.generate(prompts, sp)
      assert all(len(o.logprobs) == len(o.token_ids) for o in out)
      return sum(len(o.token_ids) for o in out)

    return generate

  def profile(n, generate):
    if args.profile_dir:
      with jax.profiler.trace(str(Path(args.profile_dir) / f"ours_gen{n}")):
        generate()

  peer.generation_task(args, make_generate, after=profile)


def main(argv=None):
  peer.main(
      __doc__,
      {"train": task_train, "gen": task_gen, "matmul": peer.jax_matmul_task},
      argv,
      wall_to_stderr=True,
  )


if __name__ == "__main__":
  main()
