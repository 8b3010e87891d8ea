"""bench/ helpers: FLOP counts, batches, mesh layouts, comparison rows.

Behaviour only -- no timing is asserted anywhere (benchmarks measure speed).
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import _common  # noqa: E402


def _load(name):
  spec = importlib.util.spec_from_file_location(
      f"bench_{name}", BENCH / f"{name}.py"
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


TINY = dict(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=704,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
)


def test_matmul_params_of_tiny_by_hand():
  # per layer: q,o 256*4*64*2 = 131072; k,v 256*2*64*2 = 65536;
  # mlp 3*256*704 = 540672 -> 737280; x4 = 2949120; + table 2048*256.
  assert _common.matmul_params(TINY) == 2949120 + 524288
  # num_params adds 4 * 512 qkv biases and 9 * 256 norm scales.
  from rspo_jax import models  # pylint: disable=g-import-not-at-top

  assert models.get_model_config("tiny").num_params() == (
      2949120 + 524288 + 4 * 512 + 9 * 256
  )


def test_train_flops_is_three_forwards_palm_formula():
  n = 2949120 + 524288
  tokens, seq = 10, 8
  attn = 12 * 4 * 4 * 64 * seq * tokens  # 12 L H Dh S tokens
  assert _common.train_flops(TINY, tokens, seq) == 6 * n * tokens + attn
  assert _common.forward_flops(TINY, tokens, seq) * 3 == (
      _common.train_flops(TINY, tokens, seq)
  )


def test_ratio_always_favours_us_above_one():
  assert _common.ratio(300.0, 100.0) == 3.0  # rate: ours / theirs
  assert _common.ratio(2.0, 8.0, higher_is_better=False) == 4.0  # seconds
  assert _common.ratio(None, 1.0) is None
  assert _common.ratio(1.0, 0.0) is None


def test_time_calls_counts_warmup_and_iters():
  calls = []
  t = _common.time_calls(lambda: calls.append(1), iters=3, warmup=2)
  assert len(calls) == 5 and t["iters"] == 3
  assert t["first_s"] >= 0 and t["median_s"] >= t["min_s"] >= 0
  with pytest.raises(ValueError, match="iters"):
    _common.time_calls(lambda: None, iters=0)


def test_policy_batch_layout():
  b = _common.policy_batch(8, 5, 3, 64, n_off=2, seed=1)
  assert b.tokens.shape == (8, 8) and b.tokens.dtype == np.int32
  assert b.tokens.min() >= 0 and b.tokens.max() < 64
  np.testing.assert_array_equal(b.loss_mask[:, :5], 0.0)
  np.testing.assert_array_equal(b.loss_mask[:, 5:], 1.0)
  np.testing.assert_array_equal(b.advantages[:, :5], 0.0)
  np.testing.assert_array_equal(b.is_offpolicy, [0] * 6 + [1] * 2)
  np.testing.assert_array_equal(b.behavior_logp[:6], b.old_logp[:6])
  np.testing.assert_allclose(b.behavior_logp[6:], b.old_logp[6:] + 0.05)
  np.testing.assert_array_equal(b.positions[3], np.arange(8))
  with pytest.raises(ValueError, match="n_off"):
    _common.policy_batch(4, 2, 2, 16, n_off=5)
  padded = _common.policy_batch(8, 5, 3, 64, n_off=2, n_pad=1, seed=1)
  for got, want in zip(padded, b):
    np.testing.assert_array_equal(got[0], 0)
    np.testing.assert_array_equal(got[1:], want[1:])
  with pytest.raises(ValueError, match="n_pad"):
    _common.policy_batch(4, 2, 2, 16, n_off=2, n_pad=3)


def test_prompt_ids_groups_and_word_tokenizer_round_trip(tmp_path):
  ids = _common.prompt_ids(6, 7, 50, group=3, seed=0)
  assert len(ids) == 6 and all(len(r) == 7 for r in ids)
  assert ids[0] == ids[1] == ids[2] and ids[3] == ids[5] != ids[0]
  assert min(min(r) for r in ids) >= 2  # 0 and 1 are pad and eos
  with pytest.raises(ValueError, match="multiple"):
    _common.prompt_ids(5, 7, 50, group=2)
  tok = _common.word_tokenizer(50, str(tmp_path))
  assert tok.pad_token_id == _common.PAD_ID
  assert tok.eos_token_id == _common.EOS_ID
  assert tok(_common.ids_to_text(ids[0]))["input_ids"] == ids[0]


def test_mesh_layouts():
  layouts = _load("train_step").mesh_layouts
  assert layouts(1) == [(1, 1, 1)]
  assert layouts(2) == [(2, 1, 1), (1, 2, 1), (1, 1, 2)]
  assert layouts(3) == [(3, 1, 1), (1, 3, 1)]
  assert layouts(8) == [(8, 1, 1), (1, 8, 1), (1, 4, 2)]


def test_compare_rows_and_markdown():
  compare = _load("compare")
  m = lambda v, better="higher", unit="tokens/s", **kw: dict(
      value=v, better=better, unit=unit, **kw
  )
  results = {
      "ours": {
          "update": m(200.0, cpu_s=1.0),
          "peak_rss_train": m(500.0, "lower", "MiB"),
          "update_gflops": m(40.0, unit="GFLOP/s"),
      },
      "tunix": {
          "update": m(100.0, cpu_s=3.0),
          "peak_rss_train": m(1000.0, "lower", "MiB"),
          "update_gflops": m(20.0, unit="GFLOP/s"),
      },
      "trl": {"update": m(400.0)},
  }
  rows = compare.compare_rows(results, "s", peak=100.0)
  by = {(r["peer"], r["metric"]): r for r in rows}
  assert by[("tunix", "update")]["ratio"] == 2.0
  assert by[("tunix", "update")]["ratio_cpu"] == 3.0  # 3 cpu-s vs 1
  assert by[("tunix", "peak_rss_train")]["ratio"] == 2.0  # lower is better
  assert by[("trl", "update")]["ratio"] == 0.5
  assert ("trl", "peak_rss_train") not in by
  frac = by[("tunix", "update_frac_of_peak")]
  assert (frac["ours"], frac["theirs"]) == (0.4, 0.2)
  for r in rows:
    assert {"metric", "peer", "ours", "theirs", "unit", "ratio"} <= set(r)
  md = compare.markdown(rows, "header")
  assert md.startswith("header")
  assert "| update | tokens/s | 200 | 100 | 2 | 400 | 0.5 |" in md
  assert "| peak_rss_train | MiB | 500 | 1,000 | 2 | - | - |" in md


def test_worker_prints_metric_lines():
  out = subprocess.run(
      [
          sys.executable,
          str(BENCH / "_peer_ours.py"),
          "--task",
          "matmul",
          "--matmul_n",
          "64",
          "--iters",
          "1",
      ],
      capture_output=True,
      text=True,
      check=True,
      timeout=300,
  ).stdout
  rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
  assert [r["metric"] for r in rows] == ["peak_matmul"]
  assert rows[0]["unit"] == "GFLOP/s" and rows[0]["value"] > 0


def test_generation_task_reports_each_batch_then_memory(capsys):
  """The workers' shared gen loop: per batch size the rate from the count
  the worker's generate returns, the warm-up call, then peak RSS."""
  import argparse  # noqa: PLC0415
  import time  # noqa: PLC0415

  peer = _load("_peer_template")
  calls = []

  def make_generate(n):
    def generate():
      calls.append(n)
      time.sleep(0.002)  # above time_calls' rounding to 10 us
      return 4 * n

    return generate

  peer.generation_task(
      argparse.Namespace(gen_batches="2,3", iters=2),
      make_generate,
      fields=lambda t: {"tag": "x"},
  )
  rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
  assert calls == [2, 2, 2, 3, 3, 3]  # one warm-up and 2 timed calls each
  assert [r["metric"] for r in rows] == [
      "generate_b2",
      "first_generate_call_b2",
      "generate_b3",
      "first_generate_call_b3",
      "peak_rss_gen",
  ]
  rate = rows[0]
  assert list(rate) == ["metric", "value", "unit", "better", "seconds", "tag"]
  assert rate["value"] == pytest.approx(8 / rate["seconds"])
  assert rows[1]["better"] == "lower" and rows[-1]["unit"] == "MiB"


@pytest.mark.slow
def test_device_smoke_runs_on_cpu():
  out = subprocess.run(
      [sys.executable, str(BENCH / "device.py"), "--smoke"],
      capture_output=True,
      text=True,
      check=True,
      timeout=900,
  ).stdout
  rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
  assert [r["bench"] for r in rows] == [
      "device_train_step",
      "device_logprob",
      "device_decode",
      "device_summary",
  ]
  assert rows[0]["tokens_per_s"] > 0 and rows[-1]["skipped"] == []


def test_paper_flops_by_hand():
  """MFU / HFU counts of bench/device.py --paper on ``tiny``: 2 rows of
  S = 128 tokens, logits on a 16-token window. N_blocks = 2949120 (the
  matmul params less the 2048 x 256 head); per row blocks = 2 N_blocks S,
  head = 2 V d W, attention 4 L H Dh = 4096 FLOPs a (query, key) pair."""
  blocks, head = 2 * 2949120 * 128, 2 * 2048 * 256 * 16
  causal, full = 4096 * 128 * 128 // 2, 4096 * 128 * 128
  assert _common.model_train_flops(TINY, 2, 128, 16) == (
      2 * 3 * (blocks + head + causal)
  )
  # Remat: a fourth pass over the blocks; XLA's attention: every pair.
  assert _common.executed_train_flops(
      TINY, 2, 128, 16, remat=True, fused=False
  ) == (2 * (4 * (blocks + full) + 3 * head))
  # 'dots' keeps the weight matmuls' outputs: only attention runs again.
  assert _common.executed_train_flops(
      TINY, 2, 128, 16, remat="dots", fused=False
  ) == (2 * (3 * (blocks + full) + full + 3 * head))
  # A fused causal kernel without remat executes the model's FLOPs.
  assert _common.executed_train_flops(
      TINY, 2, 128, 16, remat=False, fused=True
  ) == (_common.model_train_flops(TINY, 2, 128, 16))
  # No window: logits at every position.
  assert _common.model_train_flops(TINY, 1, 128, 0) == 3 * (
      blocks + 2 * 2048 * 256 * 128 + causal
  )


@pytest.mark.slow
def test_device_check_smoke(tmp_path):
  """bench/device_check.sh --smoke: bench/device.py --paper on tiny shapes
  and 8 CPU devices into one JSON file -- the learner step on all devices
  (1, 8, 1) and on one, with micro-batches of a row a device, a padding
  row, MFU / HFU, compiled and planned peak memory, no activation-sized
  collective; the log-prob pass; the engine's decode of the scanned model
  -- and the sharding check of the step on (2, 4, 1) into another."""
  out = tmp_path / "check.json"
  proc = subprocess.run(
      ["bash", str(BENCH / "device_check.sh"), "--smoke", str(out)],
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(out.read_text())["rows"]
  assert [r["bench"] for r in rows] == [
      "paper_train_step",
      "paper_logprob",
      "paper_train_step",
      "paper_decode",
      "paper_summary",
  ]
  train = [r for r in rows if r["bench"] == "paper_train_step"]
  assert [
      (r["mesh_shape"], r["micro_batch_rows"], r["micro_batches"])
      for r in train
  ] == [([1, 8, 1], 8, 2), ([1, 1, 1], 1, 16)]
  for r in train:
    assert (r["rows"], r["seq_len"], r["window"]) == (16, 128, 16)
    assert r["remat"] and r["scan_layers"]
    assert r["activation_collectives"] == 0
    assert r["padding_rows"] == 1 and r["skipped"] == 0
    assert r["compile_s"] > 0 and r["step_s"] > 0
    # Remat and XLA's full score matrix: more executed than model FLOPs.
    assert r["executed_tflop"] > r["model_tflop"] > 0
    assert r["hfu"] > r["mfu"] > 0
    assert r["compiled_peak_GiB"] > 0 and r["plan_peak_GiB"] > 0
    assert r["allocator_peak_GiB_so_far"] is None  # CPU keeps no stats
  assert rows[1]["chunks"] == 2 and rows[3]["new_tokens_per_s"] > 0
  summary = rows[-1]
  assert summary["platform"] == "cpu" and summary["devices"] == 8
  assert summary["skipped"] == []
  assert summary["model_flags"] == {
      "dtype": "bfloat16",
      "param_dtype": "float32",
      "remat": "full",
      "scan_layers": True,
      "attention": "auto",
  }
  # The sharding check (bench/sharding_check.py) on (2, 4, 1).
  step, data = json.loads((tmp_path / "check_sharding.json").read_text())[
      "rows"
  ]
  assert (step["bench"], step["micro_batches"]) == ("sharding_step", 4)
  assert step["activation_collectives"] == 0
  assert step["gradient_reductions_not_f32"] == 0
  assert data["data_all_reduces_per_update"] == {
      "2": data["parameters"],
      "4": data["parameters"],
  }
  # The kernel check (--kernel_check --smoke), run first: CPU, XLA only.
  _check_kernel_rows(
      json.loads((tmp_path / "check_kernel.json").read_text())["rows"]
  )


def _kernel_quantity(nonfinite=0, err=0.01, top=2.0):
  return dict(
      nonfinite=nonfinite,
      nonfinite_heads=[0] if nonfinite else [],
      normal_heads_max_abs_err=err,
      normal_heads_ref_max_abs=top,
  )


def test_kernel_check_verdict_and_padding_lengths():
  """The kernel check's pass rule (bench/device.py KERNEL_TOL_*): any
  non-finite value fails; an error within 2x the XLA bf16 path's, or
  within 2^-7 of the reference's magnitude, passes. Padding rows reach a
  kernel as length 1 (transformer.kernel_lengths)."""
  ok = _load("device")._kernel_ok
  xla = {
      q: _kernel_quantity(err=0.01)
      for q in ("out", "grad_q", "grad_k", "grad_v")
  }
  fine = dict(xla, grad_q=_kernel_quantity(err=0.019))
  assert ok(fine, xla) == (True, "")
  bad = dict(xla, grad_q=_kernel_quantity(nonfinite=3, err=None))
  assert not ok(bad, xla)[0] and "3 non-finite grad_q" in ok(bad, xla)[1]
  assert not ok(dict(xla, grad_k=_kernel_quantity(err=0.05)), xla)[0]
  # Near-exact XLA rows: the floor, 2^-7 of the reference's magnitude.
  exact = {q: _kernel_quantity(err=0.0, top=2.0) for q in xla}
  assert ok(dict(exact, out=_kernel_quantity(err=0.015)), exact)[0]
  assert not ok(dict(exact, out=_kernel_quantity(err=0.02)), exact)[0]
  from rspo_jax.models import transformer  # pylint: disable=g-import-not-at-top

  mask = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0]], np.int32)
  assert transformer.kernel_lengths(mask).tolist() == [1, 1, 2]


def _check_kernel_rows(rows):
  """bench/device.py --kernel_check --smoke on CPU: no fused kernel there,
  so XLA's path in bf16 against its float32 reference on every row --
  finite, within a few bf16 roundings -- and a verdict row naming the
  setting (model.attention)."""
  *per_row, verdict = rows
  # Model batch: every row (padding rows as length 1); raw: the 0 again.
  assert [
      (r["padded_length"], r["batch"], r["real_tokens"], r["kernel_length"])
      for r in per_row
  ] == [
      (128, "model", 0, 1),
      (128, "model", 1, 1),
      (128, "model", 96, 96),
      (128, "model", 128, 128),
      (128, "raw", 0, 0),
      (64, "model", 0, 1),
      (64, "model", 1, 1),
      (64, "model", 40, 40),
      (64, "model", 64, 64),
      (64, "raw", 0, 0),
  ]
  for r in per_row:
    assert "fused" not in r and r["padding_row"] == (r["real_tokens"] == 0)
    for q in ("out", "grad_q", "grad_k", "grad_v"):
      got = r["xla_bf16"][q]
      assert got["nonfinite"] == 0 and got["nonfinite_heads"] == []
      assert got["max_abs_err"] <= 2**-6 * max(got["ref_max_abs"], 1.0)
      assert len(got["max_abs_err_by_head"]) == (
          4 if q in ("out", "grad_q") else 2
      )
    if r["batch"] == "raw":
      assert r["other_rows_finite"] == {"xla_bf16": True}
  # Rows of real tokens: a real comparison (non-zero reference).
  assert per_row[3]["xla_bf16"]["grad_q"]["rel_err"] > 0
  assert verdict["bench"] == "kernel_check"
  assert (verdict["recommend"], verdict["platform"]) == ("xla", "cpu")
  assert verdict["fused_impl"] is None and verdict["errors"] == []
  assert verdict["fused_finite_at_length_0"] is None  # no fused kernel
  assert verdict["config_key"] == "model.attention"
  assert verdict["set"] == "--config.model.attention=xla"


@pytest.mark.slow
def test_loop_bench_smoke_prints_phases(tmp_path):
  """bench/loop.py end to end on the toy world, the working tree only,
  micro-sized: one JSON line per side, then the summary."""
  out = subprocess.run(
      [
          sys.executable,
          str(BENCH / "loop.py"),
          "--envs",
          "toy",
          "--sides",
          "after",
          "--steps",
          "1",
          "--warmup",
          "0",
          "--tasks",
          "1",
          "--group",
          "2",
          "--sft_steps",
          "0",
          "--bc_steps",
          "1",
          "--eval_tasks",
          "2",
          "--cache_dir",
          str(tmp_path),
          "--overrides",
          "model.overrides=num_layers=1,env.max_steps=2",
      ],
      capture_output=True,
      text=True,
      check=True,
      timeout=900,
  ).stdout
  rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
  side, summary = rows[-2], rows[-1]
  assert side["side"] == "after" and summary["after"]["step_s"] > 0
  assert set(side["phases_s"]) == {
      "weight_sync",
      "generation",
      "environment",
      "prompts",
      "batching",
      "logprobs",
      "update",
      "checkpoint",
      "other",
  }
  # Exclusive phases add up to (at most) the step's wall time.
  assert sum(side["phases_s"].values()) <= side["step_s"] * 1.01
  assert side["phases_s"]["generation"] > 0
  assert side["config"]["train.group_size"] == 2
  assert side["episodes_per_s"] == pytest.approx(2 / side["step_s"], rel=0.02)
  assert side["bc_step_s"] > 0 and side["evaluation_s"] > 0
  assert "speedup" not in summary


def test_decode_paths_by_hand():
  """Two episodes: replies of 3 then 5 tokens, and 4 then 1.
  With barriers: max(3, 4) + max(5, 1) = 9 decode steps; without: the
  longer episode, max(3 + 5, 4 + 1) = 8; bound 9 / 8."""
  from rspo_jax.types import StepRecord  # pylint: disable=g-import-not-at-top

  def rec(traj, step, n):
    return StepRecord(
        task_id=0,
        group_id=0,
        traj_id=traj,
        step_idx=step,
        prompt_ids=np.zeros(2, np.int32),
        response_ids=np.zeros(n, np.int32),
        behavior_logp=np.zeros(n, np.float32),
    )

  paths = _load("rollout").decode_paths(
      [rec(0, 0, 3), rec(0, 1, 5), rec(1, 0, 4), rec(1, 1, 1)]
  )
  assert paths == {
      "barriered_steps": 9,
      "free_steps": 8,
      "barrier_bound": 1.125,
  }
  assert _load("rollout").decode_paths([])["barrier_bound"] is None


def test_group_prefixes_by_hand():
  """Group 0 at turn 1: [1 2 3 4] and [1 2 9] share 2 tokens (one prompt's
  worth saved: 2); turn 0 is not counted (identical prompts are shared
  already); group 1 has one prompt at turn 1. 2 of 4 + 3 + 2 + 2 + 3
  = 14 prompt tokens."""
  from rspo_jax.types import StepRecord  # pylint: disable=g-import-not-at-top

  def rec(group, traj, step, ids):
    return StepRecord(
        task_id=group,
        group_id=group,
        traj_id=traj,
        step_idx=step,
        prompt_ids=np.asarray(ids, np.int32),
        response_ids=np.zeros(1, np.int32),
        behavior_logp=np.zeros(1, np.float32),
    )

  out = _load("rollout").group_prefixes(
      [
          rec(0, 0, 1, [1, 2, 3, 4]),
          rec(0, 1, 1, [1, 2, 9]),
          rec(0, 0, 0, [1, 2]),
          rec(0, 1, 0, [1, 2]),
          rec(1, 2, 1, [5, 6, 7]),
      ]
  )
  assert out == {
      "group_prefix_share": round(2 / 14, 3),
      "median_group_lcp": 2.0,
  }
