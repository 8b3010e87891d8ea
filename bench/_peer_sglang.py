"""compare.py worker for an SGLang server (standard library only).

  python bench/_peer_sglang.py --task gen --url http://127.0.0.1:30000 ...

gen: one batched ``/generate`` request per call with ``input_ids`` of N
distinct prompts, temperature 1, top_p 1, ``ignore_eos`` (every row makes
resp_len tokens) and ``return_logprob``; new tokens / s over the whole HTTP
round trip. The server must serve a model of the given shape (its
``/model_info`` path is reported); its memory is not measured.
"""

from __future__ import annotations

import json
import urllib.request

import _common
import _peer_template as peer


def _post(url: str, payload: dict, timeout: float = 600.0):
  req = urllib.request.Request(
      url,
      data=json.dumps(payload).encode(),
      headers={"Content-Type": "application/json"},
  )
  with urllib.request.urlopen(req, timeout=timeout) as resp:
    return json.loads(resp.read())


def task_gen(args, shape):
  url = args.url.rstrip("/")
  with urllib.request.urlopen(url + "/model_info", timeout=30) as resp:
    info = json.loads(resp.read())

  def make_generate(n):
    prompts = _common.prompt_ids(
        n, args.prompt_len, shape["vocab_size"], seed=n
    )

    def generate():
      out = _post(
          url + "/generate",
          {
              "input_ids": prompts,
              "sampling_params": {
                  "temperature": 1.0,
                  "top_p": 1.0,
                  "max_new_tokens": args.resp_len,
                  "ignore_eos": True,
              },
              "return_logprob": True,
          },
      )
      return sum(len(o["meta_info"]["output_token_logprobs"]) for o in out)

    return generate

  peer.generation_task(
      args,
      make_generate,
      peak_rss=False,
      fields=lambda t: {"model_path": info.get("model_path")},
  )


def gen_with_url_only(args):
  if args.task != "gen" or not args.url:
    raise ValueError("the SGLang worker does --task gen with --url only")


def main(argv=None):
  peer.main(__doc__, {"gen": task_gen}, argv, setup=gen_with_url_only)


if __name__ == "__main__":
  main()
