"""The skeleton every compare.py worker (bench/_peer_*.py) shares.

compare.py starts one worker process per (peer, task) with the peer's own
python; a worker prints one JSON line per metric:

  {"metric": name, "value": x, "unit": u, "better": "higher"|"lower", ...}

A worker holds only what its framework does differently: how it builds a
model, takes one training step and generates one batch. The rest is here:

  main             the flags (``worker_parser``), ``--shape`` for train
                   and gen, the task dispatch;
  generation_task  ``--task gen``: per batch size of ``--gen_batches``,
                   one warm-up call and ``--iters`` timed calls of the
                   worker's generate; ``generate_b{n}`` = new tokens /
                   median wall s, ``first_generate_call_b{n}``, then
                   ``peak_rss_gen``;
  report_train     the ``--task train`` metrics every peer reports;
  jax_matmul_task  the JAX workers' ``--task matmul``.

Standard library only at import time, as ``_common`` (the workers run it
under other virtual environments).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable, Iterable, Optional

import _common


def metric(
    name: str, value, unit: str, *, better: str = "higher", **extra
) -> None:
  if better not in ("higher", "lower"):
    raise ValueError(f"metric {name!r}: better must be higher/lower")
  _common.emit(
      {"metric": name, "value": value, "unit": unit, "better": better, **extra}
  )


def worker_parser(description: str) -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=description)
  p.add_argument("--task", required=True, choices=("train", "gen", "matmul"))
  p.add_argument(
      "--shape",
      default="{}",
      help="JSON dict of the model shape (see compare.py)",
  )
  p.add_argument("--rows", type=int, default=16)
  p.add_argument("--group", type=int, default=8)
  p.add_argument("--prompt_len", type=int, default=256)
  p.add_argument("--resp_len", type=int, default=32)
  p.add_argument("--iters", type=int, default=3)
  p.add_argument("--gen_batches", default="16,128")
  p.add_argument("--matmul_n", type=int, default=2048)
  p.add_argument("--url", default="", help="SGLang server URL")
  p.add_argument("--profile_dir", default="")
  p.add_argument(
      "--torch_threads",
      type=int,
      default=0,
      help="torch intra-op threads (TRL worker; 0 = torch's)",
  )
  return p


def parse_shape(text: str) -> dict:
  shape = json.loads(text)
  need = (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
  )
  missing = [k for k in need if k not in shape]
  if missing:
    raise ValueError(f"--shape lacks {missing}")
  return shape


def main(
    doc: str,
    tasks: dict[str, Callable[[argparse.Namespace, dict], None]],
    argv: Optional[list[str]] = None,
    setup: Optional[Callable[[argparse.Namespace], None]] = None,
    wall_to_stderr: bool = False,
) -> None:
  """Runs one worker: flags described by the first line of its docstring
  ``doc``, ``setup(args)`` (a check, thread counts), ``--shape`` parsed
  unless the task is matmul, then ``tasks[args.task](args, shape)``. With
  ``wall_to_stderr`` the worker's wall seconds go to stderr as one JSON
  line."""
  t0 = time.perf_counter()
  args = worker_parser(doc.splitlines()[0]).parse_args(argv)
  if setup is not None:
    setup(args)
  shape = parse_shape(args.shape) if args.task != "matmul" else {}
  tasks[args.task](args, shape)
  if wall_to_stderr:
    _common.emit(
        {"worker_wall_s": round(time.perf_counter() - t0, 1)}, stream=sys.stderr
    )


def batch_sizes(args: argparse.Namespace) -> Iterable[int]:
  return (int(x) for x in args.gen_batches.split(","))


def generation_task(
    args: argparse.Namespace,
    make_generate: Callable[[int], Callable[[], int]],
    *,
    fields: Callable[[dict], dict] = lambda t: {"cpu_s": t["cpu_s"]},
    after: Optional[Callable[[int, Callable[[], int]], None]] = None,
    peak_rss: bool = True,
) -> None:
  """``--task gen``: for each batch size n, ``generate = make_generate(n)``
  (prompts made, engine ready) makes one batched call of ``--resp_len``
  new tokens a row and returns how many it made. Timed by
  ``_common.time_calls``; reported as

    generate_b{n}             = new tokens / median wall s   (tokens/s)
    first_generate_call_b{n}  = the warm-up call's wall s    (compile)

  with ``seconds`` (median) and ``fields(timing)`` beside the rate
  (default: the median process CPU s). ``after(n, generate)`` runs between
  the timing and the report (a profile), then ``peak_rss_gen`` ends the
  task unless ``peak_rss`` is False (a server's memory is not ours)."""
  for n in batch_sizes(args):
    generate = make_generate(n)
    count = [0]

    def run(generate=generate, count=count):
      count[0] = generate()

    t = _common.time_calls(run, iters=args.iters)
    if after is not None:
      after(n, generate)
    metric(
        f"generate_b{n}",
        count[0] / t["median_s"],
        "new tokens/s",
        seconds=t["median_s"],
        **fields(t),
    )
    metric(f"first_generate_call_b{n}", t["first_s"], "s", better="lower")
  if peak_rss:
    metric("peak_rss_gen", _common.peak_rss_mb(), "MiB", better="lower")


def report_train(
    shape: dict,
    *,
    rows: int,
    seq_len: int,
    logp: dict,
    update: dict,
    train: dict,
    rl: Optional[dict],
    first_s: Optional[float],
) -> None:
  """The train-task metrics every peer reports. ``logp``, ``update``,
  ``train`` (pi_old + pi_ref log-probs + update) and ``rl`` (with
  generation) are ``{'median_s': wall s, 'cpu_s': process CPU s}``."""
  tokens = rows * seq_len
  for name, t in (
      ("train_step", train),
      ("update", update),
      ("logprob_forward", logp),
      ("rl_step_with_generation", rl),
  ):
    if t:
      metric(
          name,
          tokens / t["median_s"],
          "tokens/s",
          seconds=round(t["median_s"], 4),
          cpu_s=t.get("cpu_s"),
      )
  gflops = (
      _common.train_flops(shape, tokens, seq_len) / update["median_s"] / 1e9
  )
  metric(
      "update_gflops",
      gflops,
      "GFLOP/s",
      formula="6*N_mm*tokens + 12*L*H*Dh*S*tokens",
  )
  if first_s is not None:
    metric("first_update_call", first_s, "s", better="lower")
  metric("peak_rss_train", _common.peak_rss_mb(), "MiB", better="lower")


def add_times(*timings: dict) -> dict:
  """Sum of several ``{'median_s', 'cpu_s'}`` timings."""
  return {k: sum(t[k] for t in timings) for k in ("median_s", "cpu_s")}


def median_times(wall: list, cpu: list) -> dict:
  return {"median_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}


def jax_matmul_task(args: argparse.Namespace, _shape=None) -> None:
  """The JAX workers' (ours, Tunix's) ``--task matmul``: ``peak_matmul``,
  the best rate of a jitted float32 ``n x n`` ``jnp.dot``, 2 n^3 FLOPs."""
  import jax  # noqa: PLC0415  (not at import time: see the docstring)
  import jax.numpy as jnp  # noqa: PLC0415

  n = args.matmul_n
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  t = _common.time_calls(
      lambda: dot(a, b), iters=max(args.iters, 5), sync=jax.block_until_ready
  )
  metric(
      "peak_matmul",
      2 * n**3 / t["min_s"] / 1e9,
      "GFLOP/s",
      n=n,
      dtype="float32",
      framework="jax " + jax.__version__,
  )
