"""Fixtures: a tiny exported Qwen2 checkpoint, and rollout servers on it.

Two server kinds speak SGLang's native API over HTTP:
  - "sglang": real SGLang 0.5.23 from the separate venv whose python is
    ``$RSPO_SGLANG_PYTHON`` (scripts/install_sglang.sh), run on the CPU with
    the import stubs of tests/sglang_stubs;
  - "jax": launch/serve_rollout.py (our JaxEngine) under this interpreter;
and ``lora_sglang_server``: real SGLang with ``--enable-lora`` (the
torch_native backend, with tests/sglang_cpu_lora on its PYTHONPATH).

Servers run in their own process group and are killed at fixture teardown.
Loaded by tests with ``pytest_plugins = ("sglang_fixtures",)``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import jax
import pytest
from flax import nnx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUBS = os.path.join(REPO, "tests", "sglang_stubs")
SGLANG_PYTHON_ENV = "RSPO_SGLANG_PYTHON"
STARTUP_TIMEOUT_S = 300.0

# Our tiny Qwen2 (about 60 k parameters); weights scaled up so next-token
# distributions are peaked rather than near uniform.
TOKENIZER_VOCAB = 300
TINY = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    eos_token_id=2,
    bos_token_id=None,
)
WEIGHT_SCALE = 3.0
TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "search for a red cotton shirt under 30 dollars",
    "put a clean mug in the coffee machine",
    "click buy now on the blue backpack",
] * 20


def sglang_python():
  """The SGLang venv's python, or None when it is not set up."""
  path = os.environ.get(SGLANG_PYTHON_ENV)
  if path and os.path.isfile(path) and os.access(path, os.X_OK):
    return path
  return None


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def scaled_model(cfg, seed: int, scale: float = WEIGHT_SCALE):
  from rspo_jax.models import hf_io  # pylint: disable=g-import-not-at-top

  model = hf_io.create_model(cfg, seed=seed)
  params = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(lambda x: x * scale, params))
  return model


def our_logprobs(model, prompts, results):
  """Per result, our model's ``log pi(token)`` of its tokens given the
  prompt and the tokens before (one unpadded forward of prompt + response)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from rspo_jax.models.transformer import token_logprobs  # pylint: disable=g-import-not-at-top

  out = []
  for p, r in zip(prompts, results):
    tokens = jnp.asarray([list(p) + r.token_ids.tolist()], jnp.int32)
    t = tokens.shape[1]
    logits, _, _ = model(tokens, jnp.arange(t)[None], jnp.ones((1, t), bool))
    out.append(np.asarray(token_logprobs(logits, tokens)[0, len(p) :]))
  return out


def perturbed_model(model, cfg, seed: int, amount: float = 0.5):
  """A copy of model with ``amount * scaled_model(seed)`` added to every
  parameter."""
  noise = nnx.state(scaled_model(cfg, seed), nnx.Param)
  graphdef, params = nnx.split(model, nnx.Param)
  new = jax.tree.map(lambda p, n: p + amount * n, params, noise)
  return nnx.merge(graphdef, new)


@dataclasses.dataclass
class TinyCheckpoint:
  cfg: object
  model: object
  path: str
  tokenizer: object
  tokenizer_dir: str


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> TinyCheckpoint:
  from rspo_jax.models import hf_io  # pylint: disable=g-import-not-at-top
  from rspo_jax.models import tokenizer as tok_lib
  from rspo_jax.models.config import get_model_config

  root = tmp_path_factory.mktemp("tiny_ckpt")
  tok_dir = str(root / "tokenizer")
  tokenizer = tok_lib.train_tokenizer(TEXTS, TOKENIZER_VOCAB, tok_dir)
  cfg = get_model_config("tiny", **TINY)
  model = scaled_model(cfg, seed=0)
  path = str(root / "v0")
  hf_io.save_hf_model(model, cfg, path, tokenizer_dir=tok_dir)
  return TinyCheckpoint(cfg, model, path, tokenizer, tok_dir)


class ServerProcess:
  """A server subprocess in its own process group, logging to a file."""

  def __init__(self, cmd, env, log_path, url):
    self.url = url
    self.log_path = log_path
    self._log = open(log_path, "wb")
    self.proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=self._log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=REPO,
    )

  def log_tail(self, n: int = 4000) -> str:
    with open(self.log_path, "rb") as f:
      return f.read()[-n:].decode("utf-8", "replace")

  def wait_healthy(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      if self.proc.poll() is not None:
        raise RuntimeError(
            f"server exited with {self.proc.returncode} before /health;"
            f" log tail:\n{self.log_tail()}"
        )
      try:
        with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
          if r.status == 200:
            return
      except (OSError, urllib.error.URLError):
        pass
      time.sleep(1.0)
    self.stop()
    raise RuntimeError(
        f"server at {self.url} not healthy after {timeout_s:.0f} s; log"
        f" tail:\n{self.log_tail()}"
    )

  def stop(self) -> None:
    if self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
      except ProcessLookupError:
        pass
    # SGLang's scheduler/detokenizer children share the group.
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    self._log.close()


def start_sglang_server(
    python, model_path, log_path, extra_args=(), extra_path=()
) -> ServerProcess:
  port = free_port()
  env = dict(os.environ)
  env.update(
      PYTHONPATH=os.pathsep.join((STUBS,) + tuple(extra_path)),
      SGLANG_USE_CPU_ENGINE="1",
      # Behaviour log-probs at temperature 1 whatever the sampling T.
      SGLANG_RETURN_ORIGINAL_LOGPROB="1",
  )
  env.pop("XLA_FLAGS", None)
  cmd = [
      python,
      "-m",
      "sglang.launch_server",
      "--model-path",
      model_path,
      "--device",
      "cpu",
      "--host",
      "127.0.0.1",
      "--port",
      str(port),
      "--attention-backend",
      "torch_native",
      "--dtype",
      "float32",
      "--max-total-tokens",
      "4096",
      "--max-running-requests",
      "16",
      "--disable-overlap-schedule",
      "--sleep-on-idle",
      *extra_args,
  ]
  return ServerProcess(cmd, env, log_path, f"http://127.0.0.1:{port}")


# SGLang's LoRA on the CPU: the torch_native backend (pure torch; the
# default csgmv and triton backends are triton kernels) with pinned host
# memory made a no-op (tests/sglang_cpu_lora/sitecustomize.py).
LORA_CPU_SHIM = os.path.join(REPO, "tests", "sglang_cpu_lora")
LORA_RANK, LORA_ALPHA = 4, 8.0
LORA_SERVER_ARGS = (
    "--enable-lora",
    "--lora-backend",
    "torch_native",
    "--max-lora-rank",
    str(LORA_RANK),
    "--max-loras-per-batch",
    "2",
    "--lora-target-modules",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


@pytest.fixture(scope="module")
def lora_sglang_server(tmp_path_factory, tiny_checkpoint):
  """A real SGLang server on ``tiny_checkpoint`` with LoRA enabled (rank
  ``LORA_RANK``, every projection a target); skips without the venv."""
  python = sglang_python()
  if python is None:
    pytest.skip(
        f"real SGLang needs its venv: run scripts/install_sglang.sh and set"
        f" {SGLANG_PYTHON_ENV} to its bin/python"
    )
  log = str(tmp_path_factory.mktemp("sglang_lora_server") / "server.log")
  server = start_sglang_server(
      python, tiny_checkpoint.path, log, LORA_SERVER_ARGS, (LORA_CPU_SHIM,)
  )
  try:
    server.wait_healthy()
    yield server
  finally:
    server.stop()


def start_jax_server(model_path, log_path) -> ServerProcess:
  port = free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  cmd = [
      sys.executable,
      os.path.join(REPO, "launch", "serve_rollout.py"),
      "--model_path",
      model_path,
      "--port",
      str(port),
      "--batch_buckets",
      "4,8",
      "--prompt_buckets",
      "16,32",
      "--new_token_multiple",
      "16",
  ]
  return ServerProcess(cmd, env, log_path, f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def rollout_server(request, tmp_path_factory):
  """(kind, ServerProcess) serving ``tiny_checkpoint``; ``request.param`` is
  "sglang" or "jax". Skips before building the checkpoint when the server
  cannot run here."""
  kind = request.param
  log = str(tmp_path_factory.mktemp(f"{kind}_server") / "server.log")
  if kind == "sglang":
    python = sglang_python()
    if python is None:
      pytest.skip(
          f"real SGLang needs its venv: run scripts/install_sglang.sh and set"
          f" {SGLANG_PYTHON_ENV} to its bin/python"
      )
    ckpt = request.getfixturevalue("tiny_checkpoint")
    server = start_sglang_server(python, ckpt.path, log)
  elif kind == "jax":
    if not os.path.exists(
        os.path.join(REPO, "rspo_jax", "rollout", "jax_engine.py")
    ):
      pytest.skip("rspo_jax/rollout/jax_engine.py does not exist yet")
    ckpt = request.getfixturevalue("tiny_checkpoint")
    server = start_jax_server(ckpt.path, log)
  else:
    raise ValueError(f"unknown server kind {kind!r}")
  try:
    server.wait_healthy()
    yield kind, server
  finally:
    server.stop()
