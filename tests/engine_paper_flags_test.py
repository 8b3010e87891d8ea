"""The in-process engine under the paper's model flags (bf16 compute, remat,
scanned or unrolled layers): build.inference_model / engine_config give it
a model without remat (a remat block inside the decode loop fails to
trace), and it generates the tokens of the same model built without
remat."""

import numpy as np
import pytest

from rspo_jax import build, models
from rspo_jax.rollout.engine import SamplingParams
from rspo_jax.rollout.jax_engine import JaxEngine


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_engine_generates_under_remat(scan):
  kw = dict(num_layers=2, dtype="bfloat16", scan_layers=scan)
  sp = SamplingParams(temperature=1.0, max_new_tokens=6, seed=3)
  prompts = [[5, 6, 7, 8], [9, 10, 11]]
  out = {}
  for remat in (True, False):
    cfg = models.get_model_config("tiny", remat=remat, **kw)
    engine = JaxEngine(
        build.inference_model(models.create_model(cfg, 0), cfg),
        build.engine_config(cfg),
        pad_id=0,
        eos_ids=[1],
    )
    out[remat] = engine.generate(prompts, sp)
  assert (
      build.engine_config(
          models.get_model_config("tiny", remat=True, **kw)
      ).remat
      == "none"
  )
  for a, b in zip(out[True], out[False]):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
    assert len(a.token_ids) > 0
