"""notebooks/rspo_loss.ipynb: stored clean, and runs top to bottom."""

import ast
import json
import math
import os
import sys

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "rspo_loss.ipynb")
PROBE = "RSPO_NOTEBOOK_PROBE"


def read_notebook():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  return nb


def code_cells(nb):
  return [c for c in nb.cells if c.cell_type == "code"]


def test_notebook_is_stored_without_outputs():
  for i, cell in enumerate(code_cells(read_notebook())):
    assert cell.outputs == [], f"code cell {i} has stored outputs"
    assert cell.execution_count is None, f"code cell {i} has a count"


def test_first_code_cell_installs_only_on_colab():
  nb = read_notebook()
  first = code_cells(nb)[0].source
  assert "'google.colab' in sys.modules" in first
  assert "pip" in first
  assert nb.cells[0].cell_type == "markdown"
  for i, cell in enumerate(code_cells(nb)):
    ast.parse(cell.source, filename=f"cell {i}")  # plain Python, no magics


def _python3_kernelspec(directory):
  """A 'python3' kernelspec running this interpreter, first on JUPYTER_PATH,
  so the kernel sees the same venv (jax, rspo_jax deps) as the test."""
  spec_dir = os.path.join(directory, "kernels", "python3")
  os.makedirs(spec_dir)
  with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
    json.dump(
        {
            "argv": [
                sys.executable,
                "-m",
                "ipykernel_launcher",
                "-f",
                "{connection_file}",
            ],
            "display_name": "Python 3 (test)",
            "language": "python",
        },
        f,
    )


@pytest.mark.slow
def test_notebook_executes_and_final_loss_is_finite(tmp_path, monkeypatch):
  pytest.importorskip("ipykernel")
  nbclient = pytest.importorskip("nbclient")
  _python3_kernelspec(str(tmp_path))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  # ipykernel picks the inline backend when none is forced: figures become
  # display_data outputs the test can count.
  monkeypatch.delenv("MPLBACKEND", raising=False)
  nb = read_notebook()
  nb.cells.append(
      nbformat.v4.new_code_cell(
          "import json\n"
          "probe = {'final_loss': float(history['loss'][-1]),\n"
          "         'n_steps': len(history['loss']),\n"
          "         'clip_frac_off': history['clip_frac_off']}\n"
          f"print({PROBE!r}, json.dumps(probe))"
      )
  )
  client = nbclient.NotebookClient(
      nb,
      kernel_name="python3",
      timeout=600,
      allow_errors=False,
      resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}},
  )
  client.execute()  # raises CellExecutionError on any failing cell
  for i, cell in enumerate(code_cells(nb)):
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert not errors, f"cell {i}: {errors}"
  text = "".join(
      o.get("text", "")
      for o in code_cells(nb)[-1].outputs
      if o.output_type == "stream"
  )
  line = next(l for l in text.splitlines() if l.startswith(PROBE))
  probe = json.loads(line[len(PROBE) :])
  assert math.isfinite(probe["final_loss"]), probe
  assert probe["n_steps"] == 20, probe  # N_ITERS * STEPS_PER_ITER
  # The shifted clip binds on some off-policy tokens during the updates.
  assert max(probe["clip_frac_off"]) > 0.0, probe
  figures = sum(
      1
      for c in code_cells(nb)
      for o in c.outputs
      if o.output_type == "display_data" and "image/png" in o.get("data", {})
  )
  assert figures == 2, figures  # the objective curves and the training run


# ------------------------------------------------- notebooks/rspo_loop.ipynb
LOOP_NOTEBOOK = os.path.join(ROOT, "notebooks", "rspo_loop.ipynb")


def read_loop_notebook():
  nb = nbformat.read(LOOP_NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  return nb


def test_loop_notebook_is_stored_without_outputs():
  nb = read_loop_notebook()
  assert nb.cells[0].cell_type == "markdown"
  for i, cell in enumerate(code_cells(nb)):
    assert cell.outputs == [], f"code cell {i} has stored outputs"
    assert cell.execution_count is None, f"code cell {i} has a count"
    ast.parse(cell.source, filename=f"cell {i}")  # plain Python, no magics


def test_loop_notebook_sets_its_repo_url_in_one_place():
  cells = code_cells(read_loop_notebook())
  first = ast.parse(cells[0].source).body
  # The first code cell is the one line a reader edits: REPO_URL = '...'.
  assert len(first) == 1 and isinstance(first[0], ast.Assign), first
  assert [t.id for t in first[0].targets] == ["REPO_URL"]
  assert isinstance(first[0].value, ast.Constant)
  assert first[0].value.value.startswith("https://")
  install = cells[1].source
  assert "REPO_URL" in install and "pip" in install
  assert all("REPO_URL =" not in c.source for c in cells[1:])


def test_loop_notebook_install_is_skipped_in_a_checkout(monkeypatch):
  import subprocess

  def refuse(*args, **kwargs):
    raise AssertionError(f"installed from a checkout: {args}")

  monkeypatch.setattr(subprocess, "check_call", refuse)
  monkeypatch.setattr(sys, "path", list(sys.path))
  monkeypatch.chdir(os.path.dirname(LOOP_NOTEBOOK))
  cells = code_cells(read_loop_notebook())
  scope = {}
  exec(cells[0].source + "\n" + cells[1].source, scope)  # noqa: S102
  assert str(scope["REPO_DIR"]) == ROOT
  assert ROOT in sys.path


@pytest.mark.slow
def test_loop_notebook_executes_and_draws_the_loop(tmp_path, monkeypatch):
  """The whole notebook, as a reader runs it (about 3 minutes on a free
  2-core CPU): both arms train, the figures are drawn, the metrics they
  draw are in the runs' files."""
  pytest.importorskip("ipykernel")
  nbclient = pytest.importorskip("nbclient")
  _python3_kernelspec(str(tmp_path))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("RSPO_LOOP_ROOT", str(tmp_path / "runs"))
  monkeypatch.delenv("MPLBACKEND", raising=False)  # inline: display_data
  nb = read_loop_notebook()
  nb.cells.append(
      nbformat.v4.new_code_cell(
          "import json\n"
          "probe = {name: {\n"
          "    'phases': [r['phase'] for r in run['rows']],\n"
          "    'b_steps': [r['b_step'] for r in phase(run['rows'], 'B')],\n"
          "    'lift': [[r['b_lift_success'], r['b_lift_dense_return']]\n"
          "             for r in phase(run['rows'], 'B_collect')],\n"
          "    'held_out': {str(s): e['success_rate']\n"
          "                 for s, e in run['held_out'].items()}}\n"
          "    for name, run in runs.items()}\n"
          f"print({PROBE!r}, json.dumps(probe))"
      )
  )
  # A cell's limit: an arm's cell takes about a minute on a free 2-core
  # machine; a loaded one may need more (RSPO_NOTEBOOK_CELL_TIMEOUT_S).
  timeout = int(os.environ.get("RSPO_NOTEBOOK_CELL_TIMEOUT_S", "900"))
  client = nbclient.NotebookClient(
      nb,
      kernel_name="python3",
      timeout=timeout,
      allow_errors=False,
      resources={"metadata": {"path": os.path.dirname(LOOP_NOTEBOOK)}},
  )
  client.execute()  # raises CellExecutionError on any failing cell
  text = "".join(
      o.get("text", "")
      for o in code_cells(nb)[-1].outputs
      if o.output_type == "stream"
  )
  line = next(l for l in text.splitlines() if l.startswith(PROBE))
  probe = json.loads(line[len(PROBE) :])
  grpo, rspo = probe["GRPO"], probe["RSPO+GRPO"]
  assert grpo["phases"].count("A") == rspo["phases"].count("A") == 12
  assert "B" not in grpo["phases"] and "B_collect" not in grpo["phases"]
  assert rspo["b_steps"] == list(range(1, 13))  # 4 loops x k = 3
  assert len(rspo["lift"]) == 4
  assert all(math.isfinite(v) for pair in rspo["lift"] for v in pair)
  start = grpo["held_out"]["0"]
  for name, run in probe.items():  # the toy study: every seed rises by 12
    assert run["held_out"]["12"] > start, (name, run["held_out"])
  figures = sum(
      1
      for c in code_cells(nb)
      for o in c.outputs
      if o.output_type == "display_data" and "image/png" in o.get("data", {})
  )
  assert figures == 2, figures  # A's success; B's dense reward and lift
