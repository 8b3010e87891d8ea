"""The dry-run plan: hosts x devices, mesh, servers, memory per device."""

import json
import math
import os
import subprocess
import sys

import pytest

from configs import alfworld_gigpo, webshop_ppo
from configs.mesh import gpu8, gpu16, single_host, tpu_v5e_16
from rspo_jax import models, plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GB = 1024**3
P_7B = 7_615_616_512  # Qwen2.5-7B-Instruct, untied lm_head


def dry_run(*args, **env):
  full_env = {k: v for k, v in os.environ.items()
              if not k.startswith("RSPO_")}
  full_env.update(JAX_PLATFORMS="cpu", **env)
  proc = subprocess.run(
      [sys.executable, "launch/train.py", *args, "--dry_run"], cwd=ROOT,
      env=full_env, capture_output=True, text=True, timeout=300,
  )
  return proc


def with_mesh(cfg, mesh_cfg):
  """What ``launch/train.py --mesh=...`` does to the config."""
  with cfg.unlocked():
    cfg.mesh.update(mesh_cfg)
  return cfg


def paper_7b(mesh_cfg=None, arg=""):
  cfg = alfworld_gigpo.get_config("model=qwen2.5-7b" + arg)
  return with_mesh(cfg, mesh_cfg or gpu16.get_config())


# --------------------------------------------------------------------------
# The command of the brief, end to end
# --------------------------------------------------------------------------


def test_dry_run_prints_the_16_gpu_plan():
  proc = dry_run("--config=configs/alfworld_gigpo.py:model=qwen2.5-7b",
                 "--mesh=configs/mesh/gpu16.py")
  assert proc.returncode == 0, proc.stderr[-3000:]
  p = json.loads(proc.stdout)
  assert (p["hosts"], p["devices_per_host"], p["devices"]) == (2, 8, 16)
  assert p["platform"] == "gpu"
  assert p["mesh"] == {"data": 2, "fsdp": 8, "tensor": 1}
  assert p["cross_host_axes"] == ["data"]
  assert p["model"] == "qwen2.5-7b" and p["rspo"] and p["algorithm"] == "gigpo"
  assert p["rollout"] == {"engine": "jax", "servers": [],
                          "where": "in the learner processes, on the mesh"}
  assert p["batch"]["episodes"] == 128 and p["batch"]["micro_batch_rows"] == 16
  mem = p["memory_per_device"]
  assert mem["params"] == P_7B
  # fp32 master weights + Adam m, v + fp32 grads, split 8 ways (fsdp x tensor).
  assert mem["policy_A_GB"] == round(16 * P_7B / 8 / GB, 2) == 14.19
  assert mem["policy_B_GB"] == mem["policy_A_GB"]
  # pi_ref and the engine's weights: bf16 copies (the compute dtype).
  assert mem["ref_GB"] == mem["engine_weights_GB"] == round(
      2 * P_7B / 8 / GB, 2)
  # One row per device: 16 rows over data x fsdp = 16; T = 2048 + 512.
  assert mem["train_rows_per_device"] == 1
  assert mem["logits_GB"] == round(2 * 2560 * 152064 * 4 / GB, 2)
  assert p["fits"] and p["device_memory_GB"] == 80.0
  assert p["warnings"] == []


def test_dry_run_env_overrides_hosts_and_rejects_a_bad_layout():
  proc = dry_run("--config=configs/alfworld_gigpo.py:model=qwen2.5-7b",
                 "--mesh=configs/mesh/gpu16.py",
                 # How launch/cluster/slurm_gpu.sbatch points at its servers.
                 "--config.rollout.engine=sglang",
                 "--config.rollout.server_urls=http://n2:30000,http://n3:30000",
                 RSPO_NUM_HOSTS="4", RSPO_DEVICES_PER_HOST="4")
  assert proc.returncode == 0, proc.stderr[-3000:]
  p = json.loads(proc.stdout)
  assert (p["hosts"], p["devices_per_host"]) == (4, 4)
  assert p["rollout"]["servers"] == ["http://n2:30000", "http://n3:30000"]
  assert p["memory_per_device"]["kv_cache_GB"] == 0.0
  assert p["cross_host_axes"] == ["data", "fsdp"]
  proc = dry_run("--config=configs/alfworld_gigpo.py:model=qwen2.5-7b",
                 "--mesh=configs/mesh/gpu16.py", RSPO_NUM_HOSTS="3")
  assert proc.returncode != 0
  assert "mesh (2, 8, 1) needs 16 devices" in proc.stderr
  assert "3 hosts x 8 devices = 24" in proc.stderr


# --------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,hosts,expected",
    [
        ((2, 8, 1), 2, ["data"]),
        ((1, 16, 1), 4, ["fsdp"]),
        ((1, 4, 2), 2, ["fsdp"]),
        ((2, 4, 2), 4, ["data", "fsdp"]),
        ((1, 8, 1), 1, []),
        ((4, 1, 4), 4, ["data"]),
    ],
)
def test_cross_host_axes(shape, hosts, expected):
  assert plan.cross_host_axes(shape, hosts) == expected


def test_mesh_configs_declare_hosts_and_devices():
  for mod, shape, hosts, per in (
      (gpu16, (2, 8, 1), 2, 8), (gpu8, (1, 8, 1), 1, 8),
      (tpu_v5e_16, (1, 16, 1), 4, 4), (single_host, (-1, 1, 1), 0, 0),
  ):
    c = mod.get_config()
    assert (tuple(c.shape), c.num_hosts, c.devices_per_host) == (
        shape, hosts, per), mod.__name__
  assert tuple(gpu8.get_config("tensor=2").shape) == (1, 4, 2)
  assert tuple(gpu16.get_config("tensor=2").shape) == (2, 4, 2)
  assert tuple(gpu16.get_config("data=1").shape) == (1, 16, 1)
  c = gpu16.get_config("hosts=4,data=4")
  assert (tuple(c.shape), c.num_hosts) == ((4, 8, 1), 4)
  with pytest.raises(ValueError, match="unknown mesh override 'pipe=2'"):
    gpu16.get_config("pipe=2")
  with pytest.raises(ValueError, match="does not divide 16 devices"):
    gpu16.get_config("tensor=3")


def test_layout_sources_in_order():
  cfg = paper_7b()
  env = {"RSPO_NUM_HOSTS": "2", "RSPO_DEVICES_PER_HOST": "8"}
  assert plan.resolve_layout(cfg, {})["hosts"] == 2
  # Only the host count given: the explicit mesh fixes the devices per host.
  cfg = with_mesh(alfworld_gigpo.get_config("model=qwen2.5-7b"),
                  {"shape": (2, 8, 1)})
  lay = plan.resolve_layout(cfg, {"RSPO_NUM_HOSTS": "2"})
  assert (lay["hosts"], lay["devices_per_host"]) == (2, 8)
  assert plan.resolve_layout(cfg, env)["devices"] == 16
  # A -1 mesh with a declared layout takes every device.
  cfg = with_mesh(alfworld_gigpo.get_config("model=qwen2.5-7b"),
                  single_host.get_config())
  lay = plan.resolve_layout(cfg, {"RSPO_NUM_HOSTS": "4",
                                  "RSPO_DEVICES_PER_HOST": "4"})
  assert lay["mesh"] == {"data": 16, "fsdp": 1, "tensor": 1}
  assert lay["cross_host_axes"] == ["data"]
  with pytest.raises(ValueError, match="RSPO_NUM_HOSTS='two' is not an int"):
    plan.resolve_layout(cfg, {"RSPO_NUM_HOSTS": "two"})
  with pytest.raises(ValueError, match=r"does not divide 3 hosts x 1"):
    plan.resolve_layout(
        with_mesh(alfworld_gigpo.get_config(), {"shape": (-1, 2, 1)}),
        {"RSPO_NUM_HOSTS": "3", "RSPO_DEVICES_PER_HOST": "1"})


# --------------------------------------------------------------------------
# Memory terms, by hand on the tiny model
# --------------------------------------------------------------------------


def test_memory_terms_by_hand():
  cfg = alfworld_gigpo.get_config(
      "train.micro_batch_rows=8,rollout.engine=sglang,"
      "rollout.server_urls=http://a:1,rollout.max_prompt_tokens=384,"
      "rollout.max_new_tokens=32")
  # tiny: V 2048, d 256, F 704, L 4, H 4, K 2, hd 64, tied; fp32.
  mcfg = models.get_model_config("tiny")
  p = mcfg.num_params()
  assert p == 3_477_760  # the 3.48 M of DESIGN.md section 4
  mem = plan.memory_per_device(cfg, mcfg, (2, 2, 2))
  t = 384 + 32  # prompt + new tokens (set above)
  rows = 8 // 4  # micro-batch rows over data x fsdp
  assert mem["train_rows_per_device"] == rows
  assert mem["policy_A_GB"] == pytest.approx(16 * p / 4 / GB)
  assert mem["policy_B_GB"] == mem["policy_A_GB"]  # RSPO trains B
  assert mem["critic_GB"] == 0.0  # GiGPO: no critic
  assert mem["ref_GB"] == pytest.approx(4 * p / 4 / GB)
  assert mem["engine_weights_GB"] == mem["kv_cache_GB"] == 0.0  # SGLang
  block = rows * t * (8 * 4 * t + 4 * (3 * 704 + (8 + 4) * 64)) / 2
  assert mem["activations_GB"] == pytest.approx(4 * block / GB)  # no remat
  assert mem["logits_GB"] == pytest.approx(2 * rows * t * 2048 * 4 / 2 / GB)
  layer = (p - 2048 * 256) / 4
  assert mem["fsdp_gather_GB"] == pytest.approx(2 * layer * 4 / 2 / GB)
  resident = (2 * 16 + 4) * p / 4 / GB
  assert mem["resident_GB"] == pytest.approx(resident)
  assert mem["total_GB"] == pytest.approx(
      resident + mem["activations_GB"] + mem["logits_GB"]
      + mem["fsdp_gather_GB"])


def test_memory_follows_the_algorithm_and_engine():
  mcfg = models.get_model_config("tiny")
  p = mcfg.num_params()
  ppo = webshop_ppo.get_config(  # PPO baseline: critic, no B
      "rspo=0,rollout.max_prompt_tokens=384,rollout.max_new_tokens=32")
  mem = plan.memory_per_device(ppo, mcfg, (1, 1, 1))
  assert mem["policy_B_GB"] == 0.0
  assert mem["critic_GB"] == pytest.approx(16 * p / GB)
  # In-process engine: its own weights and a KV cache for 16 episodes.
  assert mem["engine_weights_GB"] == pytest.approx(4 * p / GB)
  kv = 16 * (384 + 32) * 4 * 2 * 2 * 64 * 4
  assert mem["kv_cache_GB"] == pytest.approx(kv / GB)
  # RSPO_H fills D from A's own history: no B.
  hist = alfworld_gigpo.get_config("rspo.data_source=history")
  assert plan.memory_per_device(hist, mcfg, (1, 1, 1))["policy_B_GB"] == 0.0


def test_sglang_plan_lists_servers_and_needs_them():
  cfg = paper_7b(arg=",rollout.engine=sglang")
  with cfg.unlocked():  # as --config.rollout.server_urls=... sets it
    cfg.rollout.server_urls = "http://n2:30000,http://n3:30000"
  p = plan.make_plan(cfg, "w", {})
  assert p["rollout"]["servers"] == ["http://n2:30000", "http://n3:30000"]
  assert p["memory_per_device"]["kv_cache_GB"] == 0.0
  # A and B (16 bytes a parameter each) and a bf16 pi_ref (2).
  assert math.isclose(p["memory_per_device"]["resident_GB"],
                      round((2 * 16 + 2) * P_7B / 8 / GB, 2), abs_tol=0.011)
  cfg = paper_7b(arg=",rollout.engine=sglang")
  with pytest.raises(ValueError, match="rollout.server_urls"):
    plan.make_plan(cfg, "w", {})


def test_tpu_v5e_16_plan_does_not_fit_7b_with_rspo():
  """16 GB chips: A + B (16 bytes/param each), bf16 ref and engine weights
  (2 each) of a 7B model are 36 * 7.6e9 B / 16 = 16.0 GiB a chip before
  any activation."""
  p = plan.make_plan(paper_7b(tpu_v5e_16.get_config()), "w", {})
  assert (p["hosts"], p["devices_per_host"]) == (4, 4)
  assert p["cross_host_axes"] == ["fsdp"]
  assert p["memory_per_device"]["policy_A_GB"] == round(
      16 * P_7B / 16 / GB, 2)
  assert not p["fits"]
  assert p["warnings"] == [
      "estimated 21.9 GB a device exceeds the 16 GB of mesh.device_memory_gb"]


def test_warnings_name_dimensions_that_do_not_split():
  # 6 learner GPUs: 3584 % 6 != 0; 16-row micro-batches over 6 devices.
  cfg = paper_7b(gpu8.get_config("devices_per_host=6"))
  p = plan.make_plan(cfg, "w", {})
  assert p["mesh"] == {"data": 1, "fsdp": 6, "tensor": 1}
  assert p["warnings"][:2] == [
      "hidden_size (embed)=3584 does not split over fsdp=6: those weights"
      " are replicated on that axis (more memory than estimated)",
      "micro-batch of 16 rows does not split over data x fsdp = 6 devices",
  ]
  assert plan.make_plan(paper_7b(), "w", {})["warnings"] == []


def test_plan_model_config_follows_overrides_and_checkpoint(tmp_path):
  cfg = alfworld_gigpo.get_config(
      "model.overrides=num_layers=1;hidden_size=64,model.tokenizer_vocab=512")
  m = plan.plan_model_config(cfg)
  assert (m.num_layers, m.hidden_size, m.vocab_size) == (1, 64, 512)
  # A checkpoint's config.json wins over the preset.
  small = models.get_model_config("tiny", num_layers=2, vocab_size=300)
  (tmp_path / "config.json").write_text(json.dumps(small.to_hf_dict()))
  cfg = alfworld_gigpo.get_config(
      f"model=qwen2.5-7b,model.checkpoint_dir={tmp_path}")
  m = plan.plan_model_config(cfg)
  assert (m.num_layers, m.vocab_size, m.dtype, m.remat) == (
      2, 300, "bfloat16", True)
