"""Client of one or more SGLang servers (native ``/generate`` API).

Generation sends token ids, never text:

    POST /generate {"input_ids": [[...], ...],
                    "sampling_params": {temperature, top_p, top_k: -1,
                                        max_new_tokens, stop, stop_token_ids,
                                        sampling_seed},
                    "return_logprob": true}

and reads, per prompt, ``meta_info.output_token_logprobs`` (a list of
``[logprob, token_id, null]``) and ``meta_info.finish_reason`` (``{"type":
"stop" | "length" | "abort", ...}``).

Behaviour log-probs. SGLang 0.5.23 returns ``log_softmax(logits / T)[token]``
(before top-p truncation), or ``log_softmax(logits)[token]`` when the server
runs with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (``srt/layers/sampler.py``).
Greedy requests (``T = 0``) are sampled as ``T = 1, top_k = 1``, so they
return untempered log-probs too. The learner needs ``log pi(token)`` at
``T = 1``; so this client accepts ``T in {0, 1}`` always, and any other ``T``
only when built with ``original_logprobs=True``, which asserts that every
server was started with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``.

Seeds. ``sampling_seed`` is honoured only by servers started with
``--enable-deterministic-inference``; prompt ``i`` of a call with
``SamplingParams.seed = s`` gets ``sampling_seed = s + i``, so repeated
prompts (a GRPO group) still draw different continuations.

Weights sync through ``POST /update_weights_from_disk {model_path,
weight_version}`` of a HF safetensors directory (every server must see the
path); the client then reads ``GET /model_info`` back and checks that the
reported ``weight_version`` is the new one. After a sync, generation answers
whose ``meta_info.weight_version`` differs are treated as a failure of that
server (stale weights would silently make the data off-policy).

LoRA adapters (``update_adapter``). With a LoRA policy the servers can
keep the frozen base and take only the adapters: SGLang's

    POST /load_lora_adapter {lora_name, lora_path, pinned: false}
    POST /unload_lora_adapter {lora_name}

(srt/entrypoints/http_server.py 1652-1684 in 0.5.23; the servers run with
``--enable-lora --max-lora-rank R --lora-target-modules ...``) load a PEFT
directory under a name, and a ``/generate`` body naming it in
``lora_path`` (the name, despite the field's name) decodes with base +
adapter. The client loads each version as ``rspo-<client>-v<version>``,
then unloads its own older versions the server lists, and names the
new one in every later ``/generate``: a server that lacks it refuses the
request, so no answer comes from another adapter. The base is loaded once
per server and client, by ``/update_weights_from_disk`` with
``weight_version = "lora-base-<client>"``, at the first adapter sync or when
a server reports another ``weight_version`` (it restarted), after the
adapter loaded; generations are then checked against that version. A
server that refuses an adapter (LoRA off, rank or targets beyond its
flags) raises ``SGLangAdapterRefused``; ``update_weights`` (a full
export) goes back to no adapter.

Failures. Every HTTP call has a timeout. Connection errors, timeouts, 5xx
answers and answers that are not the expected JSON are retried, up to
``max_retries`` times with exponential backoff ``backoff_s * 2**k``; with
several servers each retry of a generate request goes to the next server
(round-robin). A 4xx answer is the request's fault and is raised at once.
The final error (``SGLangError``) names the server URL and the last failure.

Dead servers. A server that refuses a connection (nothing listens on its
port: it was killed or crashed) is marked *down*: later calls split their
prompts over the servers still up (over all of them when none is). Weight
syncs decide membership: ``update_weights`` tries every server (a down one
once, without retries); a server that gives no HTTP answer at all is
skipped with a warning naming it and stays down, one that comes back and
loads the weights is up again. Training goes on as long as one server took
the new weights; ``update_weights`` raises when none did, or when a server
that answered refused the weights (a reachable server with other weights
would serve off-policy data). ``down_urls`` lists the servers down now.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import itertools
import json
import logging
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Optional, Sequence, Union

import numpy as np

from rspo_jax.rollout.engine import Engine, GenerationResult, SamplingParams

FINISH_REASONS = ("stop", "length", "abort")
_HEALTH_TIMEOUT_S = 10.0
# No HTTP answer came: refused, reset, timed out, or cut off mid-answer.
_NO_ANSWER = (OSError, urllib.error.URLError, http.client.HTTPException)

log = logging.getLogger(__name__)


class SGLangError(RuntimeError):
  """A server failed, or answered something this client cannot use."""


class SGLangRequestError(SGLangError):
  """The server rejected the request (HTTP 4xx); retrying will not help."""


class SGLangUnreachableError(SGLangError):
  """No attempt got an HTTP answer from the server (down or unreachable)."""


class SGLangAdapterRefused(SGLangError):
  """A server answered a LoRA adapter load with a refusal (LoRA not
  enabled, rank or target modules beyond its flags, a bad directory)."""


ADAPTER_PREFIX = "rspo-"  # names of the adapters this client loads


class _RetriableError(Exception):
  """One attempt failed in a way another attempt may not.

  ``answered``: the server sent an HTTP answer; ``refused``: the connection
  was refused (nothing listens on the port).
  """

  def __init__(self, message, *, answered=True, refused=False):
    super().__init__(message)
    self.answered = answered
    self.refused = refused


# --------------------------------------------------------- pure request/reply


def make_generate_request(
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    first_index: int = 0,
    vocab_size: Optional[int] = None,
    adapter: Optional[str] = None,
) -> dict[str, Any]:
  """The ``/generate`` JSON body for ``prompts`` (always the batched form).

  Prompt ``j`` is global prompt ``first_index + j``; with a seed ``s`` it
  gets ``sampling_seed = s + first_index + j``, which makes a prompt's draw
  independent of how a call is split over servers. ``adapter``: the name of
  a loaded LoRA adapter every prompt decodes with (SGLang's ``lora_path``).
  """
  if not prompts:
    raise ValueError("prompts is empty")
  ids = [
      _check_prompt(p, first_index + j, vocab_size)
      for j, p in enumerate(prompts)
  ]
  stop_ids = [int(t) for t in params.stop_token_ids]
  if vocab_size is not None and any(not 0 <= t < vocab_size for t in stop_ids):
    raise ValueError(
        f"SamplingParams.stop_token_ids {stop_ids} outside [0, {vocab_size})"
    )
  sampling = {
      "temperature": float(params.temperature),
      "top_p": float(params.top_p),
      "top_k": -1,
      "max_new_tokens": int(params.max_new_tokens),
      "stop": [str(s) for s in params.stop_strings],
      "stop_token_ids": stop_ids,
  }
  body = {
      "input_ids": ids,
      "sampling_params": sampling,
      "return_logprob": True,
  }
  if adapter is not None:
    body["lora_path"] = str(adapter)
  if params.seed is not None:
    # One sampling_params per prompt, each with its own seed.
    body["sampling_params"] = [
        dict(sampling, sampling_seed=int(params.seed) + first_index + j)
        for j in range(len(ids))
    ]
  return body


def make_adapter_request(name: str, path: str) -> dict[str, Any]:
  """``/load_lora_adapter`` body loading the PEFT directory ``path`` as
  ``name`` (not pinned: SGLang refuses to pin every slot)."""
  if not name or not path:
    raise ValueError("an adapter needs a name and a directory")
  return {"lora_name": str(name), "lora_path": str(path), "pinned": False}


def stale_adapters(loaded: Any, keep: str) -> list[str]:
  """This client's older adapters in a load answer's ``loaded_adapters``
  (name -> path), sorted: what to unload after loading ``keep``
  (``rspo-<client>-v<version>``). Another client's ``rspo-`` adapters on a
  shared server are left alone."""
  if not isinstance(loaded, dict):
    return []
  own = keep.rsplit("-v", 1)[0] + "-v"
  return sorted(n for n in loaded if str(n).startswith(own) and n != keep)


def parse_generate_response(
    payload: Any, num_prompts: int, *, expected_version: Optional[str] = None
) -> list[GenerationResult]:
  """``GenerationResult`` per prompt from a ``/generate`` JSON answer.

  Raises ValueError naming the first thing that is not as SGLang answers:
  a list of ``num_prompts`` dicts (or one dict for one prompt), each with
  ``meta_info.output_token_logprobs`` entries ``[float logprob, int id, _]``
  and a ``finish_reason`` of type stop / length / abort; and, when
  ``expected_version`` is given, ``meta_info.weight_version`` equal to it.
  """
  if isinstance(payload, dict) and num_prompts == 1:
    payload = [payload]
  if not isinstance(payload, list):
    raise ValueError(f"expected a JSON list, got {type(payload).__name__}")
  if len(payload) != num_prompts:
    raise ValueError(f"expected {num_prompts} results, got {len(payload)}")
  return [
      _parse_one(item, i, expected_version) for i, item in enumerate(payload)
  ]


def _parse_one(item, i, expected_version) -> GenerationResult:
  if not isinstance(item, dict):
    raise ValueError(f"result {i} is a {type(item).__name__}, not an object")
  if "error" in item:
    raise ValueError(f"result {i} is an error: {item['error']}")
  meta = item.get("meta_info")
  if not isinstance(meta, dict):
    raise ValueError(f"result {i} has no meta_info object")
  entries = meta.get("output_token_logprobs")
  if not isinstance(entries, list):
    raise ValueError(f"result {i} has no meta_info.output_token_logprobs list")
  tokens, logprobs = [], []
  for k, e in enumerate(entries):
    ok = (
        isinstance(e, (list, tuple))
        and len(e) >= 2
        and isinstance(e[0], (int, float))
        and not isinstance(e[0], bool)
        and isinstance(e[1], int)
        and not isinstance(e[1], bool)
        and 0 <= e[1] < 2**31  # an int32 token id, never negative
    )
    if not ok:
      raise ValueError(
          f"result {i} output_token_logprobs[{k}] = {e!r} is not"
          " [logprob, token_id, ...]"
      )
    tokens.append(e[1])
    logprobs.append(e[0])
  lp = np.asarray(logprobs, np.float32)
  if not np.all(lp <= 1e-4) or not np.all(np.isfinite(lp)):
    raise ValueError(f"result {i} has log-probs that are not finite and <= 0")
  reason = meta.get("finish_reason")
  kind = reason.get("type") if isinstance(reason, dict) else reason
  if kind not in FINISH_REASONS:
    raise ValueError(f"result {i} has finish_reason {reason!r}")
  if expected_version is not None:
    got = meta.get("weight_version")
    if got is not None and str(got) != expected_version:
      raise ValueError(
          f"result {i} was generated with weight_version {got!r}, expected"
          f" {expected_version!r} (server has stale weights)"
      )
  return GenerationResult(
      token_ids=np.asarray(tokens, np.int32), logprobs=lp, finish_reason=kind
  )


def _check_prompt(prompt, i: int, vocab_size: Optional[int]) -> list[int]:
  ids = np.asarray(prompt).reshape(-1)
  if ids.size == 0:
    raise ValueError(f"prompt {i} is empty")
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"prompt {i} holds non-integer ids ({ids.dtype})")
  # An id outside the vocabulary crashes an SGLang 0.5.23 scheduler.
  if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
    raise ValueError(
        f"prompt {i} has token ids outside [0, {vocab_size or 'vocab'})"
    )
  return ids.astype(np.int64).tolist()


def split_evenly(n: int, parts: int) -> list[tuple[int, int]]:
  """``parts`` contiguous (start, stop) ranges covering ``range(n)``, sizes
  differing by at most one, empty ranges dropped."""
  parts = max(1, min(parts, n))
  base, extra = divmod(n, parts)
  out, start = [], 0
  for p in range(parts):
    stop = start + base + (1 if p < extra else 0)
    out.append((start, stop))
    start = stop
  return out


# ------------------------------------------------------------------- client


class SGLangClient(Engine):
  """``Engine`` backed by SGLang servers over HTTP.

  Args:
    base_url: ``"http://host:port"``, or a list of them. A call's prompts are
      split over the servers (contiguous chunks, sent concurrently, starting
      at the next server in round-robin order); a chunk whose server fails is
      retried on the next one.
    timeout_s: per HTTP request (generate requests can be long: size it to
      the largest batch; the default, 600 s, covers a paper-scale turn of
      128 multi-turn prompts x 512 new tokens).
    max_retries: retries after the first attempt of each request.
    backoff_s: sleep before retry ``k`` (0-based) is ``backoff_s * 2**k``.
    original_logprobs: the servers run with
      ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``, so temperatures other than 0 and
      1 still return temperature-1 log-probs (see the module docstring).
    vocab_size: when given, prompts with ids outside ``[0, vocab_size)`` are
      refused before they reach (and crash) a server.
    check_weight_version: after ``update_weights``, refuse generations made
      with another ``weight_version``.
    version: the weight version the servers start with.
  """

  def __init__(
      self,
      base_url: Union[str, Sequence[str]],
      *,
      timeout_s: float = 600.0,
      max_retries: int = 3,
      backoff_s: float = 0.5,
      original_logprobs: bool = False,
      vocab_size: Optional[int] = None,
      check_weight_version: bool = True,
      version: int = 0,
  ):
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    if not urls:
      raise ValueError("base_url is empty: give at least one server URL")
    for u in urls:
      if not isinstance(u, str) or not u.startswith(("http://", "https://")):
        raise ValueError(
            f"server URL {u!r} must start with http:// or https://"
        )
    if timeout_s <= 0:
      raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if max_retries < 0:
      raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if backoff_s < 0:
      raise ValueError(f"backoff_s must be >= 0, got {backoff_s}")
    self._urls = [u.rstrip("/") for u in urls]
    self._timeout_s = float(timeout_s)
    self._max_retries = int(max_retries)
    self._backoff_s = float(backoff_s)
    self._original_logprobs = bool(original_logprobs)
    self._vocab_size = vocab_size
    self._check_version = bool(check_weight_version)
    self._version = int(version)
    self._synced = False  # True once update_weights set a version
    # What the servers' weight_version must read (the last full load's).
    self._served = str(self._version)
    self._token = secrets.token_hex(4)  # names this client's adapters
    self._adapter: Optional[str] = None  # the adapter /generate names
    self._rr = itertools.count()
    self._rr_lock = threading.Lock()
    self._down: set[str] = set()  # guarded by _rr_lock
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=4 * len(self._urls),
        thread_name_prefix="sglang-client",
    )

  # -------------------------------------------------------------- Engine API

  @property
  def urls(self) -> list[str]:
    return list(self._urls)

  @property
  def down_urls(self) -> list[str]:
    """Servers marked down (see the module docstring), in ``urls`` order."""
    with self._rr_lock:
      return [u for u in self._urls if u in self._down]

  def _live_urls(self) -> list[str]:
    """Servers not marked down; all of them when every one is."""
    with self._rr_lock:
      live = [u for u in self._urls if u not in self._down]
    return live or list(self._urls)

  def _mark_down(self, url: str, reason: str) -> None:
    with self._rr_lock:
      if url in self._down:
        return
      self._down.add(url)
    log.warning("rollout server %s is down (%s); using the others", url, reason)

  @property
  def weight_version(self) -> int:
    return self._version

  @property
  def adapter(self) -> Optional[str]:
    """The LoRA adapter generations use (``update_adapter``), or None."""
    return self._adapter

  @property
  def base_version(self) -> str:
    """The ``weight_version`` of the base ``update_adapter`` loads."""
    return f"lora-base-{self._token}"

  @property
  def timeout_s(self) -> float:
    """Seconds one HTTP request may take."""
    return self._timeout_s

  @property
  def original_logprobs(self) -> bool:
    """Any temperature is allowed (the servers return T=1 log-probs)."""
    return self._original_logprobs

  @property
  def logprobs_tempered(self) -> bool:
    """Always False: requests whose log-probs would be tempered are refused."""
    return False

  def generate(
      self, prompts: Sequence[Sequence[int]], params: SamplingParams
  ) -> list[GenerationResult]:
    """One result per prompt, in order; log-probs at temperature 1."""
    if len(prompts) == 0:
      return []
    t = float(params.temperature)
    if t not in (0.0, 1.0) and not self._original_logprobs:
      raise ValueError(
          f"SamplingParams.temperature {t}: SGLang would return log-probs of"
          " the tempered distribution. Sample at temperature 1 (or 0), or"
          " start the servers with SGLANG_RETURN_ORIGINAL_LOGPROB=1 and build"
          " SGLangClient(..., original_logprobs=True)."
      )
    # Validate everything before any request goes out.
    make_generate_request(prompts, params, vocab_size=self._vocab_size)
    urls = self._live_urls()
    ranges = split_evenly(len(prompts), len(urls))
    first = self._next_server()
    if len(ranges) == 1:  # in the caller's thread: callers may run many
      return self._generate_chunk(prompts, params, 0, urls, first)
    futures = [
        self._pool.submit(
            self._generate_chunk, prompts[a:b], params, a, urls, first + k
        )
        for k, (a, b) in enumerate(ranges)
    ]
    results = []
    for f in futures:
      results += f.result()
    return results

  def update_weights(self, params_or_path, version: int) -> None:
    """Makes every server load the HF safetensors directory
    ``params_or_path`` as ``weight_version = str(version)``.

    A server that gives no HTTP answer is skipped with a warning and marked
    down; one that loads the weights is (again) up. Raises SGLangError
    naming the servers that failed when a server answered but did not load
    the weights, or when no server did; ``weight_version`` changes only
    when neither happened.
    """
    if not isinstance(params_or_path, (str, bytes)) and not hasattr(
        params_or_path, "__fspath__"
    ):
      raise TypeError(
          "SGLangClient.update_weights needs a HF safetensors directory path"
          f" (export with models.hf_io.save_hf_model), got"
          f" {type(params_or_path).__name__}"
      )
    path = os.fspath(params_or_path)
    version = int(version)
    self._sync_all(
        lambda u, retries: self._update_one(u, path, str(version), retries),
        f"weight update to version {version} from {path}",
    )
    self._version, self._served = version, str(version)
    self._adapter = None
    self._synced = True

  def update_adapter(self, adapter_dir, version: int, *, base_dir) -> None:
    """Makes every server decode with the PEFT adapter directory
    ``adapter_dir`` on the frozen base (module docstring, LoRA adapters):
    each server loads the adapter as ``rspo-<client>-v<version>``, then,
    without this client's base (``GET /model_info``'s ``weight_version``
    is not ``base_version``), the HF directory ``base_dir``, then unloads
    this client's older adapters (``stale_adapters``).
    Membership and errors as ``update_weights``; SGLangAdapterRefused when
    a server refused the adapter."""
    adapter_dir, base_dir = os.fspath(adapter_dir), os.fspath(base_dir)
    version = int(version)
    name = f"{ADAPTER_PREFIX}{self._token}-v{version}"
    make_adapter_request(name, adapter_dir)  # validates
    self._sync_all(
        lambda u, retries: self._adapter_one(
            u, adapter_dir, name, base_dir, retries
        ),
        f"adapter update to version {version} from {adapter_dir}",
    )
    self._version, self._served = version, self.base_version
    self._adapter = name
    self._synced = True

  def _sync_all(self, update_one, what: str) -> None:
    """Runs ``update_one(url, retries)`` on every server (a down one once,
    without retries) and keeps membership (``update_weights``)."""
    down = set(self.down_urls)
    futures = {
        u: self._pool.submit(
            update_one, u, 0 if u in down else self._max_retries
        )
        for u in self._urls
    }
    errors, unreachable, loaded, refused = [], [], [], []
    for u, f in futures.items():
      try:
        f.result()
        loaded.append(u)
      except SGLangUnreachableError as e:
        unreachable.append((u, str(e)))
      except SGLangAdapterRefused as e:
        refused.append(str(e))
        errors.append(str(e))
      except SGLangError as e:
        errors.append(str(e))
    with self._rr_lock:
      back = [u for u in loaded if u in self._down]
      self._down.difference_update(loaded)
    if back:
      log.warning("rollout servers %s are up again", ", ".join(back))
    for u, e in unreachable:
      self._mark_down(u, e)
    if unreachable and not errors and loaded:
      log.warning(
          "%s skipped %d of %d servers that did not answer: %s",
          what,
          len(unreachable),
          len(self._urls),
          ", ".join(u for u, _ in unreachable),
      )
    if errors or not loaded:
      errors += [e for _, e in unreachable]
      kind = SGLangAdapterRefused if refused else SGLangError
      raise kind(
          f"{what} failed on {len(errors)} of {len(self._urls)} servers: "
          + "; ".join(errors)
      )

  def weights_updated(self, version: int) -> None:
    """Every server took weights ``version`` by another channel (a
    torch.distributed broadcast, rollout/distributed_sync.py): checks that
    each reports it in ``GET /model_info``, then takes ``version`` as
    ``weight_version``. SGLangError naming a server that reports another."""
    version = int(version)
    for u in self._urls:
      info = self._call(u, "GET", "/model_info", None)
      got = info.get("weight_version") if isinstance(info, dict) else info
      if str(got) != str(version):
        raise SGLangError(
            f"{u}: after a weight update reports"
            f" weight_version {got!r}, expected {str(version)!r}"
        )
    with self._rr_lock:
      self._down.clear()
    self._version, self._served = version, str(version)
    self._adapter = None
    self._synced = True

  def flush_cache(self) -> None:
    """Empties the prefix (radix) cache of every server not marked down."""
    for u in self._live_urls():
      self._call(u, "POST", "/flush_cache", None, want_json=False)

  def model_info(self, url: Optional[str] = None) -> dict:
    """``GET /model_info`` of one server (default: the first)."""
    info = self._call(url or self._urls[0], "GET", "/model_info", None)
    if not isinstance(info, dict):
      raise SGLangError(f"{url or self._urls[0]}/model_info: not an object")
    return info

  def health(self) -> bool:
    """True when every server answers ``GET /health`` with 200 (one try)."""
    for u in self._urls:
      try:
        status, _ = _http(
            u + "/health", "GET", None, min(self._timeout_s, _HEALTH_TIMEOUT_S)
        )
      except _NO_ANSWER:
        return False
      if status != 200:
        return False
    return True

  def unreachable_urls(self) -> list[str]:
    """Servers that give no HTTP answer to ``GET /health`` (one try each,
    at most 10 s): nothing listens there, or it cannot be reached. A server
    still loading answers (503) and is not listed."""
    down = []
    for u in self._urls:
      try:
        _http(
            u + "/health", "GET", None, min(self._timeout_s, _HEALTH_TIMEOUT_S)
        )
      except _NO_ANSWER:
        down.append(u)
    return down

  def wait_healthy(self, timeout_s: float = 120.0, poll_s: float = 0.5) -> None:
    """Blocks until ``health()``; SGLangError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not self.health():
      if time.monotonic() > deadline:
        raise SGLangError(
            f"servers {self._urls} not healthy after {timeout_s:.0f} s"
        )
      time.sleep(poll_s)

  def close(self) -> None:
    self._pool.shutdown(wait=False, cancel_futures=True)

  # --------------------------------------------------------------- internals

  def _next_server(self) -> int:
    with self._rr_lock:
      return next(self._rr)

  def _generate_chunk(self, prompts, params, first_index, urls, server):
    body = make_generate_request(
        prompts,
        params,
        first_index=first_index,
        vocab_size=self._vocab_size,
        adapter=self._adapter,
    )
    expected = self._served if self._synced and self._check_version else None
    last = None
    for attempt in range(self._max_retries + 1):
      if attempt:
        time.sleep(self._backoff_s * 2 ** (attempt - 1))
      url = urls[(server + attempt) % len(urls)]
      try:
        payload = self._attempt(url, "POST", "/generate", body)
        try:
          return parse_generate_response(
              payload, len(prompts), expected_version=expected
          )
        except ValueError as e:
          raise _RetriableError(f"invalid /generate answer: {e}") from e
      except _RetriableError as e:
        last = f"{url}: {e}"
        if e.refused and len(self._urls) > 1:
          self._mark_down(url, str(e))
    raise SGLangError(
        f"/generate failed after {self._max_retries + 1} attempts; last"
        f" failure: {last}"
    )

  def _adapter_one(self, url, adapter_dir, name, base_dir, retries):
    # The adapter first: a server that refuses it gets no base either.
    answer = _load_adapter(self._call, url, name, adapter_dir, retries)
    info = self._call(url, "GET", "/model_info", None, retries=retries)
    got = info.get("weight_version") if isinstance(info, dict) else info
    if str(got) != self.base_version:  # first sync, or it restarted
      self._update_one(url, base_dir, self.base_version, retries)
    for old in stale_adapters(answer.get("loaded_adapters"), name):
      try:
        self._call(
            url,
            "POST",
            "/unload_lora_adapter",
            {"lora_name": old},
            retries=retries,
        )
      except SGLangError as e:  # memory, not correctness: requests name new
        log.warning("%s: could not unload LoRA adapter %s: %s", url, old, e)

  def _update_one(self, url, path, version, retries):
    body = {"model_path": path, "weight_version": str(version)}
    answer = self._call(
        url, "POST", "/update_weights_from_disk", body, retries=retries
    )
    if not isinstance(answer, dict) or answer.get("success") is not True:
      raise SGLangError(f"{url}/update_weights_from_disk: answered {answer!r}")
    info = self._call(url, "GET", "/model_info", None, retries=retries)
    got = info.get("weight_version") if isinstance(info, dict) else info
    if str(got) != str(version):
      raise SGLangError(
          f"{url}: after /update_weights_from_disk reports weight_version"
          f" {got!r}, expected {str(version)!r}"
      )

  def _call(self, url, method, route, body, *, want_json=True, retries=None):
    """One request to one server, with retries on that server.

    Raises SGLangUnreachableError when no attempt got an HTTP answer.
    """
    retries = self._max_retries if retries is None else retries
    last, answered = None, False
    for attempt in range(retries + 1):
      if attempt:
        time.sleep(self._backoff_s * 2 ** (attempt - 1))
      try:
        return self._attempt(url, method, route, body, want_json=want_json)
      except _RetriableError as e:
        last, answered = str(e), answered or e.answered
    kind = SGLangError if answered else SGLangUnreachableError
    raise kind(
        f"{url}{route} failed after {retries + 1} attempts; last"
        f" failure: {last}"
    )

  def _attempt(self, url, method, route, body, *, want_json=True):
    """One HTTP exchange; _RetriableError or SGLangRequestError on failure."""
    try:
      status, text = _http(url + route, method, body, self._timeout_s)
    except _NO_ANSWER as e:  # refusals, resets, timeouts, cut-off answers
      reason = getattr(e, "reason", e)
      raise _RetriableError(
          f"{type(e).__name__}: {e}",
          answered=False,
          refused=isinstance(reason, ConnectionRefusedError),
      ) from e
    if 400 <= status < 500:
      raise SGLangRequestError(
          f"{url}{route} rejected the request (HTTP {status}):"
          f" {_message(text)}"
      )
    if status != 200:
      raise _RetriableError(f"HTTP {status}: {_message(text)}")
    if not want_json:
      return text
    try:
      return json.loads(text)
    except json.JSONDecodeError as e:
      raise _RetriableError(f"answer is not JSON ({e}): {text[:200]!r}") from e


def _message(text: str) -> str:
  """The ``message`` of an SGLang error object, else the text's start."""
  try:
    obj = json.loads(text)
    if isinstance(obj, dict) and "message" in obj:
      return str(obj["message"])[:500]
  except json.JSONDecodeError:
    pass
  return text[:500]


def _http(url: str, method: str, body, timeout_s: float) -> tuple[int, str]:
  """(status, body text); raises OSError / URLError when no answer came."""
  data = None if body is None else json.dumps(body).encode()
  req = urllib.request.Request(url, data=data, method=method)
  if data is not None:
    req.add_header("Content-Type", "application/json")
  try:
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
      return resp.status, resp.read().decode("utf-8", "replace")
  except urllib.error.HTTPError as e:
    return e.code, e.read().decode("utf-8", "replace")


def _load_adapter(call, url, name, adapter_dir, retries) -> dict:
  """``POST /load_lora_adapter`` through ``call`` (``SGLangClient._call``):
  the server's answer, or SGLangAdapterRefused."""
  try:
    answer = call(
        url,
        "POST",
        "/load_lora_adapter",
        make_adapter_request(name, adapter_dir),
        retries=retries,
    )
  except SGLangRequestError as e:
    if "already loaded" not in str(e):  # else: a retry after a lost answer
      raise SGLangAdapterRefused(
          f"{url} refused LoRA adapter {adapter_dir} ({e}); start the"
          " servers with --enable-lora --max-lora-rank R"
          " --lora-target-modules ... or set"
          " rollout.sglang_lora_sync=merged"
      ) from e
    answer = {"success": True}
  if not isinstance(answer, dict) or answer.get("success") is not True:
    raise SGLangAdapterRefused(
        f"{url}/load_lora_adapter: answered" f" {answer!r}"
    )
  return answer
