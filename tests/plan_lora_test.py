"""The plan with LoRA (model.lora_rank > 0): the adapters' parameter count
by hand and against the model's own LoRAParam shapes, what each resident
term becomes, and the dry-run table's LoRA rows. No compile (~2 s)."""

import math

from flax import nnx

from configs import alfworld_gigpo, alfworld_ppo
from configs.mesh import gpu1, gpu8
from rspo_jax import models, plan

GB = 1024**3


def with_mesh(cfg, mesh_cfg):
  with cfg.unlocked():
    cfg.mesh.update(mesh_cfg)
    cfg.mesh.shape = tuple(mesh_cfg.shape)
  return cfg


def test_adapter_params_of_qwen2_5_1_5b_by_hand():
  """r (in + out) per target and block: d 1536, 12 query heads and 2 KV
  heads of 128, F 8960, 28 blocks. PEFT prints the same for this model
  (all 7 linear projections, r=16): 18,464,768 trainable of 1,562,179,072
  (= the base's 1,543,714,304 + the adapters)."""
  d, q, kv, f, r, layers = 1536, 12 * 128, 2 * 128, 8960, 16, 28
  per_layer = r * (
      (d + q)
      + (d + kv)
      + (d + kv)
      + (q + d)  # q, k, v, o
      + (d + f)
      + (d + f)
      + (f + d)
  )  # gate, up, down
  assert per_layer == 16 * 41216 == 659_456
  mcfg = models.get_model_config("qwen2.5-1.5b", lora_rank=16)
  assert plan.adapter_params(mcfg) == layers * per_layer == 18_464_768
  assert mcfg.num_params() + 18_464_768 == 1_562_179_072
  attn = models.get_model_config(
      "qwen2.5-1.5b", lora_rank=8, lora_targets=("q", "v")
  )
  assert plan.adapter_params(attn) == layers * 8 * ((d + q) + (d + kv))
  assert plan.adapter_params(models.get_model_config("qwen2.5-1.5b")) == 0


def test_adapter_params_match_the_models_lora_params():
  """The count equals the LoRAParam shapes of a LoRA Transformer (abstract:
  nnx.eval_shape, nothing allocated): every target unrolled, two of them
  scanned ([L, ...] adapters)."""
  from rspo_jax.models.transformer import Transformer

  for targets, scan in (
      ((("q", "k", "v", "o", "gate", "up", "down")), False),
      (("q", "down"), True),
  ):
    mcfg = models.get_model_config(
        "tiny", lora_rank=4, lora_targets=targets, scan_layers=scan
    )
    model = nnx.eval_shape(lambda: Transformer(mcfg, rngs=nnx.Rngs(0)))
    leaves = nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
    assert len(leaves) == (1 if scan else 4) * 2 * len(targets)
    assert sum(
        math.prod(v.get_value().shape) for _, v in leaves
    ) == plan.adapter_params(mcfg)


def test_lora_resident_terms_and_unchanged_full_fine_tuning():
  """1.5B ALFWorld GiGPO + RSPO on 8 GPUs: full fine-tuning is as before;
  with LoRA the base is counted once (2 P / 8), A and B are 12 P_a / 8
  each, pi_ref 4 P_a / 8 (zeroed adapters), the engine as before."""
  env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.92"}
  full = plan.make_plan(
      with_mesh(
          alfworld_gigpo.get_config("model=qwen2.5-1.5b"), gpu8.get_config()
      ),
      "w",
      env,
  )
  lora = plan.make_plan(
      with_mesh(
          alfworld_gigpo.get_config("model=qwen2.5-1.5b,model.lora_rank=16"),
          gpu8.get_config(),
      ),
      "w",
      env,
  )
  f, m = full["memory_per_device"], lora["memory_per_device"]
  assert "lora" not in full and f["base_GB"] == 0 and f["adapter_params"] == 0
  assert f["resident_GB"] == 7.91 and round(f["total_GB"], 2) == 46.17
  n, n_a = m["params"], m["adapter_params"]
  assert n == 1_543_714_304 and n_a == 18_464_768
  assert lora["lora"] == {
      "rank": 16,
      "alpha": 32.0,
      "targets": ["q", "k", "v", "o", "gate", "up", "down"],
      "adapter_params": n_a,
      "adapter_fraction": round(n_a / n, 5),
      "adapter_MB": round(4 * n_a / 2**20, 1),
      "frozen_base_GB": round(2 * n / GB, 2),
      # train.lr x the default train.lora_lr_multiplier (issue 54)
      "learning_rate": "lr 1e-06 x LoRA multiplier 10 = 1e-05 on adapters",
  }
  assert lora["dtype"]["frozen_base"] == "bfloat16"
  assert "frozen_base" not in full["dtype"]
  assert m["base_GB"] == round(2 * n / 8 / GB, 2)
  assert m["policy_A_GB"] == m["policy_B_GB"] == round(12 * n_a / 8 / GB, 2)
  assert m["ref_GB"] == round(4 * n_a / 8 / GB, 2)
  assert m["engine_weights_GB"] == f["engine_weights_GB"]
  assert m["prm_GB"] == f["prm_GB"]
  # The train step: adapter gradients and update; the compute copy of the
  # adapters only (the base is bf16 already); activations as before.
  assert m["grads_GB"] == round(2 * 4 * n_a / 8 / GB, 2)
  assert m["optimizer_update_GB"] == round(4 * 4 * n_a / 8 / GB, 2)
  assert m["compute_copy_GB"] == round(2 * n_a / 8 / GB, 2)
  assert m["activations_GB"] == f["activations_GB"]
  assert m["resident_GB"] < f["resident_GB"] - 4
  # The critic (PPO) is its own adapters on the same base.
  ppo = plan.make_plan(
      with_mesh(
          alfworld_ppo.get_config("model=qwen2.5-1.5b,model.lora_rank=16"),
          gpu8.get_config(),
      ),
      "w",
      env,
  )["memory_per_device"]
  assert ppo["critic_GB"] == ppo["policy_A_GB"] == m["policy_A_GB"]
  assert ppo["base_GB"] == m["base_GB"]


def test_lora_table_rows():
  p = plan.make_plan(
      with_mesh(
          alfworld_gigpo.get_config("model=qwen2.5-7b,model.lora_rank=16"),
          gpu1.get_config(),
      ),
      "w",
      {},
  )
  text = plan.table(p)
  head = text.splitlines()[0]
  assert "1 x 1 gpu devices, mesh 1x1x1" in head
  assert (
      "LoRA r=16 on q,k,v,o,gate,up,down: 40,370,176 adapter parameters"
      " (154 MB float32)"
  ) in head
  base = p["memory_per_device"]["base_GB"]
  assert (
      f"| frozen base (LoRA): compute dtype, shared by A, B, pi_ref,"
      f" critic | {base:.2f} |"
  ) in text
  assert "| policy A: float32 adapters, Adam m and v |" in text
  assert "| pi_ref: the base with A's adapters zeroed (no copy) |" in text
  assert "| fits | **no** |" in text
