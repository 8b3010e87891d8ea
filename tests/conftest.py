"""Test-session set-up: 8 fake CPU devices, so sharded == unsharded tests run
on any machine; one persistent compilation cache shared by the session's
processes (the pytest process and every launch/train.py it starts), so a
program compiled by one test is read back by the next. Export
``JAX_COMPILATION_CACHE_DIR`` to keep that cache across sessions. Must run
before jax initialises its backends."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="rspo_tests_xla_cache_")
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
