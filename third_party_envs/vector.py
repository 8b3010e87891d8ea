"""Many environment instances stepped in parallel worker processes.

``VectorEnv`` holds ``num_envs`` instances of one environment, spread over
``num_workers`` processes in contiguous blocks whose sizes differ by at most
one (``worker_of(i)`` names the worker). A call sends one command to every
worker concerned, then collects, so workers run in parallel; inside a worker
its instances run one after another.

Failures never hang the caller and are never dropped silently:
  * an exception in one instance's ``reset``/``step`` comes back as a failed
    ``EnvStep`` for that instance (the instance is rebuilt, the worker lives);
  * a worker that dies (killed, segfault) or sends nothing for
    ``step_timeout_s`` seconds on one instance is killed and restarted; the
    instances it was asked about come back failed now, the other running
    episodes it held are lost and come back failed on their next ``step``.
A failed ``EnvStep`` has ``done=True`` and ``info={'failed': True, 'error':
text}``; ``num_failures`` counts lost episodes, ``num_restarts`` restarts.
A result that breaks the environment's contract (not an ``EnvStep``, a NaN
reward, ...: ``contract.py``) is no failure to count but a fault to fix:
checked here for every environment (and, for a user environment, already
in its worker), it makes ``wait()`` raise ``EnvError``, one line naming the
class, method, task and turn, once every result of the call is in.
The first failure of each kind (exception type and raising line, or worker
fault) is logged at WARNING with its task id and traceback, and appended to
``error_log`` when given (``failures.FailureLog``; ``first_error``).

Worker protocol (one ``Pipe`` per worker): parent -> worker ``(cmd, items)``
with cmd ``reset`` (items ``(slot, task_id, split)``), ``step`` (items
``(slot, action)``) or ``close``; worker -> parent ``('ready', pid)`` once,
then one ``(slot, EnvStep | None, error | None)`` per item, in order.

``use_processes=False`` runs the same logic in-process (tests, debugging);
there a hanging step cannot be interrupted. Workers are started with
``spawn`` (default) or ``forkserver``, never ``fork`` (unsafe once JAX runs
threads), so a launching script needs the ``if __name__ == '__main__':``
guard.
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing import connection as mp_connection
import operator
import os
import signal
import time
import traceback
import weakref
from typing import Optional, Sequence

from rspo_jax.errors import EnvError
from third_party_envs import base
from third_party_envs import contract
from third_party_envs import failures
from third_party_envs import registry

_GRACEFUL_CLOSE_S = 3.0


def failed_step(error: str) -> base.EnvStep:
  """The ``EnvStep`` returned for an episode lost to a failure."""
  return base.EnvStep(
      observation="",
      admissible_actions=[],
      done=True,
      valid_action=False,
      info={"failed": True, "error": error},
  )


def _run_item(envs, make, cmd, item):
  """One reset/step -> (slot, out, error); on error rebuilds the instance.
  A broken contract comes back as the ``EnvError`` itself (error)."""
  slot = item[0]
  try:
    if cmd == "reset":
      return slot, envs[slot].reset(item[1], item[2]), None
    return slot, envs[slot].step(item[1]), None
  except EnvError as e:  # the run stops: no rebuild
    return slot, None, e
  except Exception:  # pylint: disable=broad-except
    error = traceback.format_exc(limit=8)
    try:
      envs[slot].close()
    except Exception:  # pylint: disable=broad-except
      pass
    envs[slot] = make()  # a failure here kills the worker: it is restarted
    return slot, None, error


def _worker_main(conn, env_name: str, env_kwargs: dict, slots: list[int]):
  """Worker process: builds its instances, then serves commands."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides to stop
  make = lambda: registry.make_env(env_name, **env_kwargs)
  try:
    envs = {slot: make() for slot in slots}
  except BaseException:  # pylint: disable=broad-except
    conn.send(("init_error", traceback.format_exc()))
    return
  conn.send(("ready", os.getpid()))
  while True:
    try:
      cmd, items = conn.recv()
    except (EOFError, OSError):
      break  # parent gone
    if cmd == "close":
      break
    for item in items:
      msg = _run_item(envs, make, cmd, item)
      try:
        conn.send(msg)  # pickles fully before writing anything
      except (EOFError, OSError):
        return  # parent gone
      except Exception as e:  # pylint: disable=broad-except
        conn.send((msg[0], None, f"result could not be pickled: {e!r}"))
  for env in envs.values():
    try:
      env.close()
    except Exception:  # pylint: disable=broad-except
      pass
  conn.close()


class _Worker:
  """Parent-side handle of one worker process."""

  def __init__(self, ctx, env_name, env_kwargs, slots):
    self.ctx, self.env_name, self.env_kwargs = ctx, env_name, env_kwargs
    self.slots = slots
    self.proc = self.conn = None

  def start(self):
    parent_conn, child_conn = self.ctx.Pipe(duplex=True)
    proc = self.ctx.Process(
        target=_worker_main,
        args=(child_conn, self.env_name, self.env_kwargs, self.slots),
        daemon=True,
        name=f"VectorEnv-{self.env_name}-{self.slots[0]}",
    )
    try:
      proc.start()
    finally:
      child_conn.close()  # only the child holds its end: EOF when it dies
    self.proc, self.conn = proc, parent_conn

  def wait_ready(self, timeout_s: float):
    if not self.conn.poll(timeout_s):
      self.kill()
      raise RuntimeError(
          f"VectorEnv worker for {self.env_name!r} did not start within "
          f"{timeout_s} s"
      )
    try:
      kind, payload = self.conn.recv()
    except (EOFError, OSError) as e:
      self.kill()
      raise RuntimeError(f"VectorEnv worker died while starting: {e!r}") from e
    if kind != "ready":
      self.kill()
      raise RuntimeError(
          f"VectorEnv worker could not build {self.env_name!r}:\n{payload}"
      )

  def kill(self):
    if self.proc is not None:
      if self.proc.is_alive():
        self.proc.kill()
      self.proc.join()  # reaps: no zombie
    if self.conn is not None:
      self.conn.close()
    self.proc = self.conn = None


def _shutdown(workers: list[_Worker]):
  """Asks every worker to exit, then kills those still running."""
  for w in workers:
    if w.conn is not None:
      try:
        w.conn.send(("close", None))
      except (OSError, ValueError):
        pass
  deadline = time.monotonic() + _GRACEFUL_CLOSE_S
  for w in workers:
    if w.proc is not None:
      w.proc.join(max(0.0, deadline - time.monotonic()))
    w.kill()


class StepHandle:
  """An in-flight ``reset``/``step``; ``wait()`` returns its results."""

  def __init__(self, vec: "VectorEnv", cmd: str, results: list):
    self._vec, self._cmd, self._results = vec, cmd, results
    self._done = False
    self.fatal: Optional[EnvError] = None  # the first broken contract
    self.expected: dict[int, list[int]] = {}  # worker -> slots still owed
    self.sent_at = time.monotonic()

  def wait(self) -> list[Optional[base.EnvStep]]:
    """Per instance: its ``EnvStep``, or None where nothing was asked."""
    if not self._done:
      self._vec._finish(self)  # pylint: disable=protected-access
      self._done = True
    if self.fatal is not None:
      raise self.fatal
    return self._results


class VectorEnv:
  """``num_envs`` instances of ``env_name`` (see module docstring)."""

  def __init__(
      self,
      env_name: str,
      env_kwargs: Optional[dict],
      num_envs: int,
      *,
      num_workers: Optional[int] = None,
      step_timeout_s: float = 60.0,
      use_processes: bool = True,
      start_method: str = "spawn",
      init_timeout_s: float = 300.0,
      error_log: Optional[str] = None,
  ):
    if num_envs < 1:
      raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if step_timeout_s <= 0:
      raise ValueError(f"step_timeout_s must be > 0, got {step_timeout_s}")
    if start_method not in ("spawn", "forkserver"):
      raise ValueError(
          f"start_method must be 'spawn' or 'forkserver', got {start_method!r}"
      )
    self.env_name, self.env_kwargs = env_name, dict(env_kwargs or {})
    self.num_envs = num_envs
    self.step_timeout_s = step_timeout_s
    self.init_timeout_s = init_timeout_s
    self.use_processes = use_processes
    self.num_failures = 0
    self.num_restarts = 0
    self._active = [False] * num_envs  # an episode is running
    self._lost: list[Optional[str]] = [None] * num_envs  # lost episode error
    self._task_of: list[Optional[tuple]] = [None] * num_envs  # (id, split)
    self._turn = [0] * num_envs  # steps since the episode's reset
    self._env_class = registry.env_class(env_name)  # ValueError: no such
    self.failures = failures.FailureLog(env_name, error_log)
    self._pending: Optional[StepHandle] = None
    self._closed = False
    self._workers: list[_Worker] = []
    if not use_processes:
      self._make = lambda: registry.make_env(env_name, **self.env_kwargs)
      self._local_envs = [self._make() for _ in range(num_envs)]
      self._finalizer = None
      self._worker_of = []
      return
    num_workers = num_workers or min(num_envs, os.cpu_count() or 1)
    num_workers = max(1, min(num_workers, num_envs))
    base_size, extra = divmod(num_envs, num_workers)
    blocks, start = [], 0
    for w in range(num_workers):  # contiguous, sizes differ by at most 1
      size = base_size + (w < extra)
      blocks.append(list(range(start, start + size)))
      start += size
    ctx = mp.get_context(start_method)
    self._workers = [_Worker(ctx, env_name, self.env_kwargs, b) for b in blocks]
    self._worker_of = [w for w, b in enumerate(blocks) for _ in b]
    self._finalizer = weakref.finalize(self, _shutdown, self._workers)
    try:
      for w in self._workers:
        w.start()
      for w in self._workers:
        w.wait_ready(init_timeout_s)
    except BaseException:
      self.close()
      raise

  # ---------------------------------------------------------------- queries

  @property
  def num_workers(self) -> int:
    return len(self._workers)

  def worker_of(self, index: int) -> int:
    """Index of the worker holding instance ``index`` (processes only)."""
    return self._worker_of[index]

  def worker_pids(self) -> list[int]:
    return [w.proc.pid if w.proc else -1 for w in self._workers]

  @property
  def first_error(self) -> Optional[str]:
    """The text of the first failure (None: none yet)."""
    return self.failures.first_error

  # ------------------------------------------------------------------ calls

  def reset(
      self, task_ids: Sequence[Optional[int]], split: str = "train"
  ) -> list[Optional[base.EnvStep]]:
    """Starts task ``task_ids[i]`` on instance i (None: leave it alone)."""
    self._check_len(task_ids, "task_ids")
    if split not in base.SPLITS:
      raise ValueError(f"unknown split {split!r}; known: {list(base.SPLITS)}")
    items = {}
    for i, task_id in enumerate(task_ids):
      if task_id is not None:
        try:
          if isinstance(task_id, bool):
            raise TypeError
          task_id = operator.index(task_id)  # int or numpy integer
        except TypeError:
          raise ValueError(
              f"task_ids[{i}] must be an int, got {task_id!r}"
          ) from None
        items[i] = (i, task_id, split)
        self._task_of[i] = (task_id, split)
    return self._submit("reset", items, [None] * self.num_envs).wait()

  def step(
      self, actions: Sequence[Optional[str]]
  ) -> list[Optional[base.EnvStep]]:
    """Steps instance i with ``actions[i]`` (None: finished, skipped)."""
    return self.step_async(actions).wait()

  def step_async(self, actions: Sequence[Optional[str]]) -> StepHandle:
    """Sends the actions and returns at once; ``handle.wait()`` collects."""
    self._check_len(actions, "actions")
    results: list[Optional[base.EnvStep]] = [None] * self.num_envs
    for i, action in enumerate(actions):
      if action is None or self._lost[i] is not None:
        continue
      if not isinstance(action, str):
        raise ValueError(f"actions[{i}] must be str or None, got {action!r}")
      if not self._active[i]:
        raise ValueError(
            f"actions[{i}]: instance {i} has no running episode; reset it"
        )
    items = {}
    for i, action in enumerate(actions):
      if action is None:
        continue
      if self._lost[i] is not None:  # lost in an earlier worker failure
        results[i] = failed_step(self._lost[i])
        self._lost[i] = None
      else:
        items[i] = (i, action)
    return self._submit("step", items, results)

  def close(self) -> None:
    """Stops all workers (idempotent); also runs at garbage collection/exit."""
    self._closed = True
    self._pending = None
    if self._finalizer is not None:
      self._finalizer()
    if not self.use_processes:
      for env in self._local_envs:
        env.close()
      self._local_envs = []

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # -------------------------------------------------------------- internals

  def _check_len(self, seq, name):
    if self._closed:
      raise RuntimeError("VectorEnv is closed")
    if self._pending is not None:
      raise RuntimeError("a step_async handle is still pending: wait() first")
    if len(seq) != self.num_envs:
      raise ValueError(
          f"{name} has {len(seq)} entries, expected num_envs={self.num_envs}"
      )

  def _submit(self, cmd: str, items: dict, results: list) -> StepHandle:
    handle = StepHandle(self, cmd, results)
    if not self.use_processes:
      for i, item in items.items():  # run now; wait() only records
        out = _run_item(self._local_envs, self._make, cmd, item)
        self._record(handle, *out)
      return handle
    for w_idx, w in enumerate(self._workers):
      mine = [items[s] for s in w.slots if s in items]
      if not mine:
        continue
      handle.expected[w_idx] = [item[0] for item in mine]
      try:
        w.conn.send((cmd, mine))
      except (OSError, ValueError):
        pass  # dead worker: found and handled in _finish
    self._pending = handle
    return handle

  def _record(self, handle, slot, out, error):
    cmd = handle._cmd  # pylint: disable=protected-access
    self._turn[slot] = 0 if cmd == "reset" else self._turn[slot] + 1
    if error is None:
      error = self._broken_contract(cmd, slot, out)
    if isinstance(error, EnvError):
      handle.fatal = handle.fatal or error
      out = failed_step(str(error))
    elif error is not None:
      self.num_failures += 1
      self.failures.record(error, *(self._task_of[slot] or ()))
      out = failed_step(error)
    if cmd == "reset":
      self._lost[slot] = None
    self._active[slot] = not out.done
    handle._results[slot] = out  # pylint: disable=protected-access

  def _broken_contract(self, cmd, slot, out) -> Optional[EnvError]:
    """``contract.check`` of one result (its ``EnvError`` or None); warns
    once of a reward outside the class's ``reward_range``."""
    task_id, split = self._task_of[slot] or (None, None)
    where = dict(task_id=task_id, split=split, turn=self._turn[slot])
    try:
      contract.check(out, self.env_name, self._env_class.__name__, cmd, **where)
    except EnvError as e:
      return e
    contract.warn_reward_range(
        out, self.env_name, self._env_class, cmd, **where
    )
    return None

  def _finish(self, handle: StepHandle) -> None:
    if not self.use_processes:
      return
    if self._pending is not handle:
      raise RuntimeError("this handle is stale (the VectorEnv was closed)")
    expected = handle.expected
    deadline = {w: handle.sent_at + self.step_timeout_s for w in expected}
    dead: dict[int, str] = {}
    while expected.keys() - dead.keys():
      live = [w for w in expected if w not in dead]
      waitables = {}
      for w in live:
        waitables[self._workers[w].conn] = w
        waitables[self._workers[w].proc.sentinel] = w
      timeout = max(0.0, min(deadline[w] for w in live) - time.monotonic())
      for obj in mp_connection.wait(list(waitables), timeout):
        w = waitables[obj]
        if w in dead or w not in expected:
          continue
        conn = self._workers[w].conn
        try:
          if not conn.poll(0):  # sentinel fired, nothing buffered: dead
            raise EOFError("worker process exited")
          slot, out, error = conn.recv()
        except (EOFError, OSError) as e:
          self._workers[w].proc.join(1.0)  # reap, to read the exit code
          code = self._workers[w].proc.exitcode
          dead[w] = f"worker died (exit code {code}): {e!r}"
          continue
        expected[w].remove(slot)
        self._record(handle, slot, out, error)
        deadline[w] = time.monotonic() + self.step_timeout_s
        if not expected[w]:
          del expected[w]
      now = time.monotonic()
      for w in list(expected):
        if w not in dead and now >= deadline[w]:
          dead[w] = f"no reply within step_timeout_s={self.step_timeout_s}"
    self._pending = None
    self._restart(dead, handle)

  def _restart(self, dead: dict[int, str], handle: StepHandle) -> None:
    """Kills and restarts dead workers; fails the episodes they held."""
    for w, why in dead.items():
      worker = self._workers[w]
      worker.kill()
      error = f"VectorEnv worker {w} failed ({self.env_name}): {why}"
      owed = set(handle.expected.get(w, []))
      for slot in worker.slots:
        if slot in owed:
          self._record(handle, slot, None, error)
        elif self._active[slot]:  # running episode, not asked this time
          self.num_failures += 1
          self._lost[slot] = error
          self._active[slot] = False
      worker.start()
      self.num_restarts += 1
    try:
      for w in dead:
        self._workers[w].wait_ready(self.init_timeout_s)
    except BaseException:
      self.close()  # a worker that cannot restart leaves the pool unusable
      raise
