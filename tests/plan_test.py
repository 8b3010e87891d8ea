"""The dry-run plan: hosts x devices, mesh, servers, memory per device."""

import dataclasses
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
  full_env = {
      k: v
      for k, v in os.environ.items()
      if not k.startswith(("RSPO_", "XLA_PYTHON_CLIENT_"))
  }
  full_env.update(JAX_PLATFORMS="cpu", **env)
  proc = subprocess.run(
      [sys.executable, "launch/train.py", *args, "--dry_run"],
      cwd=ROOT,
      env=full_env,
      capture_output=True,
      text=True,
      timeout=300,
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
  proc = dry_run(
      "--config=configs/alfworld_gigpo.py:model=qwen2.5-7b",
      "--mesh=configs/mesh/gpu16.py",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  p = json.loads(proc.stdout)
  assert (p["hosts"], p["devices_per_host"], p["devices"]) == (2, 8, 16)
  assert p["platform"] == "gpu"
  assert p["mesh"] == {"data": 2, "fsdp": 8, "tensor": 1}
  assert p["cross_host_axes"] == ["data"]
  assert p["model"] == "qwen2.5-7b" and p["rspo"] and p["algorithm"] == "gigpo"
  assert p["rollout"] == {
      "engine": "jax",
      "servers": [],
      "where": "in the learner processes, on the mesh",
  }
  assert p["batch"]["episodes"] == 128 and p["batch"]["micro_batch_rows"] == 16
  # An update: 256 step rows (ALFWorld's mini-batch) in 16 micro-batches.
  assert p["batch"]["update_rows"] == 256
  assert p["batch"]["micro_batches"] == 16
  mem = p["memory_per_device"]
  assert mem["params"] == P_7B
  # fp32 masters + Adam m, v, split 8 ways (fsdp x tensor).
  assert mem["policy_A_GB"] == round(12 * P_7B / 8 / GB, 2) == 10.64
  assert mem["policy_B_GB"] == mem["policy_A_GB"]
  # pi_ref and the PRM backbone: bf16 copies over fsdp x tensor; the
  # engine's bf16 weights whole on each row shard (tensor = 1).
  assert mem["ref_GB"] == mem["prm_GB"] == round(2 * P_7B / 8 / GB, 2)
  assert mem["engine_weights_GB"] == round(2 * P_7B / GB, 2) == 14.19
  # The step's update: grads + new params, m, v in float32.
  assert mem["optimizer_update_GB"] == round(16 * P_7B / 8 / GB, 2)
  # One row per device: 16 rows over data x fsdp = 16; logits on the
  # 512-token response window; cuDNN attention on a GPU; the micro-batch's
  # gradient and their float32 sum.
  assert mem["train_rows_per_device"] == 1 and mem["attention"] == "fused"
  assert (mem["update_rows"], mem["micro_batches"]) == (256, 16)
  assert mem["grads_GB"] == round(2 * 4 * P_7B / 8 / GB, 2)
  assert mem["logits_GB"] == round(2 * 512 * 152064 * 4 / GB, 2)
  # Each host's engine: its 64 episodes over its 8 GPUs in one prefill
  # call, in one pass over the prompt (the cache 1.5 times and the scores
  # fit in 0.9 of the device beside the resident 39 GB); remat 'full'
  # ('dots' does not fit at JAX's default 0.75; tests/plan_fit_test.py).
  assert mem["engine_prefill"] == {
      "rows": 64,
      "prompt": 2048,
      "new": 512,
      "chunk": 0,
  }
  assert {k: v["value"] for k, v in p["choices"].items()} == {
      "model.remat": "full",
      "rollout.prefill_chunk": 0,
      "rollout.engine_max_rows": 0,
  }
  assert p["dtype"]["remat"] == "full"
  assert mem["peak_phase"] == "rollout prefill"
  assert p["device_memory_GB"] == 80.0 and p["usable_GB"] == 60.0
  assert p["mem_fraction"] == {"value": 0.75, "from": "JAX default"}
  assert p["fits"] and p["warnings"] == []


def test_dry_run_env_overrides_hosts_and_rejects_a_bad_layout():
  proc = dry_run(
      "--config=configs/alfworld_gigpo.py:model=qwen2.5-7b",
      "--mesh=configs/mesh/gpu16.py",
      # How launch/cluster/slurm_gpu.sbatch points at its servers.
      "--config.rollout.engine=sglang",
      "--config.rollout.server_urls=http://n2:30000,http://n3:30000",
      RSPO_NUM_HOSTS="4",
      RSPO_DEVICES_PER_HOST="4",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  p = json.loads(proc.stdout)
  assert (p["hosts"], p["devices_per_host"]) == (4, 4)
  assert p["rollout"]["servers"] == ["http://n2:30000", "http://n3:30000"]
  assert p["memory_per_device"]["kv_cache_GB"] == 0.0
  assert p["cross_host_axes"] == ["data", "fsdp"]
  proc = dry_run(
      "--config=configs/alfworld_gigpo.py:model=qwen2.5-7b",
      "--mesh=configs/mesh/gpu16.py",
      RSPO_NUM_HOSTS="3",
  )
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
      (gpu16, (2, 8, 1), 2, 8),
      (gpu8, (1, 8, 1), 1, 8),
      (tpu_v5e_16, (1, 16, 1), 4, 4),
      (single_host, (-1, 1, 1), 0, 0),
  ):
    c = mod.get_config()
    assert (tuple(c.shape), c.num_hosts, c.devices_per_host) == (
        shape,
        hosts,
        per,
    ), mod.__name__
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
  cfg = with_mesh(
      alfworld_gigpo.get_config("model=qwen2.5-7b"), {"shape": (2, 8, 1)}
  )
  lay = plan.resolve_layout(cfg, {"RSPO_NUM_HOSTS": "2"})
  assert (lay["hosts"], lay["devices_per_host"]) == (2, 8)
  assert plan.resolve_layout(cfg, env)["devices"] == 16
  # A -1 mesh with a declared layout takes every device.
  cfg = with_mesh(
      alfworld_gigpo.get_config("model=qwen2.5-7b"), single_host.get_config()
  )
  lay = plan.resolve_layout(
      cfg, {"RSPO_NUM_HOSTS": "4", "RSPO_DEVICES_PER_HOST": "4"}
  )
  assert lay["mesh"] == {"data": 16, "fsdp": 1, "tensor": 1}
  assert lay["cross_host_axes"] == ["data"]
  with pytest.raises(ValueError, match="RSPO_NUM_HOSTS='two' is not an int"):
    plan.resolve_layout(cfg, {"RSPO_NUM_HOSTS": "two"})
  with pytest.raises(ValueError, match=r"does not divide 3 hosts x 1"):
    plan.resolve_layout(
        with_mesh(alfworld_gigpo.get_config(), {"shape": (-1, 2, 1)}),
        {"RSPO_NUM_HOSTS": "3", "RSPO_DEVICES_PER_HOST": "1"},
    )


# --------------------------------------------------------------------------
# Memory terms, by hand on the tiny model
# --------------------------------------------------------------------------


def test_memory_terms_by_hand():
  cfg = alfworld_gigpo.get_config(
      "train.micro_batch_rows=8,rollout.engine=sglang,"
      "rollout.server_urls=http://a:1,rollout.max_prompt_tokens=384,"
      "rollout.max_new_tokens=32"
  )
  # tiny: V 2048, d 256, F 704, L 4, H 4, K 2, hd 64, tied; fp32 masters
  # and compute (w = c = 4); no remat (the CPU scale); oracle rewards. An
  # update: a quarter of a step's 64 rows (max_train_rows) = 16 rows, in 2
  # micro-batches of 8.
  assert (
      plan.step_rows(cfg),
      plan.update_rows(cfg),
      plan.train_rows(cfg),
      plan.micro_batches(cfg),
  ) == (64, 16, 8, 2)
  mcfg = models.get_model_config("tiny")
  p = mcfg.num_params()
  assert p == 3_477_760  # the 3.48 M of DESIGN.md section 4
  mem = plan.memory_per_device(cfg, mcfg, (2, 2, 2))  # shard 4, ways 4
  gb = lambda x: pytest.approx(x / GB)
  t, w, r = 384 + 32, 32, 8 // 4  # tokens, response window, rows a device
  layer = (p - 2048 * 256) / 4
  assert mem["train_rows_per_device"] == r
  assert (mem["update_rows"], mem["micro_batches"]) == (16, 2)
  assert mem["policy_A_GB"] == gb(12 * p / 4)  # masters, m, v
  assert mem["policy_B_GB"] == mem["policy_A_GB"]  # RSPO trains B
  assert mem["critic_GB"] == mem["prm_GB"] == 0.0  # GiGPO, oracle
  assert mem["ref_GB"] == gb(4 * p / 4)
  assert mem["engine_weights_GB"] == mem["kv_cache_GB"] == 0.0  # SGLang
  assert mem["resident_GB"] == gb((12 + 12 + 4) * p / 4)
  # The train step: the update (grads, new params, m, v) or the backward:
  # a micro-batch's grads and their sum, one FSDP-gathered block over
  # tensor = 2, and without remat the 4 blocks' internals -- 1.6 x the
  # widths 8 d + 3 F / 2 + (H + 2K) hd / 2 in fp32 and 2 copies of the
  # [r, H / 2, T, T] scores each -- and the running block's backward.
  assert mem["optimizer_update_GB"] == gb(16 * p / 4)
  assert mem["grads_GB"] == gb(2 * 4 * p / 4)
  assert mem["compute_copy_GB"] == 0
  assert mem["fsdp_gather_GB"] == gb(layer * 4 / 2)
  width = 8 * 256 + 3 * 704 / 2 + (4 + 4) * 64 / 2  # float32 a token
  kept = 1.6 * r * t * 4 * width + 2.0 * r * 2 * t * t * 4  # a block's
  # The running block's backward (remat none): the larger of 2 fp32
  # copies of its weights and 0.8 of a remat block's backward.
  block = max(
      2 * layer * 4 / 2,
      0.8 * (0.6 * r * t * 4 * width + 3.5 * r * 2 * t * t * 4),
  )
  assert mem["activations_GB"] == gb(4 * kept + block)
  assert mem["logits_GB"] == gb(2 * r * w * 2048 / 2 * 4)
  backward = 2 * p + layer * 2 + 4 * kept + block
  assert backward > 16 * p / 4
  train = 16 // 4 * t * 41 + backward  # + the update's 16 rows over 4
  assert mem["train_transient_GB"] == gb(train)
  # pi_old / pi_ref of the update's 16 rows in 2 chunks of 8 (r = 2 a
  # device): the gathered block, two [r, T, d] activations and the larger
  # of 3 score copies and the logits of the window.
  logprob = (
      layer * 2
      + 2 * r * t * 256 * 4
      + max(3 * r * 2 * t * t * 4, r * w * 1024 * 4)
  )
  assert mem["logprob_transient_GB"] == gb(logprob)
  assert mem["peak_phase"] == "train step"
  assert mem["total_GB"] == gb(28 * p / 4 + train)


def test_memory_follows_the_algorithm_and_engine():
  mcfg = models.get_model_config("tiny")
  p = mcfg.num_params()
  ppo = webshop_ppo.get_config(  # PPO baseline: critic, no B; 16 episodes
      "rspo=0,rollout.max_prompt_tokens=384,rollout.max_new_tokens=32,"
      "train.batch_tasks=16"
  )
  layout = plan.resolve_layout(
      with_mesh(ppo, {"shape": (1, 1, 1)}),
      {"RSPO_NUM_HOSTS": "1", "RSPO_DEVICES_PER_HOST": "1"},
  )
  assert layout["platform"] == "unknown"
  layout["platform"] = "gpu"
  mem = plan.memory_per_device(ppo, mcfg, (1, 1, 1), layout)
  assert mem["policy_B_GB"] == 0.0
  assert mem["critic_GB"] == pytest.approx(12 * p / GB)
  # In-process engine: its weights, and a prefill of the 16 episodes at
  # once (an accelerator's defaults) into 384 + 32 slots: the cache twice
  # (unique prompts, decode rows) and 3 fp32 score copies [16, 4, 383, 416].
  assert mem["engine_weights_GB"] == pytest.approx(4 * p / GB)
  assert mem["engine_prefill"] == {
      "rows": 16,
      "prompt": 384,
      "new": 32,
      "chunk": 0,
  }
  kv = 16 * 416 * 4 * 2 * 2 * 64 * 4
  scores = 3 * 16 * 4 * 383 * 416 * 4
  assert mem["kv_cache_GB"] == pytest.approx(kv / GB)
  assert mem["prefill_scores_GB"] == pytest.approx(scores / GB)
  # The cache 1.5 times: the decode rows' and, when prompts repeat, the
  # distinct ones' (at most half the rows).
  assert mem["rollout_transient_GB"] == pytest.approx((1.5 * kv + scores) / GB)
  # On CPU the engine prefills chunks of 8 rows, 64 columns at a time.
  layout["platform"] = "cpu"
  cpu = plan.memory_per_device(ppo, mcfg, (1, 1, 1), layout)
  assert cpu["engine_prefill"] == {
      "rows": 8,
      "prompt": 384,
      "new": 32,
      "chunk": 64,
  }
  # RSPO_H fills D from A's own history: no B.
  hist = alfworld_gigpo.get_config("rspo.data_source=history")
  assert plan.memory_per_device(hist, mcfg, (1, 1, 1))["policy_B_GB"] == 0.0


def test_bf16_compute_terms():
  """bf16 compute over fp32 masters: a bf16 compute copy in the step, bf16
  pi_ref / engine weights, block inputs kept under remat; cuDNN attention
  on a GPU drops the T x T scores, XLA's (CPU; model.attention=xla) keeps
  them."""
  mcfg = models.get_model_config(
      "tiny", dtype="bfloat16", remat=True, scan_layers=True
  )
  p = mcfg.num_params()
  x = dict(rows=16, length=512, window=64)
  gpu = plan.train_step_bytes(mcfg, (1, 4, 1), **x, n_micro=2)
  cpu = plan.train_step_bytes(mcfg, (1, 4, 1), **x, n_micro=2, platform="cpu")
  xla = plan.train_step_bytes(
      dataclasses.replace(mcfg, attention="xla"), (1, 4, 1), **x, n_micro=2
  )
  assert gpu["fused"] and not cpu["fused"] and not xla["fused"]
  r = 16 // 2 // 4
  assert gpu["rows"] == r
  assert gpu["state"] == 12 * p / 4
  assert gpu["grads"] == 2 * 4 * p / 4  # the micro-batch's and the sum
  assert gpu["compute_copy"] == 2 * p / 4
  assert gpu["carries"] == 4 * r * 512 * 256 * 2
  width = 8 * 256 + 3 * 704 + (4 + 4) * 64
  assert gpu["block"] == 0.6 * r * 512 * 4 * width
  assert (
      cpu["block"]
      == xla["block"]
      == (gpu["block"] + 3.5 * r * 4 * 512 * 512 * 4)
  )
  # Unrolled layers: the last block runs the window by the plain path.
  unrolled = dataclasses.replace(mcfg, scan_layers=False)
  assert (
      plan.train_step_bytes(unrolled, (1, 4, 1), **x, n_micro=2)["block"]
      == gpu["block"] + 3.5 * r * 4 * 64 * 512 * 4
  )
  ref = plan.logprob_bytes(
      mcfg, (1, 4, 1), 16, 512, window=64, param_dtype="bfloat16"
  )
  assert ref["params"] == 2 * p / 4 and ref["compute_copy"] == 0.0


def test_usable_memory_follows_the_preallocation_fraction():
  assert plan.mem_fraction({}) == (0.75, "JAX default")
  assert plan.mem_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.92"}) == (
      0.92,
      "XLA_PYTHON_CLIENT_MEM_FRACTION",
  )
  assert plan.mem_fraction({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})[0] == 1
  assert (
      plan.mem_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"}, "tpu")[0]
      == 1.0
  )
  with pytest.raises(ValueError, match="MEM_FRACTION='1.5' is not a number"):
    plan.mem_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"})
  p = plan.make_plan(
      paper_7b(), "w", {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.92"}
  )
  assert p["usable_GB"] == round(0.92 * 80, 2)
  assert p["mem_fraction"]["value"] == 0.92
  low = plan.make_plan(
      paper_7b(), "w", {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
  )
  total = low["memory_per_device"]["total_GB"]
  assert total > 40 and not low["fits"]
  assert low["warnings"] == [
      f"estimated {total:.1f} GB a device exceeds the 40.0 GB JAX may use"
      " (0.5 of the 80 GB of mesh.device_memory_gb,"
      " XLA_PYTHON_CLIENT_MEM_FRACTION)"
  ]
  # The dry run's last line: the key to change (FSDP over all 16 GPUs
  # halves the resident state).
  assert low["stop"].endswith(
      "exceeds the 40.0 GB usable; set mesh.shape=(1,16,1) (FSDP over every"
      " device (--mesh=...:data=1): 34.9 GB)"
  )
  # A prefill given in one pass of all rows (rollout.prefill_chunk=0,
  # rollout.engine_max_rows=0): 3 fp32 score copies [64 / 8 rows, 28
  # heads, 2047, 2560 slots], 13.1 GB, over a quarter of the 40 GB.
  one = plan.make_plan(
      paper_7b(arg=",rollout.prefill_chunk=0," "rollout.engine_max_rows=0"),
      "w",
      {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"},
  )
  scores = 3 * 8 * 28 * 2047 * 2560 * 4 / GB
  assert one["warnings"][-1] == (
      f"the in-process engine's prefill holds {scores:.1f} GB of attention"
      " scores (64 rows of a 2048-token prompt bucket, blocks of all"
      " columns): a narrower rollout.prefill_chunk, fewer rows a call"
      " (rollout.engine_max_rows), fewer episodes a host,"
      " rollout.engine=sglang, or a larger mesh cut it"
  )


def test_gpu_launchers_set_the_fraction_the_plan_uses():
  """single_node_8gpu.sh runs the dry run with the fraction it gives JAX."""
  env = {
      k: v
      for k, v in os.environ.items()
      if not k.startswith(("RSPO_", "XLA_PYTHON_CLIENT_"))
  }
  env.update(JAX_PLATFORMS="cpu", PYTHON=sys.executable)
  proc = subprocess.run(
      ["bash", "launch/cluster/single_node_8gpu.sh", "--dry_run"],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  p = json.loads(proc.stdout)
  assert p["mem_fraction"] == {
      "value": 0.92,
      "from": "XLA_PYTHON_CLIENT_MEM_FRACTION",
  }
  assert p["usable_GB"] == 73.6
  for script in ("single_node_8gpu.sh", "slurm_gpu.sbatch"):
    text = open(os.path.join(ROOT, "launch/cluster", script)).read()
    assert (
        "XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION"
        ":-0.92}" in text
    ), script


# Stand-ins for the launchers' commands: python (learner and SGLang servers
# alike) records its arguments; curl answers /health once the server on that
# port has recorded its own (waiting up to 10 s); srun drops its options
# and runs the command; scontrol lists $STUB_NODES.
_LAUNCH_STUBS = {
    "python": r"""#!/bin/bash
if [[ "$1 $2" == "-m sglang.launch_server" ]]; then
  for ((i = 1; i < $#; i++)); do
    j=$((i + 1)); [[ "${!i}" == --port ]] && port=${!j}
  done
  printf '%s\n' "$@" > "$STUB_OUT/tmp-$port"
  mv "$STUB_OUT/tmp-$port" "$STUB_OUT/server-$port"
else
  n=$(ls "$STUB_OUT" | grep -c '^learner' || true)
  printf '%s\n' "$@" > "$STUB_OUT/learner-$n"
  [[ " $* " == *" --dry_run "* ]] && echo '{}'
fi
exit 0
""",
    "curl": r"""#!/bin/bash
url=${!#}; url=${url%/health}
for ((t = 0; t < 100; t++)); do
  [[ -s "$STUB_OUT/server-${url##*:}" ]] && exit 0
  sleep 0.1
done
exit 1
""",
    "srun": r"""#!/bin/bash
while [[ $# -gt 0 && $1 == -* ]]; do [[ $1 == -w ]] && shift; shift; done
exec "$@"
""",
    "scontrol": r"""#!/bin/bash
printf '%s\n' $STUB_NODES
""",
}


def run_launcher(tmp_path, script, **env):
  """Runs launch/cluster/<script> on the stubs; (servers, learners): each
  SGLang server's and learner invocation's arguments."""
  stubs, out = tmp_path / "bin", tmp_path / "out"
  stubs.mkdir(parents=True)
  out.mkdir()
  for name, text in _LAUNCH_STUBS.items():
    (stubs / name).write_text(text)
    (stubs / name).chmod(0o755)
  full_env = dict(
      PATH=f"{stubs}:{os.environ['PATH']}",
      HOME=os.environ.get("HOME", "/"),
      PYTHON=str(stubs / "python"),
      STUB_OUT=str(out),
      WORKDIR=str(tmp_path / "run"),
      **env,
  )
  proc = subprocess.run(
      ["bash", f"launch/cluster/{script}"],
      cwd=ROOT,
      env=full_env,
      capture_output=True,
      text=True,
      timeout=120,
  )
  read = lambda prefix: [
      (out / f).read_text().split("\n")[:-1]
      for f in sorted(os.listdir(out))
      if f.startswith(prefix)
  ]
  return proc, read("server-"), read("learner-")


ALL_MODULES = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
]


def test_gpu_launchers_start_sglang_with_lora_for_lora_rank(tmp_path):
  """LORA_RANK: the learner's model.lora_rank (LORA_ALPHA, LORA_TARGETS
  too when set), and SGLang servers that take the PEFT adapter: LoRA on,
  the rank, the targets' HF names (lora.peft_config's target_modules)."""
  proc, servers, learners = run_launcher(
      tmp_path / "one",
      "single_node_8gpu.sh",
      ROLLOUT="sglang",
      MODEL_DIR="/m",
      SERVER_GPUS="2",
      LORA_RANK="8",
      LORA_ALPHA="16",
      LORA_TARGETS="q,v,down",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  # The plan's dry run first, then the run, with the same arguments.
  assert len(servers) == 2 and len(learners) == 2
  assert learners[0] == learners[1] + ["--dry_run"]
  for argv in servers:
    assert argv[argv.index("--enable-lora") :] == [
        "--enable-lora",
        "--max-lora-rank",
        "8",
        "--lora-target-modules",
        "q_proj",
        "v_proj",
        "down_proj",
    ]
  for arg in (
      "--config.model.lora_rank=8",
      "--config.model.lora_alpha=16",
      "--config.model.lora_targets=q,v,down",
      "--config.rollout.engine=sglang",
  ):
    assert arg in learners[0]
  # Off by default.
  proc, servers, learners = run_launcher(
      tmp_path / "off",
      "single_node_8gpu.sh",
      ROLLOUT="sglang",
      MODEL_DIR="/m",
      SERVER_GPUS="1",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "--enable-lora" not in servers[0]
  assert not any("lora" in a for a in learners[0])
  proc, _, _ = run_launcher(
      tmp_path / "bad",
      "single_node_8gpu.sh",
      LORA_RANK="8",
      LORA_TARGETS="q,qkv",
  )
  assert proc.returncode == 1 and "qkv is not one of" in proc.stderr
  # Targets separated by spaces (or ;) reach the learner joined by commas:
  # lora.parse_targets splits on , and ; only.
  proc, servers, learners = run_launcher(
      tmp_path / "spaces",
      "single_node_8gpu.sh",
      ROLLOUT="sglang",
      MODEL_DIR="/m",
      SERVER_GPUS="1",
      LORA_RANK="8",
      LORA_TARGETS="q v;gate, up",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert servers[0][servers[0].index("--lora-target-modules") :] == [
      "--lora-target-modules",
      "q_proj",
      "v_proj",
      "gate_proj",
      "up_proj",
  ]
  assert "--config.model.lora_targets=q,v,gate,up" in learners[0]
  # SLURM, one training node: the default targets, all seven projections;
  # the plan's dry run and the learners both train LoRA.
  slurm = dict(
      ROLLOUT="sglang",
      MODEL_DIR="/m",
      GPUS_PER_NODE="2",
      LORA_RANK="16",
      REPO=ROOT,
      SLURM_JOB_NAME="rspo",
      SLURM_JOB_ID="1",
      SLURM_JOB_NODELIST="n[0-1]",
  )
  proc, servers, learners = run_launcher(
      tmp_path / "slurm",
      "slurm_gpu.sbatch",
      TRAIN_NODES="1",
      STUB_NODES="n0 n1",
      **slurm,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert len(servers) == 2 and len(learners) == 2
  for argv in servers:
    assert argv[argv.index("--enable-lora") :] == [
        "--enable-lora",
        "--max-lora-rank",
        "16",
        "--lora-target-modules",
        *ALL_MODULES,
    ]
  for argv in learners:
    assert "--config.model.lora_rank=16" in argv
    assert not any("lora_targets" in a or "lora_alpha" in a for a in argv)
  # Multi-host learners sync merged weights: servers without LoRA.
  proc, servers, learners = run_launcher(
      tmp_path / "multi",
      "slurm_gpu.sbatch",
      TRAIN_NODES="2",
      STUB_NODES="n0 n1 n2",
      **slurm,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert servers and all("--enable-lora" not in a for a in servers)
  assert all("--config.model.lora_rank=16" in a for a in learners)


def test_a_plan_that_does_not_fit_stops_the_run_unless_allowed():
  """7B PPO on 8 GPUs at JAX's default fraction does not fit: the dry run
  and the run (plan.resolve_run, before anything is built) stop with exit
  1 and one line naming the key; --allow_plan_overflow lets both go on."""
  from rspo_jax.errors import ConfigError

  args = (
      "--config=configs/alfworld_ppo.py:model=qwen2.5-7b",
      "--mesh=configs/mesh/gpu8.py",
  )
  proc = dry_run(*args)
  assert proc.returncode == 1
  line = proc.stderr.strip().splitlines()[-1]
  assert line.startswith("error: qwen2.5-7b alfworld ppo on mesh 1x8x1")
  assert line.endswith("(--allow_plan_overflow runs it anyway)")
  assert "set rollout.engine_tensor=2" in line
  proc = dry_run(*args, "--allow_plan_overflow")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not json.loads(proc.stdout)["fits"]
  assert (
      "the memory plan does not fit (--allow_plan_overflow given)"
      in proc.stderr
  )

  cfg = with_mesh(
      alfworld_gigpo.get_config("model=qwen2.5-7b"), gpu8.get_config()
  )
  with cfg.unlocked():
    cfg.algo.name = "ppo"
  with pytest.raises(ConfigError, match="set rollout.engine_tensor=2") as e:
    plan.resolve_run(cfg, {})
  assert "\n" not in str(e.value)
  got = plan.resolve_run(cfg, {plan.ALLOW_ENV: "1"})
  assert "set rollout.engine_tensor=2" in got["warning"]


def test_table_of_the_documented_plans():
  """``... --dry_run | python -m rspo_jax.plan``: docs/scale_out.md's
  tables for Qwen2.5-1.5B on gpu8 and 7B on gpu16 (ALFWorld, paper
  scale, the launchers' 0.92)."""
  env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.92"}
  small = with_mesh(
      alfworld_gigpo.get_config("model=qwen2.5-1.5b"), gpu8.get_config()
  )
  text = plan.table(plan.make_plan(small, "w", env))
  assert text.startswith(
      "qwen2.5-1.5b (1,543,714,304 parameters), alfworld"
      " gigpo + RSPO; 1 x 8 gpu devices, mesh 1x8x1"
  )
  assert "dtypes: params float32, optimizer_state float32," in text
  assert "| **resident** | 7.91 |" in text
  assert "| **total** = resident + train step | **46.17** |" in text
  assert "remat none, scan_layers True" in text  # the plan's choice
  text = plan.table(plan.make_plan(paper_7b(), "w", env))
  assert "updates of 256 rows in 16 micro-batches of 16 (1 a device)" in text
  assert "| **resident** | 39.01 |" in text
  assert "| **total** = resident + train step | **61.06** |" in text
  assert "remat dots, scan_layers True" in text
  assert (
      "| usable: 80 GB x 0.92 (XLA_PYTHON_CLIENT_MEM_FRACTION) | 73.60 |"
      in text
  )
  proc = subprocess.run(
      [sys.executable, "-m", "rspo_jax.plan"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=120,
      input=json.dumps(plan.make_plan(paper_7b(), "w", env)),
  )
  assert proc.returncode == 0 and proc.stdout.strip() == text


def test_sglang_plan_lists_servers_and_needs_them():
  cfg = paper_7b(arg=",rollout.engine=sglang")
  with cfg.unlocked():  # as --config.rollout.server_urls=... sets it
    cfg.rollout.server_urls = "http://n2:30000,http://n3:30000"
  p = plan.make_plan(cfg, "w", {})
  assert p["rollout"]["servers"] == ["http://n2:30000", "http://n3:30000"]
  mem = p["memory_per_device"]
  assert mem["kv_cache_GB"] == mem["engine_weights_GB"] == 0.0
  assert mem["peak_phase"] == "train step"
  # A and B (12 bytes a parameter each), a bf16 pi_ref and PRM (2 each).
  assert math.isclose(
      mem["resident_GB"],
      round((2 * 12 + 2 + 2) * P_7B / 8 / GB, 2),
      abs_tol=0.011,
  )
  cfg = paper_7b(arg=",rollout.engine=sglang")
  with pytest.raises(ValueError, match="rollout.server_urls"):
    plan.make_plan(cfg, "w", {})


def test_tpu_v5e_16_plan_does_not_fit_7b_with_rspo():
  """16 GB chips: A + B (12 bytes/param each over 16 chips), the bf16 ref
  (2 over 16), the PRM's bf16 backbone (2 over a host's 4 chips: one host
  fits it alone, build.prm_mesh) and the engine's bf16 weights (whole on
  each of a host's 4 chips: 2 bytes/param) are 29.3 GB a chip before
  anything runs."""
  p = plan.make_plan(paper_7b(tpu_v5e_16.get_config()), "w", {})
  assert (p["hosts"], p["devices_per_host"]) == (4, 4)
  assert p["cross_host_axes"] == ["fsdp"]
  mem = p["memory_per_device"]
  assert mem["policy_A_GB"] == round(12 * P_7B / 16 / GB, 2)
  assert mem["prm_GB"] == round(2 * P_7B / 4 / GB, 2)
  assert (
      mem["resident_GB"]
      == round(
          (2 * 12 + 2) * P_7B / 16 / GB + 2 * P_7B / 4 / GB + 2 * P_7B / GB, 2
      )
      == 29.26
  )
  # Pallas splash attention where this version has it, else XLA's.
  from rspo_jax.models.config import ATTENTION

  assert mem["attention"] == (
      "fused" if "splash" in ATTENTION else "materialised scores"
  )
  assert p["mem_fraction"]["value"] == 1.0 and not p["fits"]
  # The engine split over a host's 4 chips (rollout.engine_tensor=4):
  # 2 bytes/param over 4 instead of whole on each chip.
  split = paper_7b(tpu_v5e_16.get_config())
  split.rollout.engine_tensor = 4
  mem4 = plan.make_plan(split, "w", {})["memory_per_device"]
  assert mem4["engine_weights_GB"] == round(2 * P_7B / 4 / GB, 2)
  assert mem4["resident_GB"] == round(
      (2 * 12 + 2) * P_7B / 16 / GB + 2 * 2 * P_7B / 4 / GB, 2
  )
  split.rollout.engine_tensor = 3  # the build refuses it too
  with pytest.raises(ValueError, match="engine_tensor=3 does not divide"):
    plan.make_plan(split, "w", {})
  assert p["warnings"][0] == (
      f"estimated {mem['total_GB']:.1f} GB a device exceeds the 16.0 GB JAX"
      " may use (1 of the 16 GB of mesh.device_memory_gb, tpu: no"
      " preallocation fraction)"
  )


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
      "model.overrides=num_layers=1;hidden_size=64,model.tokenizer_vocab=512"
  )
  m = plan.plan_model_config(cfg)
  assert (m.num_layers, m.hidden_size, m.vocab_size) == (1, 64, 512)
  # A checkpoint's config.json wins over the preset.
  small = models.get_model_config("tiny", num_layers=2, vocab_size=300)
  (tmp_path / "config.json").write_text(json.dumps(small.to_hf_dict()))
  cfg = alfworld_gigpo.get_config(
      f"model=qwen2.5-7b,model.checkpoint_dir={tmp_path}"
  )
  m = plan.plan_model_config(cfg)
  assert (m.num_layers, m.vocab_size, m.dtype, m.remat) == (
      2,
      300,
      "bfloat16",
      "full",
  )  # model.remat=auto before the plan


# --------------------------------------------------------------------------
# The estimate against what XLA compiles
# --------------------------------------------------------------------------

# Small shapes that the estimate's terms each dominate somewhere: attention
# scores, logits, the optimizer update, micro-batches, FSDP and tensor
# splits, log-prob chunks. ``tiny``-like widths, and Qwen2.5-1.5B widths
# with 2 layers and a 4 k vocabulary; bf16 compute over fp32 masters,
# remat, scanned layers (the paper's model flags; one case unrolled).
_FLAGS = dict(
    dtype="bfloat16", param_dtype="float32", remat=True, scan_layers=True
)
_TINY = dict(
    _FLAGS,
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=704,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
)
_WIDE = dict(_FLAGS, vocab_size=4096, num_layers=2)
MEMORY_CASES = [
    dict(kind="train_step", rows=8, length=512, window=64, model=_TINY),
    dict(
        kind="train_step",
        rows=8,
        length=512,
        window=256,
        model=dict(_TINY, vocab_size=32768),
    ),
    dict(
        kind="train_step",
        rows=8,
        length=32,
        window=16,
        model=dict(
            _TINY,
            hidden_size=1024,
            intermediate_size=2816,
            num_heads=8,
            head_dim=128,
        ),
    ),
    dict(
        kind="train_step",
        mesh=(1, 8, 1),
        rows=32,
        length=1024,
        window=256,
        n_micro=2,
        model=_WIDE,
    ),
    dict(
        kind="train_step",
        mesh=(1, 4, 2),
        rows=32,
        length=1024,
        window=256,
        n_micro=2,
        model=_WIDE,
    ),
    dict(
        kind="logprob",
        mesh=(2, 4, 1),
        rows=32,
        length=1024,
        window=256,
        model=_WIDE,
    ),
    dict(
        kind="logprob",
        rows=8,
        length=512,
        window=384,
        param_dtype="bfloat16",
        model=dict(_TINY, vocab_size=32768),
    ),
    dict(
        kind="logprob",
        mesh=(1, 8, 1),
        rows=64,
        length=512,
        window=128,
        n_chunks=4,
        model=_WIDE,
    ),
    dict(
        kind="train_step",
        rows=8,
        length=512,
        window=64,
        n_micro=2,
        model=dict(_TINY, scan_layers=False),
    ),
    dict(
        kind="prefill",
        mesh=(1, 8, 1),
        rows=16,
        prompt=1024,
        new=32,
        model=_WIDE,
    ),
]


def estimate(case) -> dict:
  """The plan's bytes for one of ``MEMORY_CASES`` (XLA's attention on
  CPU)."""
  cfg = models.get_model_config("qwen2.5-1.5b", **case["model"])
  mesh = case.get("mesh", (1, 1, 1))
  if case["kind"] == "train_step":
    return plan.train_step_bytes(
        cfg,
        mesh,
        case["rows"],
        case["length"],
        window=case["window"],
        n_micro=case.get("n_micro", 1),
        platform="cpu",
    )
  if case["kind"] == "logprob":
    return plan.logprob_bytes(
        cfg,
        mesh,
        case["rows"],
        case["length"],
        window=case["window"],
        n_chunks=case.get("n_chunks", 1),
        param_dtype=case.get("param_dtype"),
        platform="cpu",
    )
  return plan.prefill_bytes(
      cfg,
      mesh,
      case["rows"],
      case["prompt"],
      case["new"],
      chunk=case.get("chunk", 0),
      gathered=case.get("unique") is not None,
  )


@pytest.mark.slow
def test_estimate_within_25_percent_of_compiled_memory():
  """Each program's estimated peak bytes per device within 25 % of XLA's
  buffer assignment (arguments + outputs - aliased + temporaries) of the
  same program compiled on CPU -- in a subprocess, as XLA reads the
  memory-minimising schedule flag (hlo.MEMORY_XLA_FLAGS) at start-up."""
  from rspo_jax import hlo

  env = dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      XLA_FLAGS=(
          "--xla_force_host_platform_device_count=8 " + hlo.MEMORY_XLA_FLAGS
      ),
  )
  proc = subprocess.run(
      [sys.executable, "-m", "rspo_jax.hlo", json.dumps(MEMORY_CASES)],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  compiled = [
      json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")
  ]
  assert len(compiled) == len(MEMORY_CASES)
  ratios = []
  for case, got in zip(MEMORY_CASES, compiled):
    est = estimate(case)["peak"]
    ratios.append(round(est / got["peak"], 3))
  assert all(0.75 <= r <= 1.25 for r in ratios), list(
      zip([(c["kind"], c.get("mesh", (1, 1, 1))) for c in MEMORY_CASES], ratios)
  )
