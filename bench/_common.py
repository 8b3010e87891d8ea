"""Shared helpers of the benchmarks: timing, memory, FLOP counts, JSON lines.

Standard library only at import time: the peer workers of ``compare.py`` run
this module under other virtual environments (Tunix's, torch's), so anything
that needs jax or numpy is imported inside the function that uses it.

FLOP counts (PaLM, appendix B; a multiply-add is 2 FLOPs):

    forward  = 2 * N_mm * tokens + 4 * L * H * Dh * S * tokens
    train    = 3 * forward = 6 * N_mm * tokens + 12 * L * H * Dh * S * tokens

``N_mm`` counts the parameters used in matmuls: all of them, less the
embedding table when the LM head is untied (a lookup is no matmul; a tied
table is also the LM head). ``S`` is the full sequence length: the models
here compute the whole ``S x S`` score matrix and mask it, so causal
skipping is not credited.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from typing import Any, Callable, Optional

# Published dense peaks (FLOP/s) for MFU; the CPU peak is measured instead.
PEAK_FLOPS = {"h200_bf16": 989e12, "h100_bf16": 989e12, "a100_bf16": 312e12}


def force_host_devices(n: Optional[int]) -> None:
  """Fakes ``n`` CPU devices; must run before jax is imported."""
  if not n:
    return
  if "jax" in sys.modules:
    raise ValueError("force_host_devices(n) must run before jax is imported")
  flag = f"--xla_force_host_platform_device_count={int(n)}"
  flags = [
      f
      for f in os.environ.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count")
  ]
  os.environ["XLA_FLAGS"] = " ".join(flags + [flag])


def emit(row: dict, stream=None) -> None:
  """Prints one JSON line (the benchmarks' only output format)."""
  print(json.dumps(row, sort_keys=False), file=stream or sys.stdout, flush=True)


def peak_rss_mb() -> float:
  """Peak resident set size of this process so far, MiB (Linux: KiB)."""
  kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return round(kib / 1024.0, 1)


def load_average() -> list[float]:
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return []


def machine_info() -> dict:
  return {"cpus": os.cpu_count(), "load_avg": load_average()}


def time_calls(
    fn: Callable[[], Any],
    *,
    iters: int,
    warmup: int = 1,
    sync: Callable[[Any], Any] = lambda x: x,
) -> dict:
  """Runs ``fn`` ``warmup + iters`` times; returns first-call and median
  wall seconds, and the median process CPU seconds of a call (all threads;
  on a shared machine, wall time grows with the load, CPU time much less).
  ``sync`` blocks on the result (e.g. ``jax.block_until_ready``)."""
  if iters < 1:
    raise ValueError(f"time_calls: iters must be >= 1, got {iters}")
  first = None
  for i in range(warmup):
    t0 = time.perf_counter()
    sync(fn())
    if i == 0:
      first = time.perf_counter() - t0
  times, cpu = [], []
  for _ in range(iters):
    t0, c0 = time.perf_counter(), time.process_time()
    sync(fn())
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  return {
      "first_s": None if first is None else round(first, 4),
      "median_s": round(statistics.median(times), 5),
      "min_s": round(min(times), 5),
      "cpu_s": round(statistics.median(cpu), 5),
      "iters": iters,
  }


def matmul_params(shape: dict) -> int:
  """N_mm of a Qwen2/Llama shape dict (see the module docstring)."""
  d, f = shape["hidden_size"], shape["intermediate_size"]
  L = shape["num_layers"]  # pylint: disable=invalid-name
  h, kv, dh = shape["num_heads"], shape["num_kv_heads"], shape["head_dim"]
  per_layer = d * h * dh * 2 + d * kv * dh * 2 + 3 * d * f
  return L * per_layer + shape["vocab_size"] * d


def forward_flops(shape: dict, tokens: int, seq_len: int) -> float:
  """2 * N_mm * tokens + 4 * L * H * Dh * S * tokens."""
  attn = 4 * shape["num_layers"] * shape["num_heads"] * shape["head_dim"]
  return 2.0 * matmul_params(shape) * tokens + attn * seq_len * tokens


def train_flops(shape: dict, tokens: int, seq_len: int) -> float:
  """6 * N_mm * tokens + 12 * L * H * Dh * S * tokens (= 3 forwards)."""
  return 3.0 * forward_flops(shape, tokens, seq_len)


# ------------------------------------------- MFU and HFU of the train step
# One train step of ``rows`` rows of S tokens, logits on a response window
# of W tokens (the learner's ``window``), per row:
#
#   blocks = 2 * N_blocks * S           (N_blocks = N_mm less the V x d head)
#   head   = 2 * V * d * W
#   attn(pairs) = 4 * L * H * Dh * pairs      (QK^T and PV)
#   model    = 3 * (blocks + head + attn(S^2 / 2))     (causal counted at
#                                                      half, as MaxText)
#   executed = (3 + remat) * (blocks + attn(pairs_x)) + 3 * head   (full)
#
# pairs_x = S^2 / 2 for a fused causal kernel (cuDNN, splash: masked tiles
# skipped), S^2 for XLA's attention (every score computed, then masked);
# remat (1) runs each block's forward again in the backward ('dots': only
# the attention's, whose dots have batch dimensions). MFU = model /
# s / (devices * peak); HFU = executed / s / (devices * peak).


def attention_pairs(seq_len: int, fused: bool) -> float:
  return seq_len * seq_len / 2 if fused else float(seq_len * seq_len)


def model_train_flops(
    shape: dict, rows: int, seq_len: int, window: int
) -> float:
  """The useful FLOPs of one train step (above): 3 * (blocks + head +
  attn(S^2 / 2)) per row."""
  blocks, head, attn = _train_terms(shape, seq_len, window)
  return rows * 3.0 * (blocks + head + attn(seq_len * seq_len / 2))


def executed_train_flops(
    shape: dict, rows: int, seq_len: int, window: int, *, remat, fused: bool
) -> float:
  """The FLOPs one train step executes (above): remat's second forward of
  each block ('full'; 'dots' recomputes only the attention's dots, the
  weight matmuls' outputs are kept; 'none' nothing; the old bools read as
  'full' / 'none') and the attention the kernel computes."""
  from rspo_jax.models.config import remat_policy

  blocks, head, attn = _train_terms(shape, seq_len, window)
  policy = remat_policy(remat)
  a = attn(attention_pairs(seq_len, fused))
  again = {"none": 0.0, "dots": a, "full": blocks + a}[policy]
  return rows * (3.0 * (blocks + a) + again + 3.0 * head)


def _train_terms(shape: dict, seq_len: int, window: int):
  head_params = shape["vocab_size"] * shape["hidden_size"]
  blocks = 2.0 * (matmul_params(shape) - head_params) * seq_len
  head = 2.0 * head_params * (window or seq_len)
  per_pair = 4.0 * shape["num_layers"] * shape["num_heads"] * shape["head_dim"]
  return blocks, head, lambda pairs: per_pair * pairs


def ratio(
    ours: Optional[float],
    theirs: Optional[float],
    higher_is_better: bool = True,
) -> Optional[float]:
  """ours / theirs for rates (>1 = we are better), theirs / ours for costs
  such as memory, so a ratio above 1 always favours us."""
  if not ours or not theirs:
    return None
  r = ours / theirs if higher_is_better else theirs / ours
  return round(r, 3)


def policy_batch(
    rows: int,
    prompt_len: int,
    resp_len: int,
    vocab: int,
    *,
    n_off: int = 0,
    n_pad: int = 0,
    seed: int = 0,
):
  """A random ``types.Batch`` of ``rows`` x (prompt + response) tokens.

  Every token is real; ``loss_mask`` is 1 on the response; the last
  ``n_off`` rows are off-policy with a behaviour log-prob near pi_old's;
  advantages are N(0, 1) per row; log-probs sit near uniform,
  ``-log(vocab)``. The first ``n_pad`` rows are then padding, all zero, as
  ``batching.records_to_batch`` adds (attention kernels see such rows).
  """
  import numpy as np
  from rspo_jax.types import Batch

  if not 0 <= n_off <= rows:
    raise ValueError(f"policy_batch: n_off={n_off} outside [0, rows={rows}]")
  if not 0 <= n_pad <= rows - n_off:
    raise ValueError(
        f"policy_batch: n_pad={n_pad} outside"
        f" [0, rows - n_off = {rows - n_off}]"
    )
  rng = np.random.default_rng(seed)
  t = prompt_len + resp_len
  tokens = rng.integers(0, vocab, size=(rows, t)).astype(np.int32)
  attn = np.ones((rows, t), np.int32)
  positions = np.broadcast_to(np.arange(t, dtype=np.int32), (rows, t)).copy()
  loss_mask = np.zeros((rows, t), np.float32)
  loss_mask[:, prompt_len:] = 1.0
  adv = rng.normal(size=(rows, 1)).astype(np.float32) * loss_mask
  base = -float(np.log(vocab))
  old = (base + 0.1 * rng.normal(size=(rows, t))).astype(np.float32)
  off = np.zeros(rows, bool)
  off[rows - n_off :] = True
  beh = old + np.where(off[:, None], 0.05, 0.0).astype(np.float32)
  zeros = np.zeros_like(old)
  batch = Batch(
      tokens=tokens,
      positions=positions,
      attention_mask=attn,
      loss_mask=loss_mask,
      advantages=adv,
      old_logp=old,
      ref_logp=old - 0.01,
      behavior_logp=beh,
      returns=zeros,
      old_values=zeros,
      is_offpolicy=off,
  )
  for x in batch:
    x[:n_pad] = 0
  return batch


# ----------------------------------------------------- text for the peers
# TRL and Tunix take text prompts, so the peers share a word-level tokenizer
# whose ids are ours: '<pad>' = 0, '<eos>' = 1, 'w{i}' = i for i >= 2. A
# prompt of n words is exactly n tokens.
PAD_ID, EOS_ID = 0, 1


def word_tokenizer(vocab_size: int, out_dir: str):
  """Saves a word-level HF tokenizer to ``out_dir``; returns it
  (``transformers.PreTrainedTokenizerFast``)."""
  from tokenizers import Tokenizer, models as tk_models
  from tokenizers import pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {"<pad>": PAD_ID, "<eos>": EOS_ID}
  vocab.update({f"w{i}": i for i in range(2, vocab_size)})
  tok = Tokenizer(tk_models.WordLevel(vocab, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  fast = PreTrainedTokenizerFast(
      tokenizer_object=tok,
      pad_token="<pad>",
      eos_token="<eos>",
      unk_token="<pad>",
  )
  fast.save_pretrained(out_dir)
  return fast


def prompt_ids(
    n: int, length: int, vocab_size: int, *, group: int = 1, seed: int = 0
) -> list[list[int]]:
  """``n`` prompts of ``length`` ids in [2, vocab); each distinct prompt is
  repeated ``group`` times in a row (GRPO groups share a prompt)."""
  import numpy as np

  if n % group:
    raise ValueError(f"prompt_ids: n={n} is not a multiple of group={group}")
  rng = np.random.default_rng(seed)
  uniq = rng.integers(2, vocab_size, size=(n // group, length))
  return [uniq[i // group].tolist() for i in range(n)]


def ids_to_text(ids) -> str:
  return " ".join(f"w{int(i)}" for i in ids)
