"""The one generation-engine interface (in-process JAX or an SGLang server).

Behaviour log-probs: ``GenerationResult.logprobs`` are log-probabilities of
the sampled tokens under the *untempered* policy, ``log softmax(logits)`` at
temperature 1 -- the quantity the learner recomputes. Engines that can only
return tempered log-probs must say so via ``logprobs_tempered``.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Optional, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Sampling knobs of one ``generate`` call; validated on construction
  (ValueError): ``max_new_tokens >= 0`` (0: no tokens, SGLang's scoring-only
  request), ``temperature >= 0`` (0 = greedy), ``0 < top_p <= 1``."""

  temperature: float = 1.0
  top_p: float = 1.0
  max_new_tokens: int = 64
  stop_token_ids: tuple[int, ...] = ()
  stop_strings: tuple[str, ...] = ()
  seed: Optional[int] = None

  def __post_init__(self):
    if not self.max_new_tokens >= 0:
      raise ValueError(
          f"SamplingParams.max_new_tokens must be >= 0: {self.max_new_tokens}"
      )
    if not self.temperature >= 0:
      raise ValueError(
          f"SamplingParams.temperature must be >= 0: {self.temperature}"
      )
    if not 0 < self.top_p <= 1:
      raise ValueError(f"SamplingParams.top_p must be in (0, 1]: {self.top_p}")


@dataclasses.dataclass
class GenerationResult:
  token_ids: np.ndarray  # int32 [n] generated tokens (stop token included)
  logprobs: np.ndarray  # float32 [n] log pi(token) at temperature 1
  finish_reason: str  # "stop" | "length" | "abort"


class Engine(abc.ABC):
  """Generates continuations of token-id prompts."""

  @abc.abstractmethod
  def generate(
      self, prompts: Sequence[Sequence[int]], params: SamplingParams
  ) -> list[GenerationResult]:
    """One result per prompt, in order."""

  @abc.abstractmethod
  def update_weights(self, params_or_path, version: int) -> None:
    """Loads new weights (an NNX state, or a HF safetensors directory)."""

  @property
  @abc.abstractmethod
  def weight_version(self) -> int:
    ...

  def health(self) -> bool:
    return True

  def close(self) -> None:
    pass
