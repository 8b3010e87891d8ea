r"""Serves our JAX engine behind SGLang's native HTTP API.

    python launch/serve_rollout.py --model_path DIR [--host 127.0.0.1]
        [--port 30000]
    python launch/serve_rollout.py --preset tiny   # random init, ids only

``DIR`` is a HF safetensors directory (config.json, model*.safetensors,
tokenizer files optional). Any SGLang-native client, e.g.
``rspo_jax.rollout.sglang_client.SGLangClient``, then drives it with
``/generate`` (input_ids, return_logprob) and ``/update_weights_from_disk``.
Binds 127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import os

from rspo_jax.models import hf_io  # pylint: disable=g-import-not-at-top
from rspo_jax.models import tokenizer as tok_lib
from rspo_jax.models.config import get_model_config
from rspo_jax.rollout import http_server
from rspo_jax.rollout import jax_engine
from rspo_jax.rollout.engine import SamplingParams


def _ints(text: str) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError as e:
    raise argparse.ArgumentTypeError(f"not a comma list of ints: {text}") from e


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--model_path", help="HF safetensors directory")
  src.add_argument("--preset", help="model preset, random init (e.g. tiny)")
  p.add_argument(
      "--seed",
      type=int,
      default=0,
      help="init seed for --preset; draws of unseeded requests",
  )
  p.add_argument("--host", default="127.0.0.1")
  p.add_argument("--port", type=int, default=30000)
  p.add_argument("--dtype", default=None, help="param/compute dtype override")
  p.add_argument(
      "--batch_buckets", type=_ints, default=jax_engine.BATCH_BUCKETS
  )
  p.add_argument(
      "--prompt_buckets", type=_ints, default=jax_engine.PROMPT_BUCKETS
  )
  p.add_argument("--new_token_multiple", type=int, default=16)
  p.add_argument(
      "--no_warmup",
      action="store_true",
      help="skip compiling the smallest shapes before serving",
  )
  p.add_argument("--verbose", action="store_true", help="log every request")
  return p.parse_args(argv)


def build_engine(args):
  """(engine, cfg, decode_fn) from the parsed flags."""
  tokenizer = None
  if args.model_path:
    cfg, model = hf_io.load_hf_model(args.model_path, dtype=args.dtype)
    try:
      tokenizer = tok_lib.load_tokenizer(args.model_path)
    except ValueError:
      tokenizer = None  # ids only; stop strings unavailable
  else:
    overrides = (
        {}
        if args.dtype is None
        else dict(dtype=args.dtype, param_dtype=args.dtype)
    )
    cfg = get_model_config(args.preset, **overrides)
    model = hf_io.create_model(cfg, seed=args.seed)
  eos = cfg.eos_token_id
  eos_ids = (
      ()
      if eos is None
      else ((int(eos),) if isinstance(eos, int) else tuple(int(e) for e in eos))
  )
  pad_id = None
  if tokenizer is not None and tokenizer.pad_token_id is not None:
    pad_id = int(tokenizer.pad_token_id)
  if pad_id is None:
    pad_id = eos_ids[0] if eos_ids else 0
  if tokenizer is not None:
    tok_lib.check_tokenizer_matches(tokenizer, cfg)
  decode_fn = (
      None if tokenizer is None else lambda ids: tokenizer.decode(list(ids))
  )

  engine = jax_engine.JaxEngine(
      model,
      cfg,
      pad_id=pad_id,
      eos_ids=eos_ids,
      batch_buckets=args.batch_buckets,
      prompt_buckets=args.prompt_buckets,
      new_token_multiple=args.new_token_multiple,
      decode_fn=decode_fn,
      seed=args.seed,
  )
  return engine, cfg, decode_fn


def check_args(args) -> None:
  """SystemExit with one line when --model_path or --preset names nothing."""
  from rspo_jax.models.config import PRESETS
  from rspo_jax.errors import did_you_mean

  if args.model_path and not os.path.isfile(
      os.path.join(args.model_path, "config.json")
  ):
    raise SystemExit(
        f"error: --model_path={args.model_path!r}: no Hugging Face model"
        " there; pass --model_path=<a directory with config.json and"
        " *.safetensors>, or --preset=<name> for a random init"
    )
  if args.preset and args.preset not in PRESETS:
    raise SystemExit(
        f"error: --preset={args.preset!r} is no model preset"
        f"{did_you_mean(args.preset, PRESETS)}; known:"
        f" {', '.join(sorted(PRESETS))}"
    )


def main(argv=None) -> None:
  args = parse_args(argv)
  check_args(args)
  engine, cfg, decode_fn = build_engine(args)
  if not args.no_warmup:
    engine.generate([[0]], SamplingParams(max_new_tokens=1, seed=0))
  server = http_server.make_server(
      engine,
      host=args.host,
      port=args.port,
      model_path=args.model_path,
      vocab_size=cfg.vocab_size,
      decode_fn=decode_fn,
      verbose=args.verbose,
  )
  print(f"serving {args.model_path or args.preset} on {server.url}", flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()


if __name__ == "__main__":
  main()
