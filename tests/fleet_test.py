"""Rollout fleets: one ``SGLangClient`` over several servers, one of which
dies during a multi-turn collection.

Policy under test (rollout/sglang_client.py, "Dead servers"): a server that
refuses connections is marked down and the others take its prompts; a
weight sync skips servers that give no HTTP answer, with a warning naming
them, as long as one server loaded the weights; it raises when none did or
when a server that answered refused the weights.

Fast tests use in-process servers (rollout/http_server.py around a small
engine); the slow test SIGKILLs one of two ``launch/serve_rollout.py``
processes serving a tiny random Qwen2 in the middle of ``collect()``.
"""

import http.server
import logging
import os
import signal
import sys
import threading

import numpy as np
import pytest

from rspo_jax.rollout import http_server
from rspo_jax.rollout.collect import CollectConfig, CollectRequest, collect
from rspo_jax.rollout.engine import Engine, GenerationResult, SamplingParams
from rspo_jax.rollout.sglang_client import SGLangClient, SGLangError
from third_party_envs.vector import VectorEnv

pytest_plugins = ("sglang_fixtures",)

LOGGER = "rspo_jax.rollout.sglang_client"
MAX_STEPS = 4
N_GROUPS, GROUP_SIZE = 4, 2


def _fixtures():
  import sglang_fixtures  # pylint: disable=g-import-not-at-top

  return sglang_fixtures


# ------------------------------------------------------------ helpers


class ScriptedEngine(Engine):
  """Answers every prompt with ``reply`` (log-prob -1 per token); weights
  are a directory, refused when it holds a file named ``bad``."""

  def __init__(self, reply):
    self.reply = np.asarray(reply, np.int32)
    self.calls = 0
    self._version = 0

  @property
  def weight_version(self):
    return self._version

  def update_weights(self, params_or_path, version):
    if os.path.exists(os.path.join(params_or_path, "bad")):
      raise ValueError(f"bad weights in {params_or_path}")
    self._version = int(version)

  def generate(self, prompts, params):
    self.calls += 1
    n = min(len(self.reply), params.max_new_tokens)
    return [
        GenerationResult(self.reply[:n], np.full(n, -1.0, np.float32), "length")
        for _ in prompts
    ]


class Fleet:
  """In-process servers that can be stopped (port closed) and restarted."""

  def __init__(self):
    self.servers = {}

  def start(self, engine, port=0):
    srv = http_server.make_server(engine, port=port)
    threading.Thread(
        target=srv.serve_forever, args=(0.05,), daemon=True
    ).start()
    self.servers[srv.url] = srv
    return srv.url

  def stop(self, url):
    srv = self.servers.pop(url)
    srv.shutdown()
    srv.server_close()

  def close(self):
    for url in list(self.servers):
      self.stop(url)


@pytest.fixture
def fleet():
  f = Fleet()
  yield f
  f.close()


def _truncating_handler():
  """Announces 1000 bytes, sends 9 and hangs up: the client reads an
  ``http.client.IncompleteRead`` (a server killed mid-answer)."""

  class Handler(http.server.BaseHTTPRequestHandler):

    def log_message(self, *a):
      pass

    def do_POST(self):  # pylint: disable=invalid-name
      self.rfile.read(int(self.headers.get("Content-Length") or 0))
      self.send_response(200)
      self.send_header("Content-Length", "1000")
      self.end_headers()
      self.wfile.write(b'[{"text":')
      self.close_connection = True

  return Handler


def _weights_dir(root, name, bad=False):
  path = root / name
  path.mkdir()
  if bad:
    (path / "bad").write_text("x")
  return str(path)


def check_complete(records, n_groups, group_size, max_steps):
  """Every (group, member) trajectory present exactly once, steps 0..n-1."""
  by_traj = {}
  for r in records:
    by_traj.setdefault(r.traj_id, []).append(r)
  assert sorted(by_traj) == list(range(n_groups * group_size))
  for tid, steps in by_traj.items():
    idx = [s.step_idx for s in steps]
    assert idx == list(range(len(idx))), (tid, idx)  # contiguous, no dups
    assert 1 <= len(idx) <= max_steps
    assert {s.group_id for s in steps} == {tid // group_size}
    assert [s.done for s in steps] == [False] * (len(idx) - 1) + [True]
    assert all(len(s.response_ids) > 0 for s in steps)


# ------------------------------------------------------------ fast tests


def test_answer_cut_off_mid_body_is_retried_on_the_next_server(fleet):
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _truncating_handler())
  srv.daemon_threads = True
  threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
  try:
    cut = f"http://127.0.0.1:{srv.server_address[1]}"
    good = ScriptedEngine([5, 6])
    client = SGLangClient([cut, fleet.start(good)], backoff_s=0.0)
    (res,) = client.generate([[1]], SamplingParams(max_new_tokens=2))
    assert res.token_ids.tolist() == [5, 6] and good.calls == 1
    assert client.down_urls == []  # it answered (badly): not marked down
  finally:
    srv.shutdown()
    srv.server_close()


def test_dead_server_is_skipped_by_sync_and_rejoins_later(
    fleet, tmp_path, caplog
):
  a, b = ScriptedEngine([4]), ScriptedEngine([4])
  url_a, url_b = fleet.start(a), fleet.start(b)
  client = SGLangClient([url_a, url_b], backoff_s=0.0)
  params = SamplingParams(max_new_tokens=1)
  client.generate([[1], [2]], params)
  assert (a.calls, b.calls) == (1, 1)  # split over both
  port_b = int(url_b.rsplit(":", 1)[1])
  fleet.stop(url_b)

  caplog.set_level(logging.WARNING, logger=LOGGER)
  res = client.generate([[1], [2]], params)  # b's half fails over to a
  assert len(res) == 2 and client.down_urls == [url_b]
  assert any(url_b in m and "down" in m for m in caplog.messages)
  calls = a.calls
  client.generate([[1], [2], [3]], params)
  assert a.calls == calls + 1  # one request: b is no longer tried

  caplog.clear()
  client.update_weights(_weights_dir(tmp_path, "v1"), 1)
  assert client.weight_version == 1 and a.weight_version == 1
  assert client.down_urls == [url_b]
  assert any(url_b in m and "skipped 1 of 2" in m for m in caplog.messages)
  assert client.model_info(url_a)["weight_version"] == "1"
  client.generate([[1]], params)  # checked against version 1

  # b comes back (old weights); the next sync reaches it again.
  b2 = ScriptedEngine([4])
  fleet.start(b2, port=port_b)
  client.update_weights(_weights_dir(tmp_path, "v2"), 2)
  assert client.down_urls == [] and (a.weight_version, b2.weight_version) == (
      2,
      2,
  )
  client.generate([[1], [2]], params)
  assert b2.calls == 1


def test_sync_raises_when_no_server_takes_the_weights(fleet, tmp_path):
  dead = [f"http://127.0.0.1:{_fixtures().free_port()}" for _ in range(2)]
  client = SGLangClient(dead, max_retries=1, backoff_s=0.0)
  with pytest.raises(SGLangError, match="failed on 2 of 2") as info:
    client.update_weights(_weights_dir(tmp_path, "v1"), 1)
  assert all(u in str(info.value) for u in dead)
  assert client.weight_version == 0 and client.down_urls == dead

  # A reachable server refusing the weights is an error, not a skip.
  live = ScriptedEngine([4])
  url = fleet.start(live)
  client = SGLangClient([url, dead[0]], max_retries=0)
  with pytest.raises(SGLangError, match="bad weights") as info:
    client.update_weights(_weights_dir(tmp_path, "v2", bad=True), 2)
  assert dead[0] in str(info.value) and client.weight_version == 0


def test_collection_completes_when_a_server_stops_midway(fleet, tmp_path):
  from rspo_jax.models import tokenizer as tok_lib  # pylint: disable=all

  tok = tok_lib.train_tokenizer(
      ["<think>go</think><action>inc</action> reach the number"] * 4,
      300,
      str(tmp_path / "tok"),
  )
  reply = tok.encode("<think>go</think><action>inc</action>")
  engines = [ScriptedEngine(reply), ScriptedEngine(reply)]
  urls = [fleet.start(e) for e in engines]
  client = SGLangClient(urls, backoff_s=0.0)
  turns = []

  def progress(n_active):
    turns.append(n_active)
    if len(turns) == 1:
      fleet.stop(urls[1])

  venv = VectorEnv(
      "toy",
      {"max_steps": MAX_STEPS},
      N_GROUPS * GROUP_SIZE,
      use_processes=False,
  )
  try:
    records, stats = collect(
        client,
        venv,
        tok,
        CollectRequest(
            list(range(N_GROUPS)), GROUP_SIZE, SamplingParams(max_new_tokens=32)
        ),
        CollectConfig(env_name="toy", max_steps=MAX_STEPS),
        progress=progress,
    )
  finally:
    venv.close()
  assert len(turns) >= 2  # the collection went on after the stop
  check_complete(records, N_GROUPS, GROUP_SIZE, MAX_STEPS)
  assert stats["failed_episodes"] == 0 and stats["invalid_action_rate"] == 0
  assert client.down_urls == [urls[1]]


# ------------------------------------------------------------ slow: SIGKILL


def _toy_checkpoint(root):
  """A tiny random Qwen2 + a tokenizer trained on toy-episode prompts."""
  from rspo_jax import warm_start  # pylint: disable=g-import-not-at-top
  from rspo_jax.models import hf_io
  from rspo_jax.models import tokenizer as tok_lib
  from rspo_jax.models.config import get_model_config

  eps = warm_start.expert_episodes(
      "toy",
      {"max_steps": MAX_STEPS},
      range(16),
      split="train",
      max_steps=MAX_STEPS,
  )
  texts = [t for pair in warm_start.episode_texts(eps, "toy", 2) for t in pair]
  tok_dir = str(root / "tokenizer")
  tok = tok_lib.train_tokenizer(texts, 400, tok_dir)
  cfg = get_model_config(
      "tiny",
      vocab_size=400,
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
  model = hf_io.create_model(cfg, seed=0)
  path = str(root / "v0")
  hf_io.save_hf_model(model, cfg, path, tokenizer_dir=tok_dir)
  return cfg, model, tok, tok_dir, path


def _start_server(model_path, log_path):
  fx = _fixtures()
  port = fx.free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  cmd = [
      sys.executable,
      os.path.join(fx.REPO, "launch", "serve_rollout.py"),
      "--model_path",
      model_path,
      "--port",
      str(port),
      "--batch_buckets",
      "8",
      "--prompt_buckets",
      "256",
      "--new_token_multiple",
      "16",
  ]
  return fx.ServerProcess(cmd, env, log_path, f"http://127.0.0.1:{port}")


@pytest.mark.slow
def test_sigkill_of_one_server_during_collection(tmp_path, caplog):
  from rspo_jax.models import hf_io  # pylint: disable=g-import-not-at-top

  cfg, model, tok, tok_dir, path = _toy_checkpoint(tmp_path)
  servers = [
      _start_server(path, str(tmp_path / f"server{i}.log")) for i in range(2)
  ]
  venv = None
  try:
    for s in servers:
      s.wait_healthy()
    survivor, victim = servers
    client = SGLangClient(
        [s.url for s in servers],
        vocab_size=cfg.vocab_size,
        timeout_s=120,
        backoff_s=0.2,
    )
    caplog.set_level(logging.WARNING, logger=LOGGER)
    turns, killer = [], []

    def progress(n_active):
      turns.append(n_active)
      if len(turns) == 1:
        # Freeze the victim so that the next turn's request to it is in
        # flight (queued by the kernel, unanswered) when SIGKILL lands.
        os.kill(victim.proc.pid, signal.SIGSTOP)
        t = threading.Timer(1.0, os.kill, (victim.proc.pid, signal.SIGKILL))
        t.start()
        killer.append(t)

    venv = VectorEnv(
        "toy",
        {"max_steps": MAX_STEPS},
        N_GROUPS * GROUP_SIZE,
        use_processes=False,
    )
    records, stats = collect(
        client,
        venv,
        tok,
        CollectRequest(
            list(range(N_GROUPS)),
            GROUP_SIZE,
            SamplingParams(
                temperature=1.0, max_new_tokens=16, stop_strings=("</action>",)
            ),
            seed=3,
        ),
        CollectConfig(
            env_name="toy", max_steps=MAX_STEPS, max_prompt_tokens=256
        ),
        progress=progress,
    )
    killer[0].join()
    assert victim.proc.wait(timeout=30) == -signal.SIGKILL
    assert len(turns) >= 2  # turns were played after the kill
    check_complete(records, N_GROUPS, GROUP_SIZE, MAX_STEPS)
    assert stats["failed_episodes"] == 0
    assert client.down_urls == [victim.url]

    # Weight sync reaches the survivor; the dead server is named.
    caplog.clear()
    new = _fixtures().perturbed_model(model, cfg, seed=1)
    hf_io.save_hf_model(new, cfg, str(tmp_path / "v1"), tokenizer_dir=tok_dir)
    client.update_weights(str(tmp_path / "v1"), 1)
    assert client.weight_version == 1
    assert client.model_info(survivor.url)["weight_version"] == "1"
    assert any(
        victim.url in m and "skipped 1 of 2" in m for m in caplog.messages
    )
    res = client.generate(
        [records[0].prompt_ids.tolist()] * 3,
        SamplingParams(max_new_tokens=4, seed=0),
    )
    assert len(res) == 3  # all served by the survivor at version 1
    client.close()
  finally:
    if venv is not None:
      venv.close()
    for s in servers:
      s.stop()
