"""Serves any ``Engine`` behind SGLang's native HTTP routes and JSON shapes.

So that ``SGLangClient`` (and any SGLang-native client) can drive our own
JAX engine as if it were an SGLang server:

  GET  /health, /health_generate      200 when engine.health(), else 503
  GET  /model_info, /get_model_info   {model_path, weight_version, ...}
  POST /generate                      {input_ids, sampling_params,
                                       return_logprob} -> one result object,
                                       or a list for batched input_ids
  POST /update_weights_from_disk      {model_path, weight_version}
                                      -> {success, message, weight_version}
  GET|POST /flush_cache               200 "Cache flushed."

A result is ``{"text", "output_ids", "meta_info": {"id", "finish_reason":
{"type": "stop", "matched": ...} | {"type": "length", "length": n},
"prompt_tokens", "completion_tokens", "cached_tokens", "weight_version",
"output_token_logprobs": [[logprob, token_id, null], ...]}}``; log-probs are
the engine's, i.e. at temperature 1. Errors answer HTTP 400 (bad request) or
500 with SGLang's ``{"object": "error", "message", "type", "code"}``.

Engine calls are serialised by one lock (a JAX engine batches inside one
call, not across calls); health and model-info requests never wait on it.
``sampling_seed``: prompts that share sampling params and carry consecutive
seeds ``s, s + 1, ...`` (what ``SGLangClient`` sends) go to the engine as one
batch with ``seed = s``, so seeded requests stay batched; other seeded
prompts go one per engine call.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence

import numpy as np

from rspo_jax.rollout.engine import Engine, GenerationResult, SamplingParams

# Top-level /generate fields understood; anything else is refused.
_GENERATE_FIELDS = frozenset(
    {
        "input_ids",
        "sampling_params",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "return_text_in_logprobs",
        "stream",
        "rid",
        "text",
    }
)
# SGLang sampling fields accepted only at their neutral value (field ->
# predicate on the value).
_NEUTRAL = {
    "n": lambda v: v in (None, 1),
    "min_p": lambda v: v in (None, 0, 0.0),
    "frequency_penalty": lambda v: v in (None, 0, 0.0),
    "presence_penalty": lambda v: v in (None, 0, 0.0),
    "repetition_penalty": lambda v: v in (None, 1, 1.0),
    "min_new_tokens": lambda v: v in (None, 0),
    "ignore_eos": lambda v: v in (None, False),
    "json_schema": lambda v: v is None,
    "regex": lambda v: v is None,
    "ebnf": lambda v: v is None,
    "structural_tag": lambda v: v is None,
    "logit_bias": lambda v: not v,
    "custom_params": lambda v: not v,
    "stop_regex": lambda v: not v,
    "skip_special_tokens": lambda v: True,
    "spaces_between_special_tokens": lambda v: True,
    "no_stop_trim": lambda v: True,
    "stream_interval": lambda v: True,
}
_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default


class BadRequest(ValueError):
  """The request is malformed or asks for something this server lacks."""


# ------------------------------------------------------------ pure parsing


def parse_sampling_params(d: Any) -> tuple[SamplingParams, Optional[int]]:
  """(SamplingParams without seed, sampling_seed) from SGLang's fields.

  ``top_k`` must be -1 / None (off) or 1 (greedy, as temperature 0).
  """
  if d is None:
    d = {}
  if not isinstance(d, dict):
    raise BadRequest(f"sampling_params must be an object, got {d!r}")
  known = {
      "temperature",
      "top_p",
      "top_k",
      "max_new_tokens",
      "stop",
      "stop_token_ids",
      "sampling_seed",
  }
  for k, v in d.items():
    if k in known:
      continue
    if k not in _NEUTRAL:
      raise BadRequest(f"unknown sampling_params field {k!r}")
    if not _NEUTRAL[k](v):
      raise BadRequest(f"sampling_params.{k}={v!r} is not supported")
  temperature = _number(d, "temperature", 1.0)
  top_p = _number(d, "top_p", 1.0)
  top_k = d.get("top_k")
  if top_k not in (None, -1, 1):
    raise BadRequest(f"sampling_params.top_k={top_k!r}: only -1 or 1")
  if top_k == 1:
    temperature = 0.0
  max_new = d.get("max_new_tokens", _DEFAULT_MAX_NEW_TOKENS)
  if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
    raise BadRequest(
        f"sampling_params.max_new_tokens={max_new!r}: need an int >= 0"
    )
  stop = d.get("stop") or ()
  if isinstance(stop, str):
    stop = (stop,)
  if not all(isinstance(s, str) for s in stop):
    raise BadRequest(f"sampling_params.stop={stop!r}: need strings")
  stop_ids = d.get("stop_token_ids") or ()
  if not all(_is_int(t) for t in stop_ids):
    raise BadRequest(f"sampling_params.stop_token_ids={stop_ids!r}: need ints")
  seed = d.get("sampling_seed")
  if seed is not None and not _is_int(seed):
    raise BadRequest(f"sampling_params.sampling_seed={seed!r}: need an int")
  try:
    params = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new,
        stop_token_ids=tuple(int(t) for t in stop_ids),
        stop_strings=tuple(stop),
    )
  except ValueError as e:  # out-of-range temperature / top_p
    raise BadRequest(f"sampling_params: {e}") from e
  return params, seed


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _number(d, key, default) -> float:
  v = d.get(key, default)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    raise BadRequest(f"sampling_params.{key}={v!r}: need a number")
  return float(v)


def parse_generate_request(body: Any):
  """(prompts, per-prompt (SamplingParams, seed), return_logprob, single)."""
  if not isinstance(body, dict):
    raise BadRequest("the request body must be a JSON object")
  unknown = sorted(set(body) - _GENERATE_FIELDS)
  if unknown:
    raise BadRequest(f"unknown /generate fields {unknown}")
  if body.get("text") is not None:
    raise BadRequest("text input is not supported: send input_ids")
  if body.get("stream"):
    raise BadRequest("stream=true is not supported")
  if body.get("logprob_start_len") not in (None, -1):
    raise BadRequest("prompt log-probs (logprob_start_len) are not supported")
  if body.get("top_logprobs_num") not in (None, 0):
    raise BadRequest("top_logprobs_num is not supported")
  ids = body.get("input_ids")
  if not isinstance(ids, list) or not ids:
    raise BadRequest("input_ids must be a non-empty list")
  single = all(_is_int(t) for t in ids)
  prompts = [ids] if single else ids
  for i, p in enumerate(prompts):
    if not isinstance(p, list) or not p or not all(_is_int(t) for t in p):
      raise BadRequest(f"input_ids[{i}] must be a non-empty list of ints")
  sp = body.get("sampling_params")
  if isinstance(sp, list):
    if len(sp) != len(prompts):
      raise BadRequest(f"{len(sp)} sampling_params for {len(prompts)} prompts")
    per_prompt = [parse_sampling_params(s) for s in sp]
  else:
    per_prompt = [parse_sampling_params(sp)] * len(prompts)
  rl = body.get("return_logprob", False)
  if isinstance(rl, list):
    if len(set(rl)) > 1:
      raise BadRequest("return_logprob must be the same for every prompt")
    rl = rl[0] if rl else False
  return prompts, per_prompt, bool(rl), single


def plan_engine_calls(per_prompt) -> list[tuple[SamplingParams, list[int]]]:
  """Groups prompt indices into engine calls.

  Prompts with equal params form one call; within it, seeds must be all None
  or consecutive ``s, s + 1, ...`` in prompt order (then the call's seed is
  ``s``); otherwise each prompt gets its own call with its own seed, so that
  equal seeds draw equal noise, as in SGLang.
  """
  groups: dict[SamplingParams, list[int]] = {}
  for i, (params, _) in enumerate(per_prompt):
    groups.setdefault(params, []).append(i)
  calls = []
  for params, idx in groups.items():
    seeds = [per_prompt[i][1] for i in idx]
    if all(s is None for s in seeds):
      calls.append((params, idx))
    elif None not in seeds and seeds == list(
        range(seeds[0], seeds[0] + len(seeds))
    ):
      calls.append((_with_seed(params, seeds[0]), idx))
    else:
      for i, s in zip(idx, seeds):
        calls.append((_with_seed(params, s), [i]))
  return calls


def _with_seed(params: SamplingParams, seed) -> SamplingParams:
  return dataclasses.replace(params, seed=seed)


def format_result(
    res: GenerationResult,
    prompt_len: int,
    params: SamplingParams,
    *,
    version: int,
    return_logprob: bool,
    decode_fn: Optional[Callable[[Sequence[int]], str]] = None,
    latency_s: float = 0.0,
) -> dict:
  """One SGLang-shaped /generate result."""
  ids = [int(t) for t in res.token_ids]
  text = decode_fn(ids) if decode_fn is not None and ids else ""
  if res.finish_reason == "length":
    reason = {"type": "length", "length": len(ids)}
  elif res.finish_reason == "stop":
    matched = ids[-1] if ids else None
    hits = [s for s in params.stop_strings if s in text]
    if hits and not (ids and ids[-1] in params.stop_token_ids):
      matched = hits[0]
      text = text[: text.find(matched)]  # SGLang trims the stop string
    reason = {"type": "stop", "matched": matched}
  else:
    reason = {"type": "abort", "message": "aborted by the engine"}
  meta = {
      "id": uuid.uuid4().hex,
      "finish_reason": reason,
      "prompt_tokens": int(prompt_len),
      "completion_tokens": len(ids),
      "cached_tokens": 0,
      "weight_version": str(version),
      "e2e_latency": float(latency_s),
  }
  if return_logprob:
    meta["input_token_logprobs"] = []
    meta["output_token_logprobs"] = [
        [float(lp), t, None] for lp, t in zip(res.logprobs.tolist(), ids)
    ]
  return {"text": text, "output_ids": ids, "meta_info": meta}


def _empty_result() -> GenerationResult:
  return GenerationResult(
      token_ids=np.zeros((0,), np.int32),
      logprobs=np.zeros((0,), np.float32),
      finish_reason="length",
  )


# ------------------------------------------------------------------ server


class EngineHTTPServer(http.server.ThreadingHTTPServer):
  """ThreadingHTTPServer holding the engine and its serving state."""

  daemon_threads = True

  def __init__(
      self,
      address,
      engine: Engine,
      *,
      model_path: Optional[str] = None,
      vocab_size: Optional[int] = None,
      decode_fn: Optional[Callable[[Sequence[int]], str]] = None,
      verbose: bool = False,
  ):
    self.engine = engine
    self.model_path = model_path
    self.vocab_size = vocab_size
    self.decode_fn = decode_fn
    self.verbose = verbose
    self.engine_lock = threading.Lock()
    super().__init__(address, _Handler)

  @property
  def url(self) -> str:
    host, port = self.server_address[:2]
    return f"http://{host}:{port}"

  # ------------------------------------------------------------- handlers

  def model_info(self) -> dict:
    info = {
        "model_path": self.model_path,
        "tokenizer_path": self.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": str(self.engine.weight_version),
        "engine": type(self.engine).__name__,
    }
    cfg_path = os.path.join(self.model_path or "", "config.json")
    if self.model_path and os.path.exists(cfg_path):
      with open(cfg_path) as f:
        hf = json.load(f)
      info["model_type"] = hf.get("model_type")
      info["architectures"] = hf.get("architectures")
    return info

  def generate(self, body) -> Any:
    prompts, per_prompt, return_logprob, single = parse_generate_request(body)
    if self.vocab_size is not None:
      for i, p in enumerate(prompts):
        if min(p) < 0 or max(p) >= self.vocab_size:
          raise BadRequest(
              f"input_ids[{i}] has token ids outside [0, {self.vocab_size})"
          )
    start = time.monotonic()
    results: list[Optional[GenerationResult]] = [None] * len(prompts)
    with self.engine_lock:
      version = self.engine.weight_version
      for params, idx in plan_engine_calls(per_prompt):
        if params.max_new_tokens == 0:  # scoring-only request: no tokens
          for i in idx:
            results[i] = _empty_result()
          continue
        try:
          out = self.engine.generate([prompts[i] for i in idx], params)
        except ValueError as e:
          raise BadRequest(str(e)) from e
        for i, r in zip(idx, out):
          results[i] = r
    latency = time.monotonic() - start
    answers = [
        format_result(
            r,
            len(p),
            per_prompt[i][0],
            version=version,
            return_logprob=return_logprob,
            decode_fn=self.decode_fn,
            latency_s=latency,
        )
        for i, (r, p) in enumerate(zip(results, prompts))
    ]
    return answers[0] if single else answers

  def update_weights(self, body) -> tuple[int, dict]:
    if not isinstance(body, dict) or not isinstance(
        body.get("model_path"), str
    ):
      raise BadRequest("update_weights_from_disk needs a model_path string")
    path = body["model_path"]
    if body.get("load_format") not in (None, "auto"):
      raise BadRequest(f"load_format {body['load_format']!r} not supported")
    version = body.get("weight_version")
    if version is None:
      version = self.engine.weight_version
    try:
      version = int(version)
    except (TypeError, ValueError):
      return 400, _update_answer(
          False,
          f"weight_version {version!r} is not an integer; this server"
          " keeps integer versions",
      )
    if not os.path.isdir(path):
      return 400, _update_answer(False, f"model_path {path} is not a directory")
    with self.engine_lock:
      try:
        self.engine.update_weights(path, version)
      except Exception as e:  # pylint: disable=broad-except
        return 400, _update_answer(
            False, f"Failed to update weights from {path}: {e}"
        )
      self.model_path = path
      answer = _update_answer(
          True,
          "Succeeded to update model weights. Weight version updated"
          f" to {version}.",
      )
      answer["weight_version"] = str(self.engine.weight_version)
    return 200, answer

  def flush_cache(self) -> None:
    flush = getattr(self.engine, "flush_cache", None)
    if flush is not None:
      with self.engine_lock:
        flush()


def _update_answer(success: bool, message: str) -> dict:
  return {"success": success, "message": message, "num_paused_requests": 0}


class _Handler(http.server.BaseHTTPRequestHandler):
  server: EngineHTTPServer
  server_version = "rspo-jax-engine"

  def log_message(self, fmt, *args):  # quiet unless verbose
    if self.server.verbose:
      super().log_message(fmt, *args)

  def do_GET(self):  # pylint: disable=invalid-name
    self._route("GET")

  def do_POST(self):  # pylint: disable=invalid-name
    self._route("POST")

  def _route(self, method):
    path = self.path.split("?", 1)[0].rstrip("/") or "/"
    try:
      if path in ("/health", "/health_generate"):
        ok = self.server.engine.health()
        return self._send(200 if ok else 503, b"", "text/plain")
      if path in ("/model_info", "/get_model_info"):
        return self._json(200, self.server.model_info())
      if path == "/flush_cache" and method in ("GET", "POST"):
        self.server.flush_cache()
        return self._send(200, b"Cache flushed.\n", "text/plain")
      if path == "/generate" and method == "POST":
        return self._json(200, self.server.generate(self._body()))
      if path == "/update_weights_from_disk" and method == "POST":
        return self._json(*self.server.update_weights(self._body()))
      self._json(404, {"detail": "Not Found"})
    except BadRequest as e:
      self._error(400, str(e))
    except Exception as e:  # pylint: disable=broad-except
      self._error(500, f"{type(e).__name__}: {e}")

  def _body(self):
    n = int(self.headers.get("Content-Length") or 0)
    raw = self.rfile.read(n) if n else b""
    try:
      return json.loads(raw or b"null")
    except json.JSONDecodeError as e:
      raise BadRequest(f"the request body is not JSON: {e}") from e

  def _error(self, code: int, message: str):
    kind = "Bad Request" if code == 400 else "Internal Server Error"
    self._json(
        code,
        {
            "object": "error",
            "message": message,
            "type": kind,
            "param": None,
            "code": code,
        },
    )

  def _json(self, code: int, obj):
    self._send(code, json.dumps(obj).encode(), "application/json")

  def _send(self, code: int, data: bytes, ctype: str):
    self.send_response(code)
    self.send_header("Content-Type", ctype)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


def make_server(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    model_path: Optional[str] = None,
    vocab_size: Optional[int] = None,
    decode_fn: Optional[Callable[[Sequence[int]], str]] = None,
    verbose: bool = False,
) -> EngineHTTPServer:
  """A bound, not yet serving, server (``port=0`` picks a free port); run
  ``serve_forever()`` (e.g. in a thread) and ``shutdown()`` to stop."""
  return EngineHTTPServer(
      (host, port),
      engine,
      model_path=model_path,
      vocab_size=vocab_size,
      decode_fn=decode_fn,
      verbose=verbose,
  )
