"""XLA flags the launchers set for GPU and TPU, each with its reason.

``launch/train.py`` calls ``apply(os.environ)`` before JAX starts: on a GPU
host it puts ``GPU`` in front of ``XLA_FLAGS``, on a TPU host ``TPU`` in
front of ``LIBTPU_INIT_ARGS`` (a flag given again later -- yours -- wins).
The platform is ``RSPO_XLA_PLATFORM`` (``gpu`` | ``tpu`` | ``none``; the
cluster launchers set it), else read from the host (``/dev/nvidiactl``:
GPU, ``/dev/accel0``: TPU), else none; ``JAX_PLATFORMS=cpu`` means none.
``RSPO_XLA_PLATFORM=none`` keeps the environment as it is.

An XLA that does not know one of the GPU flags (another jaxlib) stops the
run before it starts with one line naming the flag (``check``: a CPU-only
JAX in a subprocess parses the same flag table). libtpu parses its flags
itself when the TPU starts, and one it does not know stops every host; so
on a TPU host each flag of ``LIBTPU_INIT_ARGS`` is looked up in the
installed libtpu's strings first (``check_tpu``: a flag's name is a string
in the library that defines it) and one that is not there is dropped with
a warning. Without a libtpu to read (``libtpu_path``: ``TPU_LIBRARY_PATH``,
else the ``libtpu`` package's ``libtpu.so``) the flags go unchecked, with
a warning.

Not yet run on hardware: the flags are the ones MaxText runs on the same
mesh shape (two nodes of 8 H100s, 'data' across nodes and FSDP within:
``MaxText/configs/a3/llama_2_7b/2vm.sh``; v5e:
``MaxText/configs/v5e/llama2_7b.sh``) and NVIDIA's JAX-Toolbox documents
(``rosetta/docs/GPU_performance.md``; its containers set the first by
default). Their effect on this learner is unmeasured.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Optional

# (flag, why) for the learner's step: FSDP gathers each layer's weights
# and reduce-scatters its gradient inside the scanned layer loop; the data
# axis reduces the gradients once per update.
GPU = (
    (
        "--xla_gpu_enable_latency_hiding_scheduler=true",
        "schedule the collectives early and the compute around them, so the "
        "FSDP all-gathers and reduce-scatters overlap the layers' matmuls",
    ),
    (
        "--xla_gpu_enable_highest_priority_async_stream=true",
        "run the asynchronous collectives' stream at the highest priority: "
        "compute kernels do not starve them",
    ),
    (
        "--xla_gpu_enable_pipelined_all_gather=true",
        "in the scanned layer loop, gather the next layer's weights during "
        "this layer's compute",
    ),
    (
        "--xla_gpu_enable_pipelined_reduce_scatter=true",
        "and reduce-scatter this layer's gradient during the next one's",
    ),
    (
        "--xla_gpu_enable_while_loop_double_buffering=true",
        "double-buffer the scanned loop's carried buffers, which the two "
        "above need to overlap (one more layer's gathered weights: 0.5 GB "
        "bf16 for 7B)",
    ),
    (
        "--xla_gpu_enable_command_buffer=",
        "no CUDA graphs: their capture has hung multi-GPU JAX jobs and is "
        "incompatible with profile-guided scheduling; MaxText's GPU runs "
        "turn them off (its --xla_gpu_graph_level=0, this flag's old name)",
    ),
)
TPU = (
    (
        "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
        "optimise the data-parallel gradient all-reduce",
    ),
    (
        "--xla_tpu_data_parallel_opt_different_sized_ops=true",
        "also across gradients of different sizes",
    ),
    (
        "--xla_tpu_enable_async_collective_fusion=true",
        "run the collectives asynchronously, overlapped with compute",
    ),
    (
        "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
        "including FSDP's weight all-gathers",
    ),
    (
        "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
        "spread over several steps of the schedule",
    ),
    (
        "--xla_tpu_overlap_compute_collective_tc=true",
        "overlap the collectives with the TensorCore's compute",
    ),
    ("--xla_enable_async_all_gather=true", "asynchronous all-gathers"),
)
VARIABLE = {"gpu": "XLA_FLAGS", "tpu": "LIBTPU_INIT_ARGS"}
FLAGS = {"gpu": GPU, "tpu": TPU}


def platform(environ) -> str:
  """'gpu', 'tpu' or 'none' (module docstring)."""
  given = environ.get("RSPO_XLA_PLATFORM", "").strip().lower()
  if given:
    if given not in ("gpu", "tpu", "none"):
      raise ValueError(f"RSPO_XLA_PLATFORM={given!r}: use gpu, tpu or none")
    return given
  jax_platforms = environ.get("JAX_PLATFORMS", "").strip().lower()
  if jax_platforms and not re.search(r"cuda|gpu|rocm|tpu", jax_platforms):
    return "none"
  if os.path.exists("/dev/nvidiactl"):
    return "gpu"
  if os.path.exists("/dev/accel0"):
    return "tpu"
  return "none"


def apply(environ) -> dict:
  """Puts the platform's flags in front of its variable in ``environ``
  (flags already there with the same name are left to win). Returns
  {variable: value} of what it set, {} on none."""
  name = platform(environ)
  if name == "none":
    return {}
  var = VARIABLE[name]
  own = environ.get(var, "")
  given = {f.split("=")[0] for f in own.split()}
  ours = [f for f, _ in FLAGS[name] if f.split("=")[0] not in given]
  value = " ".join(ours + ([own] if own.strip() else []))
  environ[var] = value
  return {var: value}


def unknown_flag(stderr: str) -> Optional[str]:
  """The flag of XLA's ``Unknown flag in XLA_FLAGS: --x`` line, if any."""
  m = re.search(r"Unknown flags? in XLA_FLAGS:\s*(\S+)", stderr)
  return m.group(1) if m else None


def check(environ) -> Optional[str]:
  """None if this JAX's XLA knows every flag of ``XLA_FLAGS``, else one
  line naming the unknown one. Parses them in a CPU-only subprocess
  (about a second; no accelerator is touched)."""
  env = dict(environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-c", "import jax; jax.devices('cpu')"],
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  flag = unknown_flag(proc.stderr) if proc.returncode else None
  if flag is None:
    return None
  ours = flag.split("=")[0] in {f.split("=")[0] for f, _ in GPU}
  source = (
      "one of launch/xla_flags.py's GPU defaults; RSPO_XLA_PLATFORM="
      "none drops them"
      if ours
      else "set in your XLA_FLAGS"
  )
  return (
      f"this jaxlib's XLA does not know the flag {flag} in XLA_FLAGS"
      f" ({source})"
  )


def libtpu_path(environ) -> Optional[str]:
  """The libtpu shared library JAX will load: ``TPU_LIBRARY_PATH``, else
  ``libtpu.so`` in the installed ``libtpu`` package (``jax[tpu]``), else
  None. The package is found, not imported."""
  import importlib.util

  given = environ.get("TPU_LIBRARY_PATH", "").strip()
  if given:
    return given if os.path.isfile(given) else None
  for package in ("libtpu", "libtpu_nightly"):
    try:
      spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
      spec = None
    for where in (spec.submodule_search_locations or []) if spec else []:
      path = os.path.join(where, "libtpu.so")
      if os.path.isfile(path):
        return path
  return None


def library_knows(path: str):
  """``knows(name) -> bool``: whether the flag name (without its dashes)
  is a string of the library at ``path`` (read once, memory-mapped)."""
  import mmap

  with open(path, "rb") as f:
    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

  def knows(name: str) -> bool:
    return data.find(name.encode() + b"\0") >= 0

  return knows


def flag_name(flag: str) -> str:
  """'--xla_x=1' -> 'xla_x'."""
  return flag.lstrip("-").split("=")[0]


def drop_unknown(value: str, knows) -> tuple[str, list]:
  """(``value`` without the flags ``knows`` does not know, those flags)."""
  kept, dropped = [], []
  for flag in value.split():
    (kept if knows(flag_name(flag)) else dropped).append(flag)
  return " ".join(kept), dropped


def check_tpu(environ, knows=None) -> list:
  """Drops from ``LIBTPU_INIT_ARGS`` in ``environ`` each flag the installed
  libtpu does not know (``knows``: a name -> bool test; default
  ``library_knows(libtpu_path(environ))``). Returns the warnings, one line
  each: a dropped flag (ours or the environment's), or that no libtpu was
  found to check against."""
  value = environ.get("LIBTPU_INIT_ARGS", "")
  if not value.strip():
    return []
  if knows is None:
    path = libtpu_path(environ)
    if path is None:
      return [
          "no libtpu found (TPU_LIBRARY_PATH, the libtpu package):"
          " LIBTPU_INIT_ARGS left unchecked"
      ]
    knows = library_knows(path)
  value, dropped = drop_unknown(value, knows)
  environ["LIBTPU_INIT_ARGS"] = value
  ours = {flag_name(f) for f, _ in TPU}
  source = lambda flag: (
      "one of launch/xla_flags.py's TPU defaults"
      if flag_name(flag) in ours
      else "set in your LIBTPU_INIT_ARGS"
  )
  return [
      f"this libtpu does not know {flag}: dropped from LIBTPU_INIT_ARGS"
      f" ({source(flag)})"
      for flag in dropped
  ]


if __name__ == "__main__":
  # python launch/xla_flags.py [gpu|tpu]: the flags and their reasons.
  for name in sys.argv[1:] or ("gpu", "tpu"):
    print(f"{VARIABLE[name]} ({name}):")
    for flag, why in FLAGS[name]:
      print(f"  {flag}\n      {why}")
