"""Tests of rollout/sglang_client.py, rollout/http_server.py and, marked
``sglang``, the client against a real SGLang server (and our own server)."""

import http.server
import json
import os
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from rspo_jax.models import hf_io
from rspo_jax.rollout import http_server
from rspo_jax.rollout.engine import Engine, GenerationResult, SamplingParams
from rspo_jax.rollout.sglang_client import (
    SGLangClient,
    SGLangError,
    SGLangRequestError,
    make_generate_request,
    parse_generate_response,
    split_evenly,
)

pytest_plugins = ("sglang_fixtures",)  # fixtures; helpers imported lazily


def _fixtures_module():
  """tests/sglang_fixtures.py, imported after pytest registered it (a
  top-level import would keep pytest from rewriting its asserts)."""
  import sglang_fixtures  # pylint: disable=g-import-not-at-top

  return sglang_fixtures


# --------------------------------------------------------------- a toy engine


class BigramEngine(Engine):
  """Next-token logits ``table[last token]``; numpy sampling, row ``i`` of a
  call with seed ``s`` draws from ``default_rng([s, i])``. Weights are a
  ``table.npy`` file in a directory."""

  def __init__(self, table, version=0):
    self.table = np.asarray(table, np.float64)
    self._version = version
    self.healthy = True
    self.calls = []

  @property
  def weight_version(self):
    return self._version

  def health(self):
    return self.healthy

  def update_weights(self, params_or_path, version):
    f = os.path.join(params_or_path, "table.npy")
    if not os.path.exists(f):
      raise ValueError(f"no table.npy in {params_or_path}")
    table = np.load(f)
    if table.shape != self.table.shape:
      raise ValueError(f"table shape {table.shape} != {self.table.shape}")
    self.table, self._version = table, int(version)

  def generate(self, prompts, params):
    self.calls.append((len(prompts), params.seed))
    seed = 0 if params.seed is None else params.seed
    out = []
    for i, p in enumerate(prompts):
      rng = np.random.default_rng([seed, i])
      last, toks, lps, reason = p[-1], [], [], "length"
      for _ in range(params.max_new_tokens):
        logits = self.table[last]
        logp = logits - np.logaddexp.reduce(logits)
        if params.temperature == 0:
          tok = int(np.argmax(logits))
        else:
          z = logits / params.temperature
          tok = int(rng.choice(len(z), p=np.exp(z - np.logaddexp.reduce(z))))
        toks.append(tok)
        lps.append(logp[tok])
        last = tok
        if tok in params.stop_token_ids:
          reason = "stop"
          break
      out.append(
          GenerationResult(
              np.asarray(toks, np.int32), np.asarray(lps, np.float32), reason
          )
      )
    return out


V = 6
TABLE = np.log(np.arange(1, V * V + 1, dtype=np.float64).reshape(V, V))


@pytest.fixture
def serve():
  """serve(engine or handler class) -> url; stops every server afterwards."""
  servers = []

  def start(engine_or_handler, **kw):
    if isinstance(engine_or_handler, Engine):
      srv = http_server.make_server(engine_or_handler, port=0, **kw)
    else:
      srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), engine_or_handler)
      srv.daemon_threads = True
      srv.hits = 0
    threading.Thread(
        target=srv.serve_forever, args=(0.05,), daemon=True
    ).start()
    servers.append(srv)
    host, port = srv.server_address[:2]
    return srv, f"http://{host}:{port}"

  yield start
  for srv in servers:
    srv.shutdown()
    srv.server_close()


def _handler(status, body, delay_s=0.0):
  class Handler(http.server.BaseHTTPRequestHandler):

    def log_message(self, *a):
      pass

    def _answer(self):
      self.server.hits += 1
      n = int(self.headers.get("Content-Length") or 0)
      self.rfile.read(n)
      time.sleep(delay_s)
      data = body.encode()
      try:
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
      except BrokenPipeError:  # the client gave up (timeout test)
        pass

    do_GET = do_POST = _answer

  return Handler


def _dead_url():
  return f"http://127.0.0.1:{_fixtures_module().free_port()}"


# ------------------------------------------------------ request / response


def test_make_generate_request_shape_and_seeds():
  params = SamplingParams(
      temperature=1.0,
      top_p=0.9,
      max_new_tokens=5,
      stop_token_ids=(2,),
      stop_strings=("</a>",),
      seed=7,
  )
  body = make_generate_request([[1, 2], np.array([3])], params, first_index=4)
  sp = dict(
      temperature=1.0,
      top_p=0.9,
      top_k=-1,
      max_new_tokens=5,
      stop=["</a>"],
      stop_token_ids=[2],
  )
  assert body == {
      "input_ids": [[1, 2], [3]],
      "sampling_params": [
          dict(sp, sampling_seed=11),
          dict(sp, sampling_seed=12),
      ],
      "return_logprob": True,
  }
  unseeded = make_generate_request([[1]], SamplingParams(max_new_tokens=3))
  assert unseeded["sampling_params"]["max_new_tokens"] == 3
  assert "sampling_seed" not in unseeded["sampling_params"]


@pytest.mark.parametrize(
    "prompts, params, match",
    [
        ([[]], {}, "prompt 0 is empty"),
        ([[1], [-1]], {}, "prompt 1"),
        ([[1, 9]], {}, r"outside \[0, 8\)"),
        ([[1.5]], {}, "non-integer"),
        ([[1]], {"stop_token_ids": (8,)}, "stop_token_ids"),
    ],
)
def test_make_generate_request_rejects_bad_input(prompts, params, match):
  with pytest.raises(ValueError, match=match):
    make_generate_request(prompts, SamplingParams(**params), vocab_size=8)


@pytest.mark.parametrize(
    "params, match",
    [
        ({"max_new_tokens": -1}, r"max_new_tokens must be >= 0: -1"),
        ({"temperature": -0.5}, r"temperature must be >= 0: -0.5"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]: 0.0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]: 1.5"),
        ({"temperature": float("nan")}, "temperature"),
    ],
)
def test_sampling_params_reject_bad_values(params, match):
  with pytest.raises(ValueError, match=match):
    SamplingParams(**params)


def _sglang_item(pairs, reason, version="default"):
  """A /generate result as SGLang 0.5.23 answers it."""
  return {
      "text": "",
      "output_ids": [t for _, t in pairs],
      "meta_info": {
          "finish_reason": reason,
          "weight_version": version,
          "output_token_logprobs": [[lp, t, None] for lp, t in pairs],
      },
  }


def test_parse_generate_response_reads_sglang_answer():
  payload = [
      _sglang_item([(-0.5, 4), (-1.25, 2)], {"type": "stop", "matched": 2}),
      _sglang_item([(-2.0, 7)], {"type": "length", "length": 1}),
  ]
  a, b = parse_generate_response(payload, 2)
  np.testing.assert_array_equal(a.token_ids, [4, 2])
  np.testing.assert_array_equal(a.logprobs, np.float32([-0.5, -1.25]))
  assert (a.finish_reason, b.finish_reason) == ("stop", "length")
  np.testing.assert_array_equal(b.token_ids, [7])
  (single,) = parse_generate_response(payload[1], 1)  # unbatched answer
  np.testing.assert_array_equal(single.token_ids, [7])


@pytest.mark.parametrize(
    "payload, match",
    [
        ("oops", "JSON list"),
        ({"error": "x"}, "is an error: x"),
        ([], "expected 1 results, got 0"),
        (["text"], "not an object"),
        ([{"meta_info": {}}], "output_token_logprobs"),
        (
            [_sglang_item([(-1.0, 2.5)], {"type": "stop"})],
            r"\[logprob, token_id",
        ),
        ([_sglang_item([(0.7, 2)], {"type": "stop"})], "<= 0"),
        ([_sglang_item([(-1.0, 2)], {"type": "weird"})], "finish_reason"),
        ([_sglang_item([(-1.0, 2)], {"type": "stop"}, "3")], "stale"),
    ],
)
def test_parse_generate_response_rejects_invalid(payload, match):
  with pytest.raises(ValueError, match=match):
    parse_generate_response(payload, 1, expected_version="4")


def test_split_evenly():
  assert split_evenly(5, 2) == [(0, 3), (3, 5)]
  assert split_evenly(2, 3) == [(0, 1), (1, 2)]
  assert split_evenly(4, 1) == [(0, 4)]


def test_client_rejects_tempered_logprobs_and_bad_urls():
  client = SGLangClient("http://127.0.0.1:1")
  with pytest.raises(ValueError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
    client.generate([[1]], SamplingParams(temperature=0.7))
  with pytest.raises(ValueError, match="http://"):
    SGLangClient(["127.0.0.1:30000"])
  with pytest.raises(ValueError, match="empty"):
    SGLangClient([])
  with pytest.raises(TypeError, match="directory path"):
    client.update_weights({"w": 1}, 1)


# ------------------------------------------------------------- http_server


def test_parse_sampling_params_defaults_and_errors():
  params, seed = http_server.parse_sampling_params(
      {
          "temperature": 0.5,
          "stop": "x",
          "stop_token_ids": [3],
          "n": 1,
          "sampling_seed": 9,
      }
  )
  assert params == SamplingParams(
      temperature=0.5,
      top_p=1.0,
      max_new_tokens=128,
      stop_token_ids=(3,),
      stop_strings=("x",),
  )
  assert seed == 9
  greedy, _ = http_server.parse_sampling_params({"top_k": 1})
  assert greedy.temperature == 0.0
  for bad, match in (
      ({"bogus": 1}, "unknown"),
      ({"top_k": 5}, "top_k"),
      ({"n": 2}, "not supported"),
      ({"max_new_tokens": -1}, "max_new_tokens"),
  ):
    with pytest.raises(http_server.BadRequest, match=match):
      http_server.parse_sampling_params(bad)


def test_plan_engine_calls_groups_consecutive_seeds():
  a = SamplingParams(max_new_tokens=4)
  b = SamplingParams(max_new_tokens=8)
  per_prompt = [(a, 5), (a, 6), (b, None), (a, 7), (b, None)]
  assert http_server.plan_engine_calls(per_prompt) == [
      (SamplingParams(max_new_tokens=4, seed=5), [0, 1, 3]),
      (b, [2, 4]),
  ]
  gaps = [(a, 1), (a, 3)]
  assert http_server.plan_engine_calls(gaps) == [
      (SamplingParams(max_new_tokens=4, seed=1), [0]),
      (SamplingParams(max_new_tokens=4, seed=3), [1]),
  ]


def test_client_through_engine_server_matches_engine(serve):
  engine = BigramEngine(TABLE)
  _, url = serve(engine, vocab_size=V)
  client = SGLangClient(url, vocab_size=V)
  assert client.health()
  prompts = [[0], [1, 2], [0], [5]]
  params = SamplingParams(max_new_tokens=4, stop_token_ids=(3,), seed=11)
  got = client.generate(prompts, params)
  want = BigramEngine(TABLE).generate(prompts, params)
  assert engine.calls == [(4, 11)]  # one batched engine call, seed 11
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g.token_ids, w.token_ids)
    np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-6)
    assert g.finish_reason == w.finish_reason
  assert client.model_info()["weight_version"] == "0"


def test_engine_server_answers_sglang_shapes(serve):
  srv, url = serve(BigramEngine(TABLE), vocab_size=V)

  def post(body):
    return _post(url + "/generate", body)

  status, one = post(
      {
          "input_ids": [1],
          "return_logprob": True,
          "sampling_params": {"temperature": 0, "max_new_tokens": 2},
      }
  )
  # Greedy from token 1: argmax of table[1] is 5, then of table[5] is 5.
  assert status == 200 and one["output_ids"] == [5, 5]
  meta = one["meta_info"]
  assert meta["finish_reason"] == {"type": "length", "length": 2}
  lp = TABLE[1, 5] - np.logaddexp.reduce(TABLE[1])
  assert meta["output_token_logprobs"][0][1:] == [5, None]
  assert meta["output_token_logprobs"][0][0] == pytest.approx(lp)
  assert (meta["prompt_tokens"], meta["weight_version"]) == (1, "0")
  status, batch = post(
      {"input_ids": [[1], [2]], "sampling_params": {"max_new_tokens": 0}}
  )
  assert status == 200 and [b["output_ids"] for b in batch] == [[], []]
  for body, match in (
      ({"input_ids": [[1, 6]]}, r"outside \[0, 6\)"),
      ({"text": "hi"}, "input_ids"),
      ({"input_ids": [1], "stream": True}, "stream"),
      (
          {"input_ids": [1], "sampling_params": {"temperature": -1}},
          "temperature",
      ),
      ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
  ):
    status, err = post(body)
    assert status == 400 and match.split("\\")[0] in err["message"]
  srv.engine.healthy = False
  assert not SGLangClient(url).health()


def _post(url, body):
  req = urllib.request.Request(
      url,
      data=json.dumps(body).encode(),
      headers={"Content-Type": "application/json"},
  )
  try:
    with urllib.request.urlopen(req, timeout=10) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


def test_update_weights_reaches_every_server(serve, tmp_path):
  engines = [BigramEngine(TABLE), BigramEngine(TABLE)]
  urls = [serve(e)[1] for e in engines]
  client = SGLangClient(urls, vocab_size=V)
  new = TABLE[::-1].copy()
  np.save(tmp_path / "table.npy", new)
  client.update_weights(tmp_path, 3)
  assert client.weight_version == 3
  assert all(e.weight_version == 3 for e in engines)
  assert [client.model_info(u)["weight_version"] for u in urls] == ["3", "3"]
  (res,) = client.generate(
      [[0]], SamplingParams(temperature=0, max_new_tokens=1)
  )
  assert res.token_ids.tolist() == [int(np.argmax(new[0]))]
  bad = tmp_path / "empty"
  bad.mkdir()
  with pytest.raises(SGLangError, match="no table.npy") as info:
    client.update_weights(bad, 4)
  assert urls[0] in str(info.value) and client.weight_version == 3
  client.flush_cache()


def test_stale_server_is_refused_after_sync(serve, tmp_path):
  engine = BigramEngine(TABLE)
  _, url = serve(engine)
  np.save(tmp_path / "table.npy", TABLE)
  client = SGLangClient(url, max_retries=1, backoff_s=0.0)
  client.update_weights(tmp_path, 2)
  engine._version = 1  # e.g. the server restarted from an old checkpoint
  with pytest.raises(SGLangError, match="stale"):
    client.generate([[0]], SamplingParams(max_new_tokens=1))


# ---------------------------------------------------------------- failures


def test_garbage_answer_is_retried_then_named(serve):
  srv, url = serve(_handler(200, "<html>not json</html>"))
  client = SGLangClient(url, max_retries=2, backoff_s=0.0)
  with pytest.raises(SGLangError, match="not JSON") as info:
    client.generate([[1]], SamplingParams(max_new_tokens=1))
  assert url in str(info.value) and "3 attempts" in str(info.value)
  assert srv.hits == 3


def test_bad_request_is_not_retried(serve):
  srv, url = serve(_handler(400, json.dumps({"message": "bad field x"})))
  client = SGLangClient(url, max_retries=3, backoff_s=0.0)
  with pytest.raises(SGLangRequestError, match="bad field x"):
    client.generate([[1]], SamplingParams(max_new_tokens=1))
  assert srv.hits == 1


def test_timeout_and_refused_connections_fail_with_url(serve):
  _, slow = serve(_handler(200, "[]", delay_s=1.0))
  client = SGLangClient(slow, timeout_s=0.1, max_retries=0)
  with pytest.raises(SGLangError, match="timed out") as info:
    client.generate([[1]], SamplingParams(max_new_tokens=1))
  assert slow in str(info.value)
  dead = _dead_url()
  with pytest.raises(SGLangError, match="Connection refused|URLError"):
    SGLangClient(dead, max_retries=1, backoff_s=0.0).generate(
        [[1]], SamplingParams(max_new_tokens=1)
    )
  assert not SGLangClient(dead).health()


def test_failover_and_round_robin_over_servers(serve):
  engines = [BigramEngine(TABLE), BigramEngine(TABLE)]
  urls = [serve(e)[1] for e in engines]
  params = SamplingParams(max_new_tokens=3, seed=4)
  prompts = [[0], [1], [2], [3], [4]]
  # 5 prompts over 3 servers: chunks [0, 2), [2, 4), [4, 5) with seeds 4, 6
  # and 8; the dead first server's chunk is retried on the next one.
  client = SGLangClient([_dead_url()] + urls, backoff_s=0.0)
  got = client.generate(prompts, params)
  ref = BigramEngine(TABLE)
  want = []
  for (a, b), seed in zip(((0, 2), (2, 4), (4, 5)), (4, 6, 8)):
    want += ref.generate(
        prompts[a:b], SamplingParams(max_new_tokens=3, seed=seed)
    )
  assert [g.token_ids.tolist() for g in got] == [
      w.token_ids.tolist() for w in want
  ]
  assert sorted(engines[0].calls) == [(2, 4), (2, 6)]  # concurrent
  assert engines[1].calls == [(1, 8)]
  # Round-robin: consecutive single-prompt calls alternate servers.
  for e in engines:
    e.calls.clear()
  client = SGLangClient(urls)
  for _ in range(4):
    client.generate([[0]], params)
  assert [len(e.calls) for e in engines] == [2, 2]


# ------------------------------------------------- real servers (slow, sglang)

SERVER_KINDS = [
    pytest.param("sglang", marks=pytest.mark.sglang),
    pytest.param("jax", marks=pytest.mark.slow),
]


def _generate_and_check(client, model, prompts):
  """Samples at T=1 and at T=0.7 / top_p=0.9; the server's log-probs must be
  our model's temperature-1 log-probs of the same tokens."""
  results = []
  for params in (
      SamplingParams(temperature=1.0, max_new_tokens=12),
      SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=12),
  ):
    res = client.generate(prompts, params)
    assert len(res) == len(prompts)
    ours_all = _fixtures_module().our_logprobs(model, prompts, res)
    for r, ours in zip(res, ours_all):
      assert 1 <= len(r.token_ids) <= 12
      assert r.finish_reason in ("stop", "length")
      np.testing.assert_allclose(r.logprobs, ours, atol=1e-3, rtol=0)
    results += res
  return results


@pytest.mark.parametrize("rollout_server", SERVER_KINDS, indirect=True)
def test_server_logprobs_match_our_model_across_weight_update(
    rollout_server, tiny_checkpoint, tmp_path
):

  _, server = rollout_server
  ck = tiny_checkpoint
  # The fixture starts SGLang with SGLANG_RETURN_ORIGINAL_LOGPROB=1.
  client = SGLangClient(
      server.url,
      vocab_size=ck.cfg.vocab_size,
      original_logprobs=True,
      timeout_s=120,
  )
  assert client.health()
  prompts = [
      ck.tokenizer.encode(t)
      for t in (
          "the quick brown fox",
          "put a clean mug in",
          "the quick brown fox",
      )
  ]
  _generate_and_check(client, ck.model, prompts)

  new_model = _fixtures_module().perturbed_model(ck.model, ck.cfg, seed=1)
  new_path = str(tmp_path / "v1")
  hf_io.save_hf_model(
      new_model, ck.cfg, new_path, tokenizer_dir=ck.tokenizer_dir
  )
  client.update_weights(new_path, 1)
  assert client.weight_version == 1
  assert client.model_info()["weight_version"] == "1"
  results = _generate_and_check(client, new_model, prompts)
  # The update took effect: the old weights give those tokens other log-probs
  # (results hold both sampling settings' answers, one after the other).
  old = _fixtures_module().our_logprobs(ck.model, prompts * 2, results)
  diff = max(np.max(np.abs(r.logprobs - o)) for r, o in zip(results, old))
  assert diff > 0.05
  client.flush_cache()
  client.close()


# ------------------------- the run's engine: evaluation at T = 0.4 (issue 17)


def _sglang_run_config(url, **rollout):
  from configs import toy_grpo  # pylint: disable=g-import-not-at-top

  cfg = toy_grpo.get_config(f"rollout.engine=sglang,rollout.server_urls={url}")
  with cfg.unlocked():
    cfg.rollout.update(rollout)
  return cfg


def test_run_engine_allows_eval_temperature_and_long_requests(serve):
  """build.make_engine's client: the servers' T=1 log-probs at T=0.4 (the
  launchers start them with SGLANG_RETURN_ORIGINAL_LOGPROB=1) and the
  configured per-request timeout (600 s by default, 60 s before)."""
  from rspo_jax import build  # pylint: disable=g-import-not-at-top

  engine = BigramEngine(TABLE)
  _, url = serve(engine)
  cfg = _sglang_run_config(url)
  assert cfg.rollout.server_timeout_s == 600.0
  client = build.make_engine(cfg, None, None, None, None)
  assert client.original_logprobs and client.timeout_s == 600.0
  params = SamplingParams(temperature=0.4, max_new_tokens=5, seed=3)
  got = client.generate([[1, 2], [3]], params)
  want = engine.generate([[1, 2], [3]], params)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g.token_ids, w.token_ids)
    np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-6)
  client.close()
  cfg = _sglang_run_config(
      url, server_timeout_s=7.5, server_original_logprobs=False
  )
  client = build.make_engine(cfg, None, None, None, None)
  assert client.timeout_s == 7.5
  with pytest.raises(ValueError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
    client.generate([[1]], params)
  client.close()


@pytest.mark.parametrize("rollout_server", SERVER_KINDS[:1], indirect=True)
def test_evaluation_at_temperature_0_4_through_the_run_engine(
    rollout_server, tiny_checkpoint
):
  """The paper's evaluation decoding (T = 0.4) with the engine build_run
  makes, on the real SGLang server (our JAX server's test fixture buckets
  prompts to 32 tokens): log-probs are the model's at T = 1, and evaluate()
  plays its episodes (it raised ValueError before the client had
  original_logprobs=True)."""
  from rspo_jax import build  # pylint: disable=g-import-not-at-top
  from rspo_jax.evaluate import evaluate
  from third_party_envs.vector import VectorEnv

  _, server = rollout_server
  ck = tiny_checkpoint
  cfg = _sglang_run_config(
      server.url, eval_temperature=0.4, max_prompt_tokens=256
  )
  client = build.make_engine(cfg, None, None, None, None)
  client.update_weights(ck.path, 7)  # ck.model (another test synced others)
  prompts = [
      ck.tokenizer.encode(t)
      for t in ("the quick brown fox", "put a clean mug in")
  ]
  res = client.generate(
      prompts, SamplingParams(temperature=0.4, max_new_tokens=12, seed=0)
  )
  ours_all = _fixtures_module().our_logprobs(ck.model, prompts, res)
  for r, ours in zip(res, ours_all):
    assert 1 <= len(r.token_ids) <= 12
    np.testing.assert_allclose(r.logprobs, ours, atol=1e-3, rtol=0)
  venv = VectorEnv("toy", build.env_kwargs(cfg), 2, use_processes=False)
  try:
    out = evaluate(
        client,
        venv,
        ck.tokenizer,
        build.collect_config(cfg, cfg.env.eval_split),
        [0, 1],
        temperature=cfg.rollout.eval_temperature,
        max_new_tokens=8,
    )
  finally:
    venv.close()
    client.close()
  assert out["num_tasks"] == 2 and out["episode_length"] >= 1
  assert 0.0 <= out["success_rate"] <= 1.0


@pytest.mark.parametrize("rollout_server", SERVER_KINDS[:1], indirect=True)
def test_streamed_export_loads_into_sglang_and_unchanged_syncs_skip(
    rollout_server, tiny_checkpoint, tmp_path
):
  """The run's weight sync (build.make_sync_engine: one safetensors file a
  layer + index, written by threads) loads into the real SGLang server, and
  a second sync of the same weights exports nothing (issue 17 item 2)."""
  import jax  # pylint: disable=g-import-not-at-top
  from rspo_jax import build, sharding
  from rspo_jax import train_step as ts
  from rspo_jax.learner import Learner

  _, server = rollout_server
  ck = tiny_checkpoint
  model = _fixtures_module().perturbed_model(ck.model, ck.cfg, seed=3)
  learner = Learner(
      model,
      ts.make_optimizer(1e-3),
      ts.make_sft_loss(),
      mesh=sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1]),
      rules=sharding.DEFAULT_RULES,
  )
  sync = build.make_sync_engine(
      ck.cfg, ck.tokenizer_dir, str(tmp_path / "export"), threads=4
  )
  client = SGLangClient(
      server.url,
      vocab_size=ck.cfg.vocab_size,
      original_logprobs=True,
      timeout_s=120,
  )
  sync(client, learner, 11)
  sync(client, learner, 12)
  assert (sync.log.exports, sync.log.skipped) == (1, 1)
  assert client.model_info()["weight_version"] == "11"
  prompts = [
      ck.tokenizer.encode(t)
      for t in ("the quick brown fox", "click buy now on")
  ]
  res = client.generate(
      prompts, SamplingParams(temperature=0.4, max_new_tokens=8)
  )
  for r, ours in zip(res, _fixtures_module().our_logprobs(model, prompts, res)):
    np.testing.assert_allclose(r.logprobs, ours, atol=1e-3, rtol=0)
  client.close()


# ------------------------------------- LoRA adapters to SGLang (issue 39 #3)


def _lora_learner(ck, seed):
  """A Learner of a LoRA model on ``ck.model`` (rank and alpha of the LoRA
  server fixture, every projection) whose B adapters are random (non-zero:
  the adapters change the outputs); (ModelConfig, Learner)."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx
  from rspo_jax import sharding
  from rspo_jax import train_step as ts
  from rspo_jax.learner import Learner
  from rspo_jax.models import lora

  fx = _fixtures_module()
  cfg = dataclasses.replace(
      ck.cfg,
      lora_rank=fx.LORA_RANK,
      lora_alpha=fx.LORA_ALPHA,
      lora_targets=tuple(lora.TARGETS),
  )
  graphdef, state = nnx.split(lora.add_adapters(ck.model, cfg, seed=seed))
  keys = iter(jax.random.split(jax.random.key(seed), 64))
  flat = [
      (
          p,
          v.replace(0.3 * jax.random.normal(next(keys), v.value.shape))
          if p[-1] == "b" and isinstance(v, nnx.LoRAParam)
          else v,
      )
      for p, v in nnx.to_flat_state(state)
  ]
  model = nnx.merge(graphdef, nnx.from_flat_state(flat))
  return cfg, Learner(
      model,
      ts.make_optimizer(1e-3),
      ts.make_sft_loss(),
      mesh=sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1]),
      rules=sharding.DEFAULT_RULES,
  )


def _dir_bytes(path):
  return sum(
      os.path.getsize(os.path.join(d, f))
      for d, _, fs in os.walk(path)
      for f in fs
  )


@pytest.mark.sglang
def test_lora_adapter_sync_on_the_real_sglang_server(
    lora_sglang_server, tiny_checkpoint, tmp_path
):
  """rollout.sglang_lora_sync=adapter on SGLang with --enable-lora (CPU:
  the torch_native backend): each sync writes and loads the PEFT adapter
  alone (the base once), and the server's greedy tokens and log-probs are
  the in-process JAX engine's with the merged weights, across two
  adapters."""
  from rspo_jax import build  # pylint: disable=g-import-not-at-top
  from rspo_jax.models import lora
  from rspo_jax.rollout.jax_engine import JaxEngine

  ck = tiny_checkpoint
  export = str(tmp_path / "export")
  sync = None
  client = SGLangClient(
      lora_sglang_server.url,
      vocab_size=ck.cfg.vocab_size,
      original_logprobs=True,
      timeout_s=120,
  )
  prompts = [
      ck.tokenizer.encode(t)
      for t in ("the quick brown fox", "put a clean mug in")
  ]
  greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
  model_bytes = None
  previous = None
  for version, seed in ((1, 1), (2, 2)):
    cfg, learner = _lora_learner(ck, seed)
    if sync is None:
      sync = build.make_sync_engine(
          cfg, ck.tokenizer_dir, export, threads=2, lora_sync="adapter"
      )
    sync(client, learner, version)
    entry = sync.log.history[-1]
    adapter_dir = os.path.join(export, f"adapter_v{version % 2}")
    adapter = lora.peft_tensors(learner.module(), cfg)
    assert entry["adapter"] and client.adapter.endswith(f"-v{version}")
    # (b) a sync writes the adapter: its tensors' bytes, not the model's.
    assert entry["bytes"] == sum(t.nbytes for t in adapter.values())
    assert _dir_bytes(adapter_dir) < entry["bytes"] + 8192
    if version == 1:  # the base, once
      model_bytes = entry["base_bytes"]
      assert model_bytes > 0
    else:
      assert entry["base_bytes"] is None
      assert not os.path.exists(os.path.join(export, "adapter_v1"))
    assert 8 * entry["bytes"] < model_bytes
    assert client.model_info()["weight_version"] == client.base_version
    # (a) greedy decoding on the server = the JAX engine on merged weights.
    engine = JaxEngine(
        build.inference_model(learner.module(), cfg),
        build.engine_config(cfg),
        pad_id=0,
        eos_ids=[ck.cfg.eos_token_id],
    )
    want = engine.generate(prompts, greedy)
    got = client.generate(prompts, greedy)
    merged = build.merged(learner, cfg)[1]
    ours = _fixtures_module().our_logprobs(merged, prompts, got)
    for g, w, o in zip(got, want, ours):
      np.testing.assert_array_equal(g.token_ids, w.token_ids)
      np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-3, rtol=0)
      np.testing.assert_allclose(g.logprobs, o, atol=1e-3, rtol=0)
    if previous is not None:  # the second adapter replaced the first
      assert any(
          not np.array_equal(g.token_ids, p.token_ids)
          for g, p in zip(got, previous)
      )
    previous = got
  client.close()


class _FakeLoRAServer(http.server.BaseHTTPRequestHandler):
  """SGLang's LoRA and weight routes, recording each JSON body in
  ``server.seen``; ``server.lora`` False answers loads as a server without
  --enable-lora does (HTTP 400)."""

  def log_message(self, *args):
    pass

  def _send(self, status, obj):
    data = json.dumps(obj).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def do_GET(self):  # pylint: disable=invalid-name
    srv = self.server
    if self.path == "/health":
      return self._send(200, {})
    return self._send(200, {"weight_version": srv.version})

  def do_POST(self):  # pylint: disable=invalid-name
    srv = self.server
    n = int(self.headers.get("Content-Length", 0))
    body = json.loads(self.rfile.read(n) or b"null")
    srv.seen.append((self.path, body))
    if self.path == "/update_weights_from_disk":
      srv.version = body["weight_version"]
      return self._send(200, {"success": True})
    if self.path == "/load_lora_adapter":
      if not srv.lora:
        return self._send(
            400,
            {
                "success": False,
                "error_message": "LoRA is not enabled. Please set"
                " `--enable-lora` to enable LoRA.",
            },
        )
      srv.adapters[body["lora_name"]] = body["lora_path"]
      return self._send(
          200, {"success": True, "loaded_adapters": dict(srv.adapters)}
      )
    if self.path == "/unload_lora_adapter":
      srv.adapters.pop(body["lora_name"])
      return self._send(
          200, {"success": True, "loaded_adapters": dict(srv.adapters)}
      )
    if self.path == "/generate":
      item = {
          "meta_info": {
              "output_token_logprobs": [[-0.5, 7, None]],
              "finish_reason": {"type": "length"},
              "weight_version": srv.version,
          }
      }
      return self._send(200, [item] * len(body["input_ids"]))
    return self._send(404, {"message": "no route"})


def _fake_lora_server(serve, lora_on):
  srv, url = serve(_FakeLoRAServer)
  srv.seen, srv.version, srv.adapters, srv.lora = [], "default", {}, lora_on
  srv.adapters["rspo-left-over-v7"] = "/old"  # another client's: kept
  return srv, url


def test_lora_adapter_sync_requests_and_files(serve, tmp_path):
  """Without SGLang: the adapter route's requests (load the new adapter,
  the base once, unload its own older adapter, /generate names the
  adapter), its files (a PEFT directory per slot, the base once), 'auto'
  falling back to merged exports on a server without LoRA, 'adapter'
  refusing, and 'merged' never trying."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  from rspo_jax import build, sharding
  from rspo_jax import train_step as ts
  from rspo_jax.learner import Learner
  from rspo_jax.models import create_model, get_model_config, lora
  from rspo_jax.rollout.sglang_client import (  # pylint: disable=g-import-not-at-top
      SGLangAdapterRefused,
      make_adapter_request,
      stale_adapters,
  )

  assert make_adapter_request("a", "/p") == {
      "lora_name": "a",
      "lora_path": "/p",
      "pinned": False,
  }
  assert stale_adapters(
      {"rspo-x-v1": "/a", "rspo-x-v2": "/b", "mine": "/c", "rspo-y-v1": "/d"},
      "rspo-x-v2",
  ) == ["rspo-x-v1"]
  body = make_generate_request(
      [[1, 2]], SamplingParams(max_new_tokens=3), adapter="rspo-x-v2"
  )
  assert body["lora_path"] == "rspo-x-v2"
  cfg0 = get_model_config("nano", vocab_size=128)
  cfg = dataclasses.replace(
      cfg0, lora_rank=2, lora_alpha=4.0, lora_targets=("q", "v")
  )
  model = lora.add_adapters(create_model(cfg0, seed=0), cfg, seed=1)
  learner = Learner(
      model,
      ts.make_optimizer(1e-3),
      ts.make_sft_loss(),
      mesh=sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1]),
      rules=sharding.DEFAULT_RULES,
  )

  srv, url = _fake_lora_server(serve, True)
  export = str(tmp_path / "a")
  sync = build.make_sync_engine(cfg, None, export, threads=2)
  client = SGLangClient(url, max_retries=0)
  sync(client, learner, 1)
  learner.state = learner.state.replace(
      params=jax.tree.map(lambda x: x + 0.0, learner.state.params)
  )  # new arrays: not skipped
  sync(client, learner, 2)
  routes = [r for r, _ in srv.seen]
  assert routes == [
      "/load_lora_adapter",
      "/update_weights_from_disk",
      "/load_lora_adapter",
      "/unload_lora_adapter",
  ]
  loads = [b for r, b in srv.seen if r == "/load_lora_adapter"]
  assert [b["lora_path"] for b in loads] == [
      os.path.join(export, "adapter_v1"),
      os.path.join(export, "adapter_v0"),
  ]
  assert loads[1]["lora_name"] == client.adapter
  assert client.adapter.startswith("rspo-") and client.adapter.endswith("-v2")
  assert [
      b["lora_name"] for r, b in srv.seen if r == "/unload_lora_adapter"
  ] == [loads[0]["lora_name"]]
  assert "rspo-left-over-v7" in srv.adapters
  assert srv.seen[1][1] == {
      "model_path": os.path.join(export, "lora_base"),
      "weight_version": client.base_version,
  }
  assert sorted(os.listdir(export)) == ["adapter_v0", "lora_base"]
  assert sorted(os.listdir(os.path.join(export, "adapter_v0"))) == [
      "adapter_config.json",
      "adapter_model.safetensors",
  ]
  assert [e["base_bytes"] is not None for e in sync.log.history] == [
      True,
      False,
  ]
  client.generate([[1, 2]], SamplingParams(max_new_tokens=1))
  assert srv.seen[-1][1]["lora_path"] == client.adapter == loads[1]["lora_name"]
  client.close()

  # auto on a server without LoRA: one warning, merged exports from then on.
  srv, url = _fake_lora_server(serve, False)
  sync = build.make_sync_engine(cfg, None, str(tmp_path / "b"), threads=2)
  client = SGLangClient(url, max_retries=0)
  sync(client, learner, 3)
  assert [r for r, _ in srv.seen] == [
      "/load_lora_adapter",
      "/update_weights_from_disk",
  ]
  assert srv.version == "3" and client.adapter is None
  assert not sync.log.history[-1].get("adapter")
  client.generate([[1, 2]], SamplingParams(max_new_tokens=1))
  assert "lora_path" not in srv.seen[-1][1]
  # adapter: the refusal is an error naming the flags.
  sync = build.make_sync_engine(
      cfg, None, str(tmp_path / "c"), threads=2, lora_sync="adapter"
  )
  with pytest.raises(SGLangAdapterRefused, match="--enable-lora"):
    sync(client, learner, 4)
  # merged: never tries the adapter.
  srv.seen.clear()
  sync = build.make_sync_engine(
      cfg, None, str(tmp_path / "d"), threads=2, lora_sync="merged"
  )
  sync(client, learner, 5)
  assert [r for r, _ in srv.seen] == ["/update_weights_from_disk"]
  with pytest.raises(Exception, match="sglang_lora_sync"):
    build.make_sync_engine(cfg, None, str(tmp_path), lora_sync="full")
  client.close()


# --------------------------- collection without turn barriers (issue 17 #4)


def _both_collections(engine, tokenizer, *, groups=2, group_size=3):
  """(records, stats) of collect and of collect_unbarriered, greedy, on the
  toy environment."""
  from rspo_jax.rollout.collect import CollectConfig, CollectRequest, collect  # pylint: disable=g-import-not-at-top
  from rspo_jax.rollout.unbarriered import collect_unbarriered
  from third_party_envs.vector import VectorEnv

  cfg = CollectConfig(env_name="toy", max_steps=3, max_prompt_tokens=256)
  params = SamplingParams(
      temperature=0.0, max_new_tokens=8, stop_strings=("</action>",)
  )
  out = []
  for fn in (collect, collect_unbarriered):
    venv = VectorEnv(
        "toy", {"max_steps": 3}, groups * group_size, use_processes=False
    )
    try:
      request = CollectRequest(
          list(range(groups)),
          group_size,
          params,
          traj_id_start=100,
          group_id_start=10,
          seed=4,
      )
      out.append(fn(engine, venv, tokenizer, request, cfg))
    finally:
      venv.close()
  return out


def _assert_same_records(synced, unbarriered):
  (recs_a, stats_a), (recs_b, stats_b) = synced, unbarriered
  key = lambda r: (r.traj_id, r.step_idx)
  recs_a, recs_b = sorted(recs_a, key=key), sorted(recs_b, key=key)
  assert [key(r) for r in recs_a] == [key(r) for r in recs_b]
  for a, b in zip(recs_a, recs_b):
    np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
    np.testing.assert_array_equal(a.response_ids, b.response_ids)
    np.testing.assert_allclose(a.behavior_logp, b.behavior_logp, atol=1e-4)
    assert (
        a.action,
        a.invalid,
        a.env_reward,
        a.outcome_reward,
        a.done,
        a.won,
        a.group_id,
        a.task_id,
    ) == (
        b.action,
        b.invalid,
        b.env_reward,
        b.outcome_reward,
        b.done,
        b.won,
        b.group_id,
        b.task_id,
    )
  assert sorted(stats_a) == sorted(stats_b)
  for k in (
      "episodes",
      "env_steps",
      "gen_tokens",
      "invalid_action_rate",
      "success_rate",
      "episode_length",
  ):
    assert stats_a[k] == stats_b[k], k


def test_unbarriered_collection_equals_turn_synchronous(serve, tiny_checkpoint):
  """Through our SGLang-API server (a JaxEngine of the tiny checkpoint):
  the same episodes and records, greedy, with and without turn barriers."""
  from rspo_jax.rollout.jax_engine import JaxEngine  # pylint: disable=g-import-not-at-top

  ck = tiny_checkpoint
  decode = lambda ids: ck.tokenizer.decode(list(ids))
  engine = JaxEngine(ck.model, ck.cfg, pad_id=0, eos_ids=(2,), decode_fn=decode)
  _, url = serve(engine, vocab_size=ck.cfg.vocab_size, decode_fn=decode)
  client = SGLangClient(url, vocab_size=ck.cfg.vocab_size)
  synced, unbarriered = _both_collections(client, ck.tokenizer)
  assert synced[1]["episodes"] == 6 and synced[1]["env_steps"] >= 6
  _assert_same_records(synced, unbarriered)
  client.close()


@pytest.mark.parametrize("rollout_server", SERVER_KINDS[:1], indirect=True)
def test_unbarriered_collection_on_the_real_sglang_server(
    rollout_server, tiny_checkpoint
):
  """The real SGLang CPU server: same episode count and records (greedy)
  with and without turn barriers."""
  _, server = rollout_server
  ck = tiny_checkpoint
  client = SGLangClient(
      server.url,
      vocab_size=ck.cfg.vocab_size,
      original_logprobs=True,
      timeout_s=120,
  )
  synced, unbarriered = _both_collections(client, ck.tokenizer)
  assert synced[1]["episodes"] == unbarriered[1]["episodes"] == 6
  _assert_same_records(synced, unbarriered)
  client.close()


@pytest.mark.parametrize("turn_barriers", [True, False])
def test_trainer_collects_through_servers_with_and_without_turn_barriers(
    serve, tiny_checkpoint, tmp_path, turn_barriers
):
  """A run built for SGLang servers (our SGLang-API server around a
  JaxEngine of the tiny checkpoint): after the weight sync,
  ``RSPOTrainer.collect_groups`` plays whole groups through the server,
  turn by turn or, with ``rollout.turn_barriers=False``, each episode on
  its own (``collect_unbarriered``)."""
  from rspo_jax import build  # pylint: disable=g-import-not-at-top
  from rspo_jax.rollout.collect import collect
  from rspo_jax.rollout.jax_engine import JaxEngine
  from rspo_jax.rollout.unbarriered import collect_unbarriered

  ck = tiny_checkpoint
  decode = lambda ids: ck.tokenizer.decode(list(ids))
  engine = JaxEngine(ck.model, ck.cfg, pad_id=0, eos_ids=(2,), decode_fn=decode)
  _, url = serve(engine, vocab_size=ck.cfg.vocab_size, decode_fn=decode)
  cfg = _sglang_run_config(
      url,
      turn_barriers=turn_barriers,
      max_new_tokens=8,
      max_prompt_tokens=256,
      export_dir=str(tmp_path / "export"),
  )
  with cfg.unlocked():
    cfg.model.checkpoint_dir = ck.path
    cfg.env.max_steps = 3
    cfg.train.group_size = 2
  run = build.build_run(cfg, str(tmp_path / "run"), progress=False)
  try:
    t = run.trainer
    assert t.collect is (collect if turn_barriers else collect_unbarriered)
    records, stats = t.collect_groups(t.a, 2, "A")
  finally:
    run.close()
  assert stats["episodes"] == 4 and stats["failed_episodes"] == 0
  by_traj = {}
  for r in records:
    by_traj.setdefault(r.traj_id, []).append(r.step_idx)
  assert len(by_traj) == 4 and len({r.group_id for r in records}) == 2
  for steps in by_traj.values():  # every turn of every episode, in order
    assert sorted(steps) == list(range(len(steps))) and len(steps) <= 3
  assert all(
      np.isfinite(r.behavior_logp).all() and len(r.response_ids)
      for r in records
  )


def test_turn_barriers_off_needs_sglang():
  from configs import toy_grpo  # pylint: disable=g-import-not-at-top

  with pytest.raises(ValueError, match="rollout.turn_barriers"):
    toy_grpo.get_config("rollout.turn_barriers=False")
  cfg = toy_grpo.get_config(
      "rollout.engine=sglang,rollout.server_urls=x,"
      "rollout.turn_barriers=False"
  )
  assert not cfg.rollout.turn_barriers
