"""compare.py worker for Tunix (run with /work/venv-tunix's python).

  python bench/_peer_tunix.py --task {train,gen,matmul} --shape JSON ...

Model: ``tunix.models.qwen2.model.Qwen2`` with the given shape, random init,
float32, on a 1 x 1 ('fsdp', 'tp') mesh with Auto axes.

train: an ``RLCluster`` (vanilla rollout, actor, reference) driven by
``GRPOLearner`` pieces, as its ``train`` loop calls them:
``_generate_and_compute_advantage`` (rollout, reference and old-policy
log-probs -- num_iterations=2 so the old ones are computed --, rewards,
advantages) then ``rl_cluster.update_actor`` (GRPO loss, backward, AdamW).
``rows / group`` distinct prompts, ``group`` generations each; beta 0.01,
epsilon 0.2, token-mean loss. The learner step without generation is
``get_old_per_token_logps + get_ref_per_token_logps + update_actor``.
gen: ``tunix.generate.sampler.Sampler`` at temperature 1, top_p 1 with
``return_logprobs=True``, no stop token (every row makes resp_len tokens).
"""

from __future__ import annotations

import tempfile
import time

import _common
import _peer_template as peer

import jax
import optax
from flax import nnx
from jax.sharding import AxisType


def model_config(shape: dict):
  from tunix.models.qwen2 import model as qwen2

  return qwen2.ModelConfig(
      num_layers=shape["num_layers"],
      vocab_size=shape["vocab_size"],
      embed_dim=shape["hidden_size"],
      hidden_dim=shape["intermediate_size"],
      num_heads=shape["num_heads"],
      head_dim=shape["head_dim"],
      num_kv_heads=shape["num_kv_heads"],
      rope_theta=int(shape.get("rope_theta", 1_000_000)),
      norm_eps=shape.get("rms_norm_eps", 1e-6),
      use_tied_embedding=shape.get("tie_word_embeddings", True),
  )


def make_mesh():
  return jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2)


def new_model(cfg, mesh, seed=0):
  from tunix.models.qwen2 import model as qwen2

  with jax.set_mesh(mesh):
    return qwen2.Qwen2(cfg, rngs=nnx.Rngs(seed))


def task_train(args, shape):
  from tunix.rl import rl_cluster as rlc
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.rollout import base_rollout

  rows, p, r = args.rows, args.prompt_len, args.resp_len
  cfg, mesh = model_config(shape), make_mesh()
  tok = _common.word_tokenizer(shape["vocab_size"], tempfile.mkdtemp())
  rollout = base_rollout.RolloutConfig(
      max_tokens_to_generate=r,
      max_prompt_length=p,
      kv_cache_size=p + r + 8,
      temperature=1.0,
      top_p=1.0,
      eos_tokens=[_common.EOS_ID],
  )
  training = rlc.RLTrainingConfig(
      actor_optimizer=optax.chain(
          optax.clip_by_global_norm(1.0), optax.adamw(1e-6)
      ),
      eval_every_n_steps=10**9,
      max_steps=10**9,
  )
  cluster = rlc.RLCluster(
      actor=new_model(cfg, mesh),
      reference=new_model(cfg, mesh),
      tokenizer=tok,
      cluster_config=rlc.ClusterConfig(
          role_to_mesh={
              rlc.Role.ACTOR: mesh,
              rlc.Role.REFERENCE: mesh,
              rlc.Role.ROLLOUT: mesh,
          },
          rollout_engine="vanilla",
          offload_to_cpu=False,
          training_config=training,
          rollout_config=rollout,
      ),
  )
  learner = grpo_learner.GRPOLearner(
      rl_cluster=cluster,
      algo_config=grpo_learner.GRPOConfig(
          num_generations=args.group,
          num_iterations=2,
          beta=0.01,
          epsilon=0.2,
          loss_agg_mode="token-mean",
      ),
      reward_fns=lambda prompts, completions, **kw: [
          float(len(c)) for c in completions
      ],
  )
  # What GRPOLearner.train sets before its first step.
  learner._rollout_micro_batch_size = rows
  learner._compute_logps_micro_batch_size = rows
  texts = [
      _common.ids_to_text(x)
      for x in _common.prompt_ids(
          rows, p, shape["vocab_size"], group=args.group
      )
  ]

  def update(example):
    cluster.update_actor([example], None)
    jax.block_until_ready(nnx.state(cluster.actor_trainer.model))

  rl_s, rl_cpu, update_s, update_cpu, first_s = [], [], [], [], None
  for i in range(args.iters + 1):
    t0, c0 = time.perf_counter(), time.process_time()
    example = learner._generate_and_compute_advantage({"prompts": texts})
    jax.block_until_ready(example.advantages)
    t1, c1 = time.perf_counter(), time.process_time()
    update(example)
    t2, c2 = time.perf_counter(), time.process_time()
    if i == 0:
      first_s = t2 - t1
    else:
      rl_s.append(t2 - t0)
      rl_cpu.append(c2 - c0)
      update_s.append(t2 - t1)
      update_cpu.append(c2 - c1)
  ids = (example.prompt_ids, example.completion_ids)
  old = _common.time_calls(
      lambda: cluster.get_old_per_token_logps(*ids),
      iters=args.iters,
      sync=jax.block_until_ready,
  )
  ref = _common.time_calls(
      lambda: cluster.get_ref_per_token_logps(
          *ids, _common.PAD_ID, _common.EOS_ID
      ),
      iters=args.iters,
      sync=jax.block_until_ready,
  )
  upd = peer.median_times(update_s, update_cpu)
  peer.report_train(
      shape,
      rows=rows,
      seq_len=p + r,
      logp=old,
      update=upd,
      train=peer.add_times(old, ref, upd),
      rl=peer.median_times(rl_s, rl_cpu),
      first_s=first_s,
  )


def task_gen(args, shape):
  from tunix.generate import sampler as sampler_lib

  cfg, mesh = model_config(shape), make_mesh()
  model = new_model(cfg, mesh)
  tok = _common.word_tokenizer(shape["vocab_size"], tempfile.mkdtemp())
  sampler = sampler_lib.Sampler(
      transformer=model,
      tokenizer=tok,
      cache_config=sampler_lib.CacheConfig(
          cache_size=args.prompt_len + args.resp_len + 8,
          num_layers=shape["num_layers"],
          num_kv_heads=shape["num_kv_heads"],
          head_dim=shape["head_dim"],
      ),
  )

  def make_generate(n):
    texts = [
        _common.ids_to_text(x)
        for x in _common.prompt_ids(
            n, args.prompt_len, shape["vocab_size"], seed=n
        )
    ]

    def generate():
      with jax.set_mesh(mesh):
        out = sampler(
            texts,
            max_generation_steps=args.resp_len,
            max_prompt_length=args.prompt_len,
            return_logprobs=True,
            temperature=1.0,
            top_p=1.0,
            seed=0,
            eos_tokens=[-1],  # never matches: always resp_len tokens
        )
      return sum(len(t) for t in out.tokens)

    return generate

  peer.generation_task(args, make_generate)


def main(argv=None):
  peer.main(
      __doc__,
      {"train": task_train, "gen": task_gen, "matmul": peer.jax_matmul_task},
      argv,
  )


if __name__ == "__main__":
  main()
