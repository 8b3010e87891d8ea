"""compare.py worker for TRL (run with /work/venv-torch's python).

  python bench/_peer_trl.py --task {train,gen,matmul} --shape JSON ...

Model: ``transformers.Qwen2ForCausalLM`` with the given shape, random init,
float32, saved to a temporary directory (TRL builds its reference model
from the path).

train: ``trl.GRPOTrainer.train`` (CPU, beta 0.01, epsilon 0.2, loss 'grpo',
``rows / group`` prompts x ``group`` generations, ``min_new_tokens`` =
``max_completion_length`` = resp_len) with ``num_iterations=2``: steps
alternate between a generation step (generate, old and reference
log-probs, update) and a pure update step on the buffered batch; a callback
times each. The learner step without generation is two
``_get_per_token_logps_and_entropies`` passes (policy, reference) plus an
update step. The first generation and update steps are warm-up.
gen: ``model.generate`` (sampling, temperature 1, top_p 1, no top-k,
``output_logits`` turned into token log-probs), as TRL generates.
``--torch_threads`` sets torch's intra-op threads (compare.py passes 1: on
the shared 2-core machine 2 OpenMP threads made every step ~4.5x slower).
"""

from __future__ import annotations

import tempfile
import time

import _common
import _peer_template as peer

import torch


def new_model(shape: dict, out_dir: str):
  from transformers import Qwen2Config, Qwen2ForCausalLM

  cfg = Qwen2Config(
      vocab_size=shape["vocab_size"],
      hidden_size=shape["hidden_size"],
      intermediate_size=shape["intermediate_size"],
      num_hidden_layers=shape["num_layers"],
      num_attention_heads=shape["num_heads"],
      num_key_value_heads=shape["num_kv_heads"],
      head_dim=shape["head_dim"],
      rope_theta=float(shape.get("rope_theta", 1e6)),
      rms_norm_eps=shape.get("rms_norm_eps", 1e-6),
      tie_word_embeddings=shape.get("tie_word_embeddings", True),
      max_position_embeddings=4096,
      pad_token_id=_common.PAD_ID,
      eos_token_id=_common.EOS_ID,
      bos_token_id=None,
  )
  torch.manual_seed(0)
  model = Qwen2ForCausalLM(cfg)
  model.save_pretrained(out_dir)
  return model


def task_train(args, shape):
  from datasets import Dataset
  from transformers import TrainerCallback
  from trl import GRPOConfig, GRPOTrainer

  rows, p, r = args.rows, args.prompt_len, args.resp_len
  model_dir = tempfile.mkdtemp()
  tok = _common.word_tokenizer(shape["vocab_size"], model_dir)
  new_model(shape, model_dir)
  n_prompts = (args.iters + 1) * 2 * rows // args.group
  ids = _common.prompt_ids(n_prompts, p, shape["vocab_size"])
  data = Dataset.from_dict({"prompt": [_common.ids_to_text(x) for x in ids]})

  class StepTimer(TrainerCallback):

    def __init__(self):
      self.times, self.cpu, self.t0, self.c0 = [], [], 0.0, 0.0

    def on_step_begin(self, *a, **kw):
      self.t0, self.c0 = time.perf_counter(), time.process_time()

    def on_step_end(self, *a, **kw):
      self.times.append(time.perf_counter() - self.t0)
      self.cpu.append(time.process_time() - self.c0)

  timer = StepTimer()
  config = GRPOConfig(
      output_dir=tempfile.mkdtemp(),
      per_device_train_batch_size=rows,
      num_generations=args.group,
      max_completion_length=r,
      beta=0.01,
      epsilon=0.2,
      num_iterations=2,
      learning_rate=1e-6,
      loss_type="grpo",
      max_steps=2 * (args.iters + 1),
      logging_steps=10**6,
      report_to="none",
      use_cpu=True,
      bf16=False,
      temperature=1.0,
      top_p=1.0,
      save_strategy="no",
      generation_kwargs={"min_new_tokens": r},
      dataloader_num_workers=0,
      shuffle_dataset=False,
  )
  trainer = GRPOTrainer(
      model=model_dir,
      args=config,
      train_dataset=data,
      processing_class=tok,
      callbacks=[timer],
      reward_funcs=lambda completions, **kw: [
          float(len(c)) for c in completions
      ],
  )
  trainer.train()
  x = torch.tensor([row + [5] * r for row in ids[:rows]])
  mask = torch.ones_like(x)

  def logps(model):
    with torch.no_grad():
      return trainer._get_per_token_logps_and_entropies(model, x, mask, r)

  policy = _common.time_calls(lambda: logps(trainer.model), iters=args.iters)
  ref = _common.time_calls(lambda: logps(trainer.ref_model), iters=args.iters)
  upd = peer.median_times(timer.times[3::2], timer.cpu[3::2])
  peer.report_train(
      shape,
      rows=rows,
      seq_len=p + r,
      logp=policy,
      update=upd,
      train=peer.add_times(policy, ref, upd),
      rl=peer.median_times(timer.times[2::2], timer.cpu[2::2]),
      first_s=timer.times[1],
  )


def task_gen(args, shape):
  model = new_model(shape, tempfile.mkdtemp()).eval()

  def make_generate(n):
    x = torch.tensor(
        _common.prompt_ids(n, args.prompt_len, shape["vocab_size"], seed=n)
    )

    def generate():
      with torch.no_grad():
        out = model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=args.resp_len,
            min_new_tokens=args.resp_len,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=_common.PAD_ID,
        )
        new = out.sequences[:, x.shape[1] :]
        logits = torch.stack(out.logits, dim=1).float()
        torch.log_softmax(logits, -1).gather(-1, new[..., None])
      return int(new.numel())

    return generate

  peer.generation_task(args, make_generate)


def task_matmul(args, _):
  n = args.matmul_n
  torch.manual_seed(0)
  a, b = torch.randn(n, n), torch.randn(n, n)
  t = _common.time_calls(lambda: torch.mm(a, b), iters=max(args.iters, 5))
  peer.metric(
      "peak_matmul",
      2 * n**3 / t["min_s"] / 1e9,
      "GFLOP/s",
      n=n,
      dtype="float32",
      framework="torch " + torch.__version__,
  )


def set_threads(args):
  if args.torch_threads:
    torch.set_num_threads(args.torch_threads)


def main(argv=None):
  peer.main(
      __doc__,
      {"train": task_train, "gen": task_gen, "matmul": task_matmul},
      argv,
      setup=set_threads,
  )


if __name__ == "__main__":
  main()
