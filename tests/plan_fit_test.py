"""Every shipped paper preset x mesh fits, by the plan's own choices (remat
policy, prefill blocks, the engine's rows a call), or stops with one line
naming the key to change.

The plan package's functions only (rspo_jax/plan/): no model is built,
nothing compiles (~2 s)."""

import dataclasses
import itertools

import pytest

from configs import (
    alfworld_gigpo,
    alfworld_grpo,
    alfworld_ppo,
    webshop_gigpo,
    webshop_grpo,
    webshop_ppo,
)
from configs.mesh import gpu1, gpu8, gpu16, tpu_v5e_16
from rspo_jax import models, plan

GB = 1024**3
CONFIGS = {
    "webshop_grpo": webshop_grpo,
    "webshop_gigpo": webshop_gigpo,
    "webshop_ppo": webshop_ppo,
    "alfworld_grpo": alfworld_grpo,
    "alfworld_gigpo": alfworld_gigpo,
    "alfworld_ppo": alfworld_ppo,
}
MESHES = {"gpu8": gpu8, "gpu16": gpu16, "tpu_v5e_16": tpu_v5e_16}
ONE_GPU = {"gpu1": gpu1}
MODELS = ("qwen2.5-1.5b", "qwen2.5-7b")
# What does not fit at JAX's default 0.75 of a GPU (what `launch/train.py
# --dry_run` plans with when nothing sets XLA_PYTHON_CLIENT_MEM_FRACTION),
# with the key the stop line names. 7B on 16 GB chips: A, B, pi_ref, the
# PRM and the engine's weights are 29 GB a chip before anything runs. 7B
# PPO on GPUs: the critic's 10.6 GB more.
STOPS = {
    ("qwen2.5-7b", "webshop_ppo", "gpu8"): "set rollout.engine_tensor=2",
    ("qwen2.5-7b", "webshop_ppo", "gpu16"): "set rollout.engine_tensor=2",
    ("qwen2.5-7b", "alfworld_ppo", "gpu8"): "set rollout.engine_tensor=2",
    ("qwen2.5-7b", "alfworld_ppo", "gpu16"): "set rollout.engine_tensor=2",
    **{
        ("qwen2.5-7b", c, "tpu_v5e_16"): "no one key fits it (closest:"
        " rollout.engine=sglang"
        for c in CONFIGS
    },
}


# LoRA (model.lora_rank=16) on one 80 GB GPU at JAX's default 0.75, GRPO:
# None = fits, else what the stop line names. The frozen bf16 base, the
# engine's merged weights and the PRM's backbone are 3 x 2 P (8.6 GiB at
# 1.5B, 42.6 at 7B); the engine's prefill of a host's 128 episodes goes in
# calls of as many rows as fit (rollout.engine_max_rows: 64 at 1.5B
# WebShop); at 7B what is left does not hold the train step or the
# prefill: SGLang servers take the engine off the device.
ONE_GPU_LORA = {
    ("qwen2.5-1.5b", "webshop_grpo"): None,
    ("qwen2.5-1.5b", "alfworld_grpo"): None,
    ("qwen2.5-7b", "webshop_grpo"): "set rollout.engine=sglang",
    ("qwen2.5-7b", "alfworld_grpo"): "set rollout.engine=sglang",
}


def paper(config: str, model: str, mesh: str, arg: str = ""):
  cfg = CONFIGS[config].get_config(f"model={model}{arg}")
  mesh_cfg = {**MESHES, **ONE_GPU}[mesh].get_config()
  with cfg.unlocked():  # what launch/train.py --mesh=... does
    cfg.mesh.update(mesh_cfg)
    cfg.mesh.shape = tuple(mesh_cfg.shape)
  return cfg


def test_every_preset_and_mesh_fits_or_names_the_key_to_change():
  table = {}
  for model, config, mesh in itertools.product(MODELS, CONFIGS, MESHES):
    p = plan.make_plan(paper(config, model, mesh), "w", {})
    mem, usable = p["memory_per_device"], p["usable_GB"]
    chosen = {k: v["value"] for k, v in p["choices"].items()}
    assert p["choices"]["model.remat"]["by"] == plan.REMAT_BY
    assert p["choices"]["rollout.prefill_chunk"]["by"] == plan.CHUNK_BY
    assert p["choices"]["rollout.engine_max_rows"]["by"] == plan.ROWS_BY
    assert p["dtype"]["remat"] == chosen["model.remat"]
    assert mem["engine_prefill"]["chunk"] == chosen["rollout.prefill_chunk"]
    cap = chosen["rollout.engine_max_rows"]
    assert cap == 0 or mem["engine_prefill"]["rows"] == cap
    table[model, config, mesh] = p.get("stop")
    if p["fits"]:
      assert "stop" not in p and mem["total_GB"] <= usable
      continue
    stop = p["stop"]
    assert "\n" not in stop and stop.startswith(
        f"{model} {p['env']} {p['algorithm']} on mesh"
    )
    assert f"exceeds the {usable:.1f} GB usable" in stop
  stops = {k: v for k, v in table.items() if v}
  assert set(stops) == set(STOPS), sorted(stops)
  for key, stop in stops.items():
    assert STOPS[key] in stop, (key, stop)


def test_the_named_change_fits():
  """The key a stop line names, set as it says, makes the plan fit."""
  p = plan.make_plan(paper("alfworld_ppo", "qwen2.5-7b", "gpu8"), "w", {})
  assert not p["fits"]
  fixed = plan.make_plan(
      paper("alfworld_ppo", "qwen2.5-7b", "gpu8", ",rollout.engine_tensor=2"),
      "w",
      {},
  )
  assert fixed["fits"] and "stop" not in fixed
  assert fixed["memory_per_device"]["engine_weights_GB"] == pytest.approx(
      p["memory_per_device"]["engine_weights_GB"] / 2, abs=0.01
  )


def test_prefill_chunk_is_the_widest_that_fits():
  """7B WebShop on 8 GPUs: one pass over a 4096-token prompt bucket holds
  94 GB of scores a GPU; the plan takes the widest block that fits."""
  cfg = paper("webshop_grpo", "qwen2.5-7b", "gpu8")
  layout = plan.resolve_layout(cfg, {})
  room = 0.75 * 80 * plan.CHOICE_HEADROOM
  assert plan.prefill_chunks(4096) == [0, 2048, 1024, 512, 342]
  p = plan.make_plan(cfg, "w", {})
  chunk = p["choices"]["rollout.prefill_chunk"]["value"]
  assert p["fits"] and chunk == 342
  mcfg = plan.plan_model_config(plan.resolved(cfg, p["choices"]))

  def rollout(c):
    mem = plan.memory_per_device(cfg, mcfg, (1, 8, 1), layout, prefill_chunk=c)
    return mem["resident_GB"] + mem["rollout_transient_GB"]

  assert rollout(0) > rollout(1024) > rollout(512) > room >= rollout(342)
  # Scores [16 rows a GPU, 28 heads, block, keys], 3 float32 copies: one
  # pass 4095 queries x 4608 slots; blocks of 342 (4095 / 12: the engine's
  # narrowest) over 4095 slots.
  assert p["memory_per_device"]["prefill_scores_GB"] == round(
      3 * 16 * 28 * 342 * 4095 * 4 / GB, 2
  )
  # A given chunk is kept; 0 is one pass: the plan takes fewer rows a
  # call instead (16 of the 128: [2 a GPU, 28, 4095, 4608] scores).
  given = plan.make_plan(
      paper("webshop_grpo", "qwen2.5-7b", "gpu8", ",rollout.prefill_chunk=0"),
      "w",
      {},
  )
  assert given["choices"]["rollout.prefill_chunk"] == {
      "value": 0,
      "by": "config",
  }
  assert given["choices"]["rollout.engine_max_rows"] == {
      "value": 16,
      "by": plan.ROWS_BY,
  }
  assert given["fits"] and given["memory_per_device"][
      "prefill_scores_GB"
  ] == round(3 * 2 * 28 * 4095 * 4608 * 4 / GB, 2)
  # Both given: one pass over all 128 rows does not fit, and the warning
  # names both keys.
  both = plan.make_plan(
      paper(
          "webshop_grpo",
          "qwen2.5-7b",
          "gpu8",
          ",rollout.prefill_chunk=0," "rollout.engine_max_rows=0",
      ),
      "w",
      {},
  )
  assert both["choices"]["rollout.engine_max_rows"] == {
      "value": 0,
      "by": "config",
  }
  assert not both["fits"]
  assert "rollout.prefill_chunk" in both["warnings"][-1]
  assert "rollout.engine_max_rows" in both["warnings"][-1]
  # 1.5B ALFWorld on 8 GPUs: the whole prefill fits, one pass.
  small = plan.make_plan(
      paper("alfworld_grpo", "qwen2.5-1.5b", "gpu8"), "w", {}
  )
  assert small["choices"]["rollout.prefill_chunk"]["value"] == 0


def test_remat_activations_order_none_dots_full():
  for preset, mesh in (("qwen2.5-1.5b", (1, 8, 1)), ("qwen2.5-7b", (1, 4, 2))):
    acts = {}
    for policy in ("none", "dots", "full"):
      mcfg = models.get_model_config(
          preset, dtype="bfloat16", remat=policy, scan_layers=True
      )
      acts[policy] = plan.train_step_bytes(
          mcfg, mesh, 16, 2560, window=512, n_micro=2
      )["activations"]
    assert acts["none"] > acts["dots"] > acts["full"] > 0, acts


def test_remat_choice_by_hand():
  """7B ALFWorld on 2 x 8 GPUs at the launchers' 0.92 (micro-batches of 16
  rows: 1 row of 2560 tokens a GPU): without remat the 28 blocks'
  internals do not fit beside the 39 GB resident in 0.9 of the 73.6 GB;
  'dots' keeps each block's input and weight matmul outputs, L r T (c (3 d
  + (H + 2K) hd) + 4 x 2 F) (gate and up in float32, as XLA:CPU keeps
  them), and fits."""
  env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.92"}
  cfg = paper("alfworld_gigpo", "qwen2.5-7b", "gpu16")
  p = plan.make_plan(cfg, "w", env)
  assert p["choices"]["model.remat"]["value"] == "dots" and p["fits"]
  L, r, T, c = 28, 1, 2560, 2
  d, H, K, hd, F = 3584, 28, 4, 128, 18944
  dots = L * r * T * (c * (3 * d + (H + 2 * K) * hd) + 4 * 2 * F)
  full = L * r * T * c * d
  mcfg = plan.plan_model_config(plan.resolved(cfg, p["choices"]))
  x = plan._dims(mcfg, (2, 8, 1))
  assert plan.remat_carries(x, r, T, "dots") == dots
  assert plan.remat_carries(x, r, T, "full") == full
  # 'none': 1.6 x every block's float32 internals (the scores fused).
  width = 8 * d + 3 * F + (H + 2 * K) * hd
  assert plan.remat_carries(x, r, T, "none", fused=True) == pytest.approx(
      L * 1.6 * r * T * 4 * width
  )
  layout = plan.resolve_layout(cfg, env)

  def train(policy):
    mem = plan.memory_per_device(
        cfg, dataclasses.replace(mcfg, remat=policy), (2, 8, 1), layout
    )
    return mem["resident_GB"] + mem["train_transient_GB"]

  room = 0.92 * 80 * 0.9
  assert train("none") > room >= train("dots") > train("full")
  assert p["dtype"]["remat"] == "dots"
  # At JAX's default 0.75 'dots' does not fit in 0.9 of 60 GB: 'full'.
  assert (
      plan.make_plan(cfg, "w", {})["choices"]["model.remat"]["value"] == "full"
  )
  # Given, a policy is kept; the old bools still read.
  for given, policy in (("full", "full"), ("True", "full"), ("False", "none")):
    q = plan.make_plan(
        paper("alfworld_gigpo", "qwen2.5-7b", "gpu16", f",model.remat={given}"),
        "w",
        {},
    )
    assert q["choices"]["model.remat"] == {"value": policy, "by": "config"}


def test_remat_key_accepts_policies_and_old_bools_only():
  from configs.base import validate
  from rspo_jax.errors import ConfigError

  from rspo_jax.models.config import remat_policy

  assert [
      remat_policy(v) for v in (False, True, "none", "DOTS", "full", "true")
  ] == ["none", "full", "none", "dots", "full", "full"]
  with pytest.raises(ValueError, match="remat 'some' unknown; use one of"):
    remat_policy("some")
  with pytest.raises(ValueError, match="remat 1 unknown"):
    models.get_model_config("tiny", remat=1)
  cfg = paper("alfworld_gigpo", "qwen2.5-7b", "gpu16")
  cfg.model.remat = "some"
  with pytest.raises(ConfigError, match="bad config value model.remat="):
    validate(cfg)
  cfg = paper("alfworld_gigpo", "qwen2.5-7b", "gpu16")
  cfg.rollout.prefill_chunk = -1
  with pytest.raises(
      ConfigError, match="bad config value rollout.prefill_chunk=-1"
  ):
    validate(cfg)
  # Without a device memory to plan with: 'auto' is 'full', the engine
  # keeps its default blocks.
  cfg = paper("alfworld_gigpo", "qwen2.5-7b", "gpu16")
  cfg.mesh.device_memory_gb = 0.0
  chosen = plan.choose(cfg, plan.resolve_layout(cfg, {}), None)
  assert chosen["model.remat"]["value"] == "full"
  assert chosen["rollout.prefill_chunk"]["value"] is None
  assert chosen["rollout.engine_max_rows"]["value"] is None
  cfg.rollout.engine_max_rows = -1
  with pytest.raises(
      ConfigError, match="bad config value rollout.engine_max_rows=-1"
  ):
    validate(cfg)


@pytest.mark.parametrize("model,config", sorted(ONE_GPU_LORA))
def test_lora_on_one_gpu_fits_or_names_the_key(model, config):
  """docs/scale_out.md's one-GPU rows: LoRA r=16, the plan's own answer."""
  p = plan.make_plan(
      paper(config, model, "gpu1", ",model.lora_rank=16"), "w", {}
  )
  assert p["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1}
  assert p["usable_GB"] == 60.0 and p["lora"]["rank"] == 16
  mem, expected = p["memory_per_device"], ONE_GPU_LORA[model, config]
  n, n_a = mem["params"], mem["adapter_params"]
  assert n_a == plan.adapter_params(
      plan.plan_model_config(
          paper(config, model, "gpu1", ",model.lora_rank=16")
      )
  )
  # One bf16 base; float32 adapters, m, v for A and B; pi_ref = A's
  # adapters zeroed; the engine's merged bf16 weights; the PRM's backbone.
  assert mem["base_GB"] == pytest.approx(2 * n / GB, abs=0.01)
  assert (
      mem["policy_A_GB"]
      == mem["policy_B_GB"]
      == pytest.approx(12 * n_a / GB, abs=0.01)
  )
  assert mem["ref_GB"] == pytest.approx(4 * n_a / GB, abs=0.01)
  assert mem["engine_weights_GB"] == mem["prm_GB"] == mem["base_GB"]
  assert mem["resident_GB"] == pytest.approx(
      6 * n / GB + 28 * n_a / GB, abs=0.02
  )
  assert mem["grads_GB"] == pytest.approx(2 * 4 * n_a / GB, abs=0.01)
  if expected is None:
    assert p["fits"] and "stop" not in p
    return
  assert not p["fits"] and expected in p["stop"], p["stop"]
  assert "\n" not in p["stop"] and p["stop"].startswith(
      f"{model} {p['env']} grpo on mesh 1x1x1 (1 gpu devices)"
  )


def test_engine_row_cap_by_hand():
  """1.5B WebShop, LoRA r=16, one GPU at JAX's default 0.75 (room: 0.9 x
  60 GiB = 54): 9.11 GiB resident. A prefill of all 128 episodes in one
  call at the narrowest block (342 of the 4096-token prompt bucket) holds
  the cache of 128 x 4608 slots x 28 blocks x 2 x 2 KV heads x 128 x 2
  bytes (15.75 GiB) twice (blocks: XLA's copy) and 3 float32 score copies
  [128, 12, 342, 4095] (24.04 GiB): 9.11 + 55.54 > 54. At 64 rows a call
  the cache halves (7.88) and blocks of 512 fit (scores 18.0): 42.85
  GiB; blocks of 1024 would not (9.11 + 15.75 + 36.0)."""
  cfg = paper("webshop_grpo", "qwen2.5-1.5b", "gpu1", ",model.lora_rank=16")
  p = plan.make_plan(cfg, "w", {})
  mem = p["memory_per_device"]
  assert p["fits"] and mem["total_GB"] == 42.85
  assert {k: v["value"] for k, v in p["choices"].items()} == {
      "model.remat": "full",
      "rollout.prefill_chunk": 512,
      "rollout.engine_max_rows": 64,
  }
  assert mem["engine_prefill"] == {
      "rows": 64,
      "prompt": 4096,
      "new": 512,
      "chunk": 512,
  }
  cache = 64 * 4608 * 28 * 2 * 2 * 128 * 2
  scores = 3 * 64 * 12 * 512 * 4095 * 4
  assert mem["kv_cache_GB"] == round(cache / GB, 2) == 7.88
  assert mem["prefill_scores_GB"] == round(scores / GB, 2) == 18.0
  assert mem["second_cache_GB"] == mem["kv_cache_GB"]
  assert mem["rollout_transient_GB"] == round((2 * cache + scores) / GB, 2)
  layout = plan.resolve_layout(cfg, {})
  assert plan.engine_row_caps(cfg, layout) == [0, 64, 32, 16, 8, 4, 2, 1]
  mcfg = plan.plan_model_config(plan.resolved(cfg, p["choices"]))
  whole = plan.memory_per_device(
      cfg, mcfg, (1, 1, 1), layout, prefill_chunk=342, max_rows=0
  )
  assert whole["engine_prefill"]["rows"] == 128
  assert whole["kv_cache_GB"] == round(2 * cache / GB, 2) == 15.75
  assert whole["resident_GB"] + whole["rollout_transient_GB"] == pytest.approx(
      9.11 + 2 * 15.75 + 24.04, abs=0.02
  )
  assert whole["total_GB"] > 54
  # Calls of 48 rows at most pad to a bucket: the cap is 32.
  eng = plan.engine_shapes(
      plan.with_keys(cfg, {"rollout.engine_max_rows": 48}), layout
  )
  assert (eng["rows"], eng["calls_per_turn"]) == (32, 4)
