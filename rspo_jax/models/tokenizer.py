"""Locally trained byte-level BPE tokenizers (HF format) and loading helpers.

No hub access: tests and the CPU default train a small tokenizer on generated
text; real runs load the checkpoint's own tokenizer directory.
"""

from __future__ import annotations

import json
import os
from typing import Iterable

from rspo_jax.models.config import ModelConfig

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Qwen-style ChatML (without Qwen's default system message).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: str,
    whole_words: Iterable[str] = (),
):
  """Trains a byte-level BPE on texts and writes a HF tokenizer directory.

  Special tokens get ids 0, 1, 2 (<|endoftext|>, <|im_start|>, <|im_end|>),
  then the 256 byte symbols, then merges, up to vocab_size in total.
  ``whole_words`` (e.g. WebShop's product ids) are added after that as
  single tokens. eos = <|im_end|>, pad = <|endoftext|>. Returns the loaded
  tokenizer.
  """
  from tokenizers import (
      AddedToken,
      Tokenizer,
      decoders,
      models,
      pre_tokenizers,
      trainers,
  )
  from transformers import PreTrainedTokenizerFast

  minimum = len(SPECIAL_TOKENS) + 256
  if vocab_size < minimum:
    raise ValueError(
        f"vocab_size {vocab_size} < {minimum} (3 special tokens + 256 bytes)"
    )
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=list(SPECIAL_TOKENS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
  )
  tok.train_from_iterator(texts, trainer)
  words = sorted(set(whole_words))
  if words:
    tok.add_tokens([AddedToken(w, normalized=False) for w in words])
  fast = PreTrainedTokenizerFast(
      tokenizer_object=tok,
      eos_token=IM_END,
      pad_token=ENDOFTEXT,
      unk_token=None,
      bos_token=None,
      additional_special_tokens=[IM_START, IM_END],
      model_max_length=32768,
      clean_up_tokenization_spaces=False,
  )
  os.makedirs(out_dir, exist_ok=True)
  fast.save_pretrained(out_dir)
  # The template and a class name every transformers version knows live in
  # tokenizer_config.json (as in Qwen's own directories).
  config_path = os.path.join(out_dir, "tokenizer_config.json")
  with open(config_path) as f:
    config = json.load(f)
  config["chat_template"] = CHATML_TEMPLATE
  config["tokenizer_class"] = "PreTrainedTokenizerFast"
  with open(config_path, "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  jinja = os.path.join(out_dir, "chat_template.jinja")
  if os.path.exists(jinja):
    os.remove(jinja)
  return load_tokenizer(out_dir)


def load_tokenizer(path: str):
  """``AutoTokenizer.from_pretrained`` on a local directory only."""
  if not os.path.isdir(path) or not any(
      os.path.exists(os.path.join(path, f))
      for f in ("tokenizer.json", "tokenizer_config.json")
  ):
    raise ValueError(
        f"no tokenizer at {path!r}: expected a directory with tokenizer.json"
        " or tokenizer_config.json (train one with train_tokenizer)"
    )
  from transformers import AutoTokenizer, PreTrainedTokenizerFast

  config_path = os.path.join(path, "tokenizer_config.json")
  declared = None
  if os.path.exists(config_path):
    with open(config_path) as f:
      declared = json.load(f).get("tokenizer_class")
  if declared == "PreTrainedTokenizerFast":
    # One of ours (train_tokenizer): tokenizer.json is the whole truth. In a
    # checkpoint directory AutoTokenizer would follow config.json's
    # model_type to Qwen2Tokenizer, whose own pre-tokenizer splits digits
    # differently -- other token ids than the policy was trained on.
    return PreTrainedTokenizerFast.from_pretrained(
        path, trust_remote_code=False, local_files_only=True
    )
  return AutoTokenizer.from_pretrained(
      path, trust_remote_code=False, local_files_only=True
  )


def check_tokenizer_matches(tokenizer, cfg: ModelConfig) -> None:
  """Raises ValueError when the tokenizer has more ids than the embedding."""
  n = len(tokenizer)
  if n > cfg.vocab_size:
    raise ValueError(
        f"tokenizer vocabulary ({n} tokens) is larger than the model's"
        f" vocab_size ({cfg.vocab_size})"
    )
