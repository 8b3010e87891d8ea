"""Compile time: JAX's persistent compilation cache under the workdir, and
compile seconds per jitted function in the metrics (rspo_jax/compile_cache.py).

A second process compiling the same program reads it from the cache (a
cache hit, no new file); a 'compile' metrics row names each function
compiled since the previous row with its seconds. launch/train.py turning
the cache on in a real run is checked in tests/checkpoint_test.py.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_collections

from rspo_jax import compile_cache
from rspo_jax.metrics import MetricsWriter, read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One process: the cache on in argv[1], a named jitted function compiled and
# run, then what the CompileLog saw and the files in the cache.
SCRIPT = textwrap.dedent("""
    import json, os, sys
    from rspo_jax import compile_cache
    log = compile_cache.CompileLog()
    compile_cache.enable(sys.argv[1])
    import jax, jax.numpy as jnp

    @jax.jit
    def mlp_forward(x, w):
      for _ in range(4):
        x = jnp.tanh(x @ w)
      return x.sum()

    mlp_forward(jnp.ones((8, 64)), jnp.ones((64, 64))).block_until_ready()
    print(json.dumps({"log": log.take(),
                      "files": sorted(os.listdir(sys.argv[1]))}))
""")


def run_process(cache: str) -> dict:
  env = dict(
      os.environ,
      XLA_FLAGS="",
      JAX_PLATFORMS="cpu",
      PYTHONPATH=ROOT,
      # Cache every program, however quickly it compiles (JAX's
      # default keeps those of >= 1 s only).
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  out = subprocess.run(
      [sys.executable, "-c", SCRIPT, cache],
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
      check=True,
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_cache_dir_defaults_to_the_environment_then_the_workdir(monkeypatch):
  cfg = ml_collections.ConfigDict({"train": {"compile_cache_dir": ""}})
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  assert compile_cache.cache_dir(cfg, "/runs/x") == "/runs/x/compile_cache"
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/shared/env")
  assert compile_cache.cache_dir(cfg, "/runs/x") == "/shared/env"
  cfg.train.compile_cache_dir = "/shared/xla"
  assert compile_cache.cache_dir(cfg, "/runs/x") == "/shared/xla"
  cfg.train.compile_cache_dir = "none"
  assert compile_cache.cache_dir(cfg, "/runs/x") is None
  assert compile_cache.enable(None) is None


def test_a_second_process_reads_its_programs_from_the_cache(tmp_path):
  cache = str(tmp_path / "compile_cache")
  first = run_process(cache)
  assert first["files"], "the first process wrote no cache entry"
  assert first["log"]["cache_hits"] == 0
  assert first["log"]["mlp_forward_s"] > 0
  second = run_process(cache)
  assert second["log"]["cache_hits"] >= 1
  assert second["files"] == first["files"]  # read back, nothing new
  assert "mlp_forward_s" in second["log"]


def test_compile_rows_name_each_function_and_its_seconds(tmp_path):
  writer = compile_cache.CompileMetrics(
      MetricsWriter(str(tmp_path), tensorboard=False)
  )
  writer.write(0, "A", {"loss": 1.0})  # whatever compiled before

  @jax.jit
  def scaled_cumsum_for_this_test(x):
    return jnp.cumsum(x) * 3.0

  scaled_cumsum_for_this_test(jnp.arange(5.0)).block_until_ready()
  writer.write(1, "A", {"loss": 0.5})
  scaled_cumsum_for_this_test(jnp.arange(5.0)).block_until_ready()  # cached
  writer.write(2, "A", {"loss": 0.25})
  writer.close()
  rows = read_metrics(os.path.join(str(tmp_path), "metrics.jsonl"), "compile")
  (row,) = [r for r in rows if r["step"] == 1]
  assert row["scaled_cumsum_for_this_test_s"] > 0
  assert (
      row["compiles"] >= 1
      and row["compile_s"] >= row["scaled_cumsum_for_this_test_s"]
  )
  assert not [r for r in rows if r["step"] == 2]  # nothing compiled
  assert [
      r["phase"]
      for r in read_metrics(os.path.join(str(tmp_path), "metrics.jsonl"), "A")
  ] == ["A"] * 3
