"""Lets SGLang 0.5.23's torch_native LoRA backend run on a CPU-only torch.

SGLang allocates its LoRA bookkeeping tensors in pinned host memory
unconditionally (``pin_memory=True`` in srt/lora/layers.py lines 145, 324,
479, 723, 814, ``.pin_memory()`` at 594, and srt/lora/backend/
torch_backend.py lines 225-244), which a torch without an accelerator
refuses ("pin_memory=True requires a CUDA or other accelerator backend").
Pinning only speeds host-to-device copies; on a CPU engine there is no
device copy, so here it is a no-op: the same tensors in ordinary memory.
Nothing else changes. Loaded as ``sitecustomize`` (this directory on the
server's PYTHONPATH, tests/sglang_fixtures.py), so SGLang's spawned
scheduler processes get it too; it does nothing when torch has CUDA.
"""

import functools

import torch

if not torch.cuda.is_available():
  torch.Tensor.pin_memory = lambda self, *args, **kwargs: self

  def _unpinned(factory):
    @functools.wraps(factory)
    def make(*args, pin_memory=False, **kwargs):
      del pin_memory
      return factory(*args, **kwargs)

    return make

  for _name in (
      "tensor",
      "empty",
      "zeros",
      "ones",
      "full",
      "arange",
      "empty_strided",
      "empty_like",
      "zeros_like",
      "ones_like",
      "full_like",
  ):
    setattr(torch, _name, _unpinned(getattr(torch, _name)))
