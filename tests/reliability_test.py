"""Faults injected for real: rollout servers, env workers, bad data, bad
numbers, bad input, safety (issue 9). Each test names the fault it injects.

Killing the training process itself (and resuming) is in resume_test.py;
fuzzing of replies and environment actions in fuzz_test.py. The list of
faults and what the system guarantees is docs/reliability.md.
"""

import http.server
import importlib
import importlib.util
import inspect
import json
import os
import re
import socket
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import toy_grpo
from rspo_e2e_test import micro_config
from rspo_jax import build
from rspo_jax import faults
from rspo_jax import models
from rspo_jax import replay
from rspo_jax import sharding
from rspo_jax.checkpoint import RunCheckpointer
from rspo_jax.metrics import read_metrics
from rspo_jax.rollout import http_server
from rspo_jax.rollout import prompts
from rspo_jax.rollout.collect import CollectConfig, CollectRequest, collect
from rspo_jax.rollout.engine import Engine, GenerationResult, SamplingParams
from rspo_jax.rollout.sglang_client import SGLangClient, SGLangError
from rspo_jax.rollout.sglang_client import parse_generate_response
from rspo_jax.rspo import RSPOTrainer
from rspo_jax.types import StepRecord, Trajectory
from third_party_envs import toy
from third_party_envs.vector import VectorEnv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THINK_INC = "<think>up</think><action>inc</action>"
THINK_WAIT = "<think>hm</think><action>wait</action>"  # parsed, not admissible


class ScriptedEngine(Engine):
  """Answers ``reply(call, row)`` (a str, encoded, or token ids) to every
  prompt; log-probs -1. ``on_call(call)`` runs before each answer."""

  def __init__(self, tokenizer, reply, on_call=None):
    self.tokenizer, self.reply, self.on_call = tokenizer, reply, on_call
    self.calls = 0
    self._version = 0

  @property
  def weight_version(self):
    return self._version

  def update_weights(self, params_or_path, version):
    self._version = version

  def generate(self, prompts_, params):
    self.calls += 1
    if self.on_call is not None:
      self.on_call(self.calls)
    out = []
    for row in range(len(prompts_)):
      r = self.reply(self.calls, row)
      ids = (
          self.tokenizer.encode(r, add_special_tokens=False)
          if isinstance(r, str)
          else list(r)
      )
      out.append(
          GenerationResult(
              np.asarray(ids, np.int32),
              np.full(len(ids), -1.0, np.float32),
              "stop",
          )
      )
    return out


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  texts = [
      prompts.build_prompt(
          "toy",
          f"reach the number {t}",
          f"The current number is {x}.",
          ["inc", "dec"],
          [],
          0,
      )
      for t in range(10)
      for x in range(10)
  ] + [THINK_INC, THINK_WAIT] * 20
  return models.train_tokenizer(texts, 300, str(tmp_path_factory.mktemp("tok")))


def _toy_cfg(extra=""):
  return toy_grpo.get_config(
      "train.batch_tasks=2,train.group_size=2,rspo.alpha=0.5,env.max_steps=4,"
      "rollout.max_prompt_tokens=256,rollout.max_new_tokens=16" + extra
  )


# ------------------------------------------------------------ fault hook


def test_fault_hook_kills_at_the_nth_arrival_only():
  code = (
      "from rspo_jax import faults\n"
      "for i in range(3):\n"
      "  faults.maybe_fail('collect')\n"
      "  faults.maybe_fail('a_phase')\n"
      "  print(i, flush=True)\n"
  )
  env = dict(os.environ, PYTHONPATH=ROOT, RSPO_FAULT_AT="a_phase:2")
  out = subprocess.run(
      [sys.executable, "-c", code],
      capture_output=True,
      text=True,
      env=env,
      timeout=60,
  )
  assert out.returncode == -9 and out.stdout == "0\n"
  faults.maybe_fail("a_phase")  # unset here: nothing happens
  assert faults.parse("checkpoint") == ("checkpoint", 1)
  for bad in ("nowhere", "a_phase:0", "a_phase:x"):
    with pytest.raises(ValueError, match="RSPO_FAULT_AT"):
      faults.parse(bad)


# --------------------------------------------------------- rollout servers


class _SilentServer:
  """Accepts TCP connections and never answers (a hung server)."""

  def __init__(self):
    self.sock = socket.socket()
    self.sock.bind(("127.0.0.1", 0))
    self.sock.listen(16)
    self.conns = []
    self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
    threading.Thread(target=self._accept, daemon=True).start()

  def _accept(self):
    while True:
      try:
        self.conns.append(self.sock.accept()[0])
      except OSError:
        return

  def close(self):
    self.sock.close()
    for c in self.conns:
      c.close()


def _sglang_item(token_ids):
  return {
      "text": "",
      "meta_info": {
          "output_token_logprobs": [[-0.5, t, None] for t in token_ids],
          "finish_reason": {"type": "length"},
      },
  }


class _Answering(http.server.BaseHTTPRequestHandler):
  """A well-behaved /generate: token 3 for every prompt."""

  def log_message(self, *a):
    pass

  def do_POST(self):  # noqa: N802
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    data = json.dumps([_sglang_item([3]) for _ in body["input_ids"]]).encode()
    self.server.hits += 1
    self.send_response(200)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


def _serve(handler):
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  srv.daemon_threads, srv.hits = True, 0
  threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
  return srv, "http://127.0.0.1:%d" % srv.server_address[1]


def test_hung_server_times_out_every_retry_and_is_named():
  """Complements sglang_test (slow answer, no retries): a server that
  accepts and never answers costs max_retries + 1 timeouts, then a clear
  error; health() and weight sync do not hang either."""
  srv = _SilentServer()
  try:
    client = SGLangClient(srv.url, timeout_s=0.2, max_retries=2, backoff_s=0.01)
    with pytest.raises(SGLangError) as info:
      client.generate([[1, 2]], SamplingParams(max_new_tokens=1))
    msg = str(info.value)
    assert srv.url in msg and "3 attempts" in msg and "timed out" in msg
    with pytest.raises(SGLangError, match=re.escape(srv.url)):
      client.update_weights("/nonexistent", 1)
    assert client.weight_version == 0  # unchanged by the failed sync
    assert not client.health()
  finally:
    srv.close()


def test_server_dying_mid_run_fails_over_then_names_it():
  a, url_a = _serve(_Answering)
  b, url_b = _serve(_Answering)
  client = SGLangClient([url_a, url_b], max_retries=1, backoff_s=0.0)
  p = SamplingParams(max_new_tokens=1)
  assert [r.token_ids.tolist() for r in client.generate([[1]] * 3, p)] == [
      [3]
  ] * 3
  a.shutdown()
  a.server_close()  # server A dies
  hits = b.hits
  for _ in range(4):  # every call still answered, by B
    assert client.generate([[1]], p)[0].token_ids.tolist() == [3]
  assert b.hits == hits + 4
  b.shutdown()
  b.server_close()  # both dead: a clear error naming a server
  with pytest.raises(SGLangError, match="refused") as info:
    client.generate([[1]], p)
  assert url_a in str(info.value) or url_b in str(info.value)


def test_garbage_token_ids_are_refused():
  """A server answering negative or huge token ids (which would crash the
  tokenizer or wrap in an embedding lookup) is a failed answer."""
  for bad in (-1, 2**40, 1.0, True):
    item = _sglang_item([5])
    item["meta_info"]["output_token_logprobs"][0][1] = bad
    with pytest.raises(ValueError, match="token_id"):
      parse_generate_response([item], 1)


# ----------------------------------------------------- env workers, collect


def test_crashed_env_worker_fails_its_episodes_which_are_not_trained_on(
    tokenizer, tmp_path
):
  """SIGKILL of an environment worker during a real collection: it is
  restarted, its two episodes come back failed, counted in
  stats['failed_episodes'] and dropped from what the trainer learns from."""
  cfg = _toy_cfg()
  venv = VectorEnv(
      "toy", {"max_steps": 4}, 4, num_workers=2, step_timeout_s=30.0
  )
  victim = venv.worker_of(0)
  assert venv.worker_of(1) == victim and venv.worker_of(2) != victim

  def kill_at_turn_1(call):  # call 3 = turn 1, rows 0-1 (the victim's)
    if call == 3:
      os.kill(venv.worker_pids()[victim], 9)

  engine = ScriptedEngine(tokenizer, lambda c, r: THINK_WAIT, kill_at_turn_1)
  trainer = RSPOTrainer(
      cfg,
      policy=None,
      ref_params=None,
      critic=None,
      engine=engine,
      venv=venv,
      tokenizer=tokenizer,
      workdir=str(tmp_path),
      sync_engine=lambda *a: None,
      num_train_tasks=256,
      progress=False,
  )
  try:
    records, stats = trainer.collect_groups(None, 2, "B")
    assert stats["failed_episodes"] == 2 and stats["episodes"] == 4
    assert venv.num_restarts == 1
    # Only the other worker's episodes (traj ids 2, 3 of the collection)
    # reach the trainer, each whole: 4 steps that did not move.
    base = trainer.state.collections * 100_000
    assert sorted({r.traj_id for r in records}) == [base + 2, base + 3]
    assert len(records) == 8 and not any(r.failed for r in records)
    assert sorted(r.step_idx for r in records) == [0, 0, 1, 1, 2, 2, 3, 3]
    # The restarted worker plays the next collection normally.
    records, stats = trainer.collect_groups(None, 2, "B")
    assert stats["failed_episodes"] == 0 and len(records) == 16
  finally:
    venv.close()
    trainer.metrics.close()
    trainer.ckpt.close()


def test_long_prompts_are_left_truncated_and_counted(tokenizer):
  venv = VectorEnv("toy", {"max_steps": 3}, 2, use_processes=False)
  engine = ScriptedEngine(tokenizer, lambda c, r: THINK_INC)
  cfg = CollectConfig(env_name="toy", max_steps=3, max_prompt_tokens=40)
  records, stats = collect(
      engine,
      venv,
      tokenizer,
      CollectRequest([5], 2, SamplingParams(max_new_tokens=16)),
      cfg,
  )
  start, target = toy.toy_task("train", 5)
  full = prompts.render_chat(
      tokenizer,
      prompts.build_prompt(
          "toy",
          f"reach the number {target}",
          f"The current number is {start}.",
          ["inc", "dec"],
          [],
          0,
      ),
  )
  assert len(full) > 40  # so every prompt of the episode is truncated
  assert stats["prompt_truncated"] == len(records) == stats["env_steps"]
  tail = tokenizer.encode(
      "<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
  )
  for r in records:  # the newest tokens survive: generation prompt last
    assert len(r.prompt_ids) == 40
    assert r.prompt_ids[-len(tail) :].tolist() == tail


# ------------------------------------------------------------- bad data


def test_corrupted_shard_in_the_buffer_is_named(tmp_path):
  """Through ReplayBuffer (the trainer's path); replay_test covers the
  shard reader itself: truncated / corrupted / empty shards, wrong schema
  version, missing fields, SIGKILL mid-shard."""
  d = str(tmp_path / "replay")
  buf = replay.ReplayBuffer(d)
  steps = [
      StepRecord(
          task_id=0,
          group_id=0,
          traj_id=t,
          step_idx=0,
          prompt_ids=np.arange(5, dtype=np.int32),
          response_ids=np.arange(3, dtype=np.int32),
          behavior_logp=np.zeros(3, np.float32),
      )
      for t in range(4)
  ]
  buf.add_trajectories([Trajectory([s]) for s in steps])
  (path,) = replay.list_shards(d)
  data = open(path, "rb").read()
  with open(path, "wb") as f:
    f.write(data[: len(data) // 2])
  with pytest.raises(replay.ReplayFormatError, match=re.escape(path)):
    replay.ReplayBuffer(d).sample_groups(1, "reward", np.random.default_rng(0))


def test_checkpoint_of_another_config_or_shape_is_refused(tmp_path):
  d = str(tmp_path / "checkpoints")
  ck = RunCheckpointer(d)
  w = {"w": jnp.ones((2, 3))}
  ck.save(1, {"policy": w}, {"fingerprint": {"model": "tiny", "algo": "grpo"}})
  ck.close()
  ck = RunCheckpointer(d)
  with pytest.raises(ValueError, match=rf"{re.escape(d)}/1.*'algo'"):
    ck.restore({"policy": w}, fingerprint={"model": "tiny", "algo": "ppo"})
  with pytest.raises(ValueError, match=rf"{re.escape(d)}/1 does not match"):
    ck.restore({"policy": {"w": jnp.ones((3, 3))}})
  with pytest.raises(ValueError, match="critic"):  # a GRPO checkpoint as PPO
    ck.restore({"policy": w, "critic": w})
  states, meta = ck.restore(
      {"policy": w}, fingerprint={"model": "tiny", "algo": "grpo"}
  )
  np.testing.assert_array_equal(states["policy"]["w"], w["w"])
  ck.close()
  with open(os.path.join(d, "1", "meta", "metadata"), "w") as f:
    f.write("{damaged")
  with pytest.raises(ValueError, match=rf"{re.escape(d)}/1 is unreadable"):
    RunCheckpointer(d).restore({"policy": w})


def test_tokenizer_model_mismatch_is_refused(tokenizer):
  """models_test covers check_tokenizer_matches; build_run calls it."""
  cfg = models.get_model_config("tiny", vocab_size=len(tokenizer) - 1)
  with pytest.raises(ValueError, match=r"vocab_size \(%d\)" % cfg.vocab_size):
    models.check_tokenizer_matches(tokenizer, cfg)
  src = inspect.getsource(importlib.import_module("rspo_jax.build"))
  assert "check_tokenizer_matches(" in src  # build_run checks every run


def test_missing_model_files_are_named(tmp_path):
  """hf_io_test covers damaged files; here nothing is there at all."""
  with pytest.raises(ValueError, match=re.escape(str(tmp_path / "nope"))):
    models.load_hf_model(str(tmp_path / "nope"))
  with pytest.raises(ValueError, match="no tokenizer"):
    models.load_tokenizer(str(tmp_path))


# ------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "override, match",
    [
        ("train.foo=1", "unknown config key 'train.foo'"),
        ("seed.x=1", "unknown config key 'seed.x'"),
        ("nokey", "is not key=value"),
        ("train.batch_tasks=abc", "'train.batch_tasks' expects type int"),
        ("steps=1.5", "'train.total_steps' expects type int"),
        ("mesh.shape=2", "'mesh.shape' expects type tuple"),
        ("rspo=maybe", "'rspo.enabled' wants a bool"),
        ("rspo.alpha=2", "bad config value rspo.alpha=2.0"),
        ("rspo.sampling=best", "bad config value rspo.sampling='best'"),
        ("model=gpt5", "unknown model preset 'gpt5'"),
    ],
)
def test_bad_config_overrides_name_the_key(override, match):
  with pytest.raises(ValueError, match=re.escape(match)):
    toy_grpo.get_config(override)


@pytest.mark.parametrize(
    "flag, match",
    [
        ("--config.foo=1", "no config field 'foo'"),
        ("--config.rspo.alpha=2.0", "bad config value rspo.alpha=2.0"),
    ],
)
def test_train_cli_refuses_bad_flags_before_running(flag, match):
  cmd = [
      sys.executable,
      os.path.join(ROOT, "launch/train.py"),
      f"--config={ROOT}/configs/toy_grpo.py",
      flag,
      "--dry_run",
  ]
  out = subprocess.run(
      cmd,
      capture_output=True,
      text=True,
      timeout=120,
      env=dict(os.environ, XLA_FLAGS=""),
  )
  assert out.returncode != 0 and match in out.stderr, out.stderr[-2000:]
  assert not out.stdout.strip()  # no plan printed, nothing trained


@pytest.mark.parametrize(
    "shape, match",
    [
        ((16, 1, 1), "does not fit the 8 available devices"),
        ((3, -1, 1), "does not fit the 8 available devices"),
        ((-1, -1, 1), "at most one -1"),
        ((0, 1, 1), "does not fit"),
        ((8, 1), "3 entries"),
    ],
)
def test_impossible_meshes_are_refused(shape, match):
  assert len(jax.devices()) == 8  # conftest
  with pytest.raises(ValueError, match=re.escape(match)):
    sharding.make_mesh(shape)


@pytest.mark.parametrize(
    "reply, penalised",
    [
        ("just text, no tags", True),
        ("<think>t</think><action></action>", True),
        ("<action>inc", True),  # never closed
        ("\x00\x01\ufffd binary-ish \x7f", True),
        pytest.param("x" * 2000, True, id="2000-chars"),  # > max_new_tokens
        ([2, 2, 2], True),  # only special tokens: decodes to ""
        ([], True),  # an empty reply
        ([299, 5000, 1 << 20], True),  # ids past the tokenizer (padded vocab)
        # Well formed, but not an action of this environment: not penalised
        # (verl-agent's rule), and nothing moves.
        ("<think>向上</think><action>增加</action>", False),
        ("<think>t</think><action>זוז ימינה</action>", False),
    ],
)
def test_malformed_replies_change_nothing(tokenizer, reply, penalised):
  venv = VectorEnv("toy", {"max_steps": 3}, 2, use_processes=False)
  engine = ScriptedEngine(tokenizer, lambda c, r: reply)
  cfg = CollectConfig(env_name="toy", max_steps=3, max_prompt_tokens=256)
  records, stats = collect(
      engine,
      venv,
      tokenizer,
      CollectRequest([7], 2, SamplingParams(max_new_tokens=16)),
      cfg,
  )
  assert len(records) == 6 and stats["failed_episodes"] == 0
  assert stats["invalid_action_rate"] == float(penalised)
  for r in records:
    assert r.invalid == penalised and not r.won
    assert r.env_reward == pytest.approx(-0.1 * penalised)
    assert r.anchor_obs == records[0].anchor_obs  # the state never moved


def test_action_without_think_is_sent_but_penalised(tokenizer):
  """verl-agent's rule: tags present but no <think> -> the action goes to
  the environment, the step is still penalised."""
  venv = VectorEnv("toy", {"max_steps": 2}, 1, use_processes=False)
  engine = ScriptedEngine(tokenizer, lambda c, r: "<action>inc</action>")
  cfg = CollectConfig(env_name="toy", max_steps=2, max_prompt_tokens=256)
  records, _ = collect(
      engine,
      venv,
      tokenizer,
      CollectRequest([7], 1, SamplingParams(max_new_tokens=16)),
      cfg,
  )
  start, _ = toy.toy_task("train", 7)
  assert [r.anchor_obs for r in records] == [
      f"The current number is {start + i}." for i in range(len(records))
  ]
  assert all(r.invalid and r.action == "inc" for r in records)


# ---------------------------------------------------------------- safety

_UNSAFE = re.compile(
    r"\bimport pickle\b|\bpickle\.loads?\(|\bcloudpickle\b|\bdill\b|"
    r"torch\.load\(|allow_pickle\s*=\s*True|joblib\.load|"
    r"trust_remote_code\s*=\s*True|\beval\(|\bexec\("
)


def _sources():
  for top in ("rspo_jax", "third_party_envs", "launch"):
    for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
      for f in files:
        if f.endswith(".py"):
          path = os.path.join(dirpath, f)
          yield os.path.relpath(path, ROOT), open(path).read()


# Reviewed exceptions: (file, match) -> why it is acceptable.
_ALLOWED = {
    # ALFWorld's planner-translation cache: pickles this process wrote
    # itself (under the env's own cache dir, keyed by the sha256 of the PDDL
    # it translates); never a file that came with a model or a download.
    ("third_party_envs/alfworld/speedups.py", "import pickle"),
    ("third_party_envs/alfworld/speedups.py", "pickle.loads("),
}


def test_only_safe_loaders_in_the_package():
  """Weights come from safetensors, run state from orbax, replay from our
  own byte format: nothing that unpickles or runs downloaded code."""
  hits = {
      (p, m.group()) for p, text in _sources() for m in _UNSAFE.finditer(text)
  }
  assert hits <= _ALLOWED, hits - _ALLOWED
  calls = [
      (p, m.group())
      for p, text in _sources()
      for m in re.finditer(r"from_pretrained\([^)]*\)", text, re.S)
  ]
  assert calls and all("trust_remote_code=False" in c for _, c in calls)


def test_servers_bind_localhost_by_default(tokenizer):
  default = inspect.signature(http_server.make_server).parameters["host"]
  assert default.default == "127.0.0.1"
  srv = http_server.make_server(
      ScriptedEngine(tokenizer, lambda c, r: ""), port=0
  )
  try:
    assert srv.server_address[0] == "127.0.0.1"
  finally:
    srv.server_close()
  spec = importlib.util.spec_from_file_location(
      "serve_rollout", os.path.join(ROOT, "launch/serve_rollout.py")
  )
  serve_rollout = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(serve_rollout)
  assert serve_rollout.parse_args(["--preset", "tiny"]).host == "127.0.0.1"


# ------------------------------------------------------------ bad numbers


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf, on purpose
def test_nonfinite_updates_are_skipped_then_stop_the_run(tmp_path):
  """Inf rewards (-> NaN advantages) and a NaN reference policy (-> NaN
  loss) in a real RSPO run: each bad update is skipped (parameters
  untouched) and reported; the train.max_bad_steps-th in a row raises
  FloatingPointError, and the latest checkpoint holds the last good
  parameters."""
  cfg = micro_config("grpo", "train.max_bad_steps=3,steps=1")
  run = build.build_run(cfg, str(tmp_path), progress=False)
  t = run.trainer
  try:
    t.run()  # one good loop: checkpoints 1 (after B) and 2 (after A)
    good = _leaves(t.a.params)
    # NaN advantages: every outcome reward infinite.
    records, _ = t.collect_groups(t.a, 2, "A")
    for r in records:
      r.env_reward = float("inf")  # outcome rewards sum env rewards
    m = t.update(t.a, None, records, [], "outcome", step_key=99)
    assert m["skipped"] == 1.0 and t.state.bad_steps == 1
    assert all(np.array_equal(a, b) for a, b in zip(good, _leaves(t.a.params)))
    # NaN loss from here on: B's update (2nd bad) is skipped and the run
    # goes on; A's (3rd in a row) stops it.
    t.ref_params = jax.tree.map(lambda x: x * jnp.nan, t.ref_params)
    with cfg.unlocked():
      cfg.train.total_steps = 3
    with pytest.raises(FloatingPointError, match=re.escape(t.ckpt.directory)):
      t.run()
    assert t.state.bad_steps == 3 and t.state.a_steps == 1
    b_rows = read_metrics(os.path.join(str(tmp_path), "metrics.jsonl"), "B")
    assert [r["skipped"] for r in b_rows] == [0.0, 1.0]  # reported
    assert t.ckpt.latest_step() == 3  # written after B's skipped phase
    states, meta = t.ckpt.restore(t._states())  # pylint: disable=W0212
    assert meta["a_steps"] == 1 and meta["bad_steps"] == 2
    restored = _leaves(states["policy"].params)
    assert all(np.isfinite(x).all() for x in restored)
    assert all(np.array_equal(a, b) for a, b in zip(good, restored))
  finally:
    run.close()
