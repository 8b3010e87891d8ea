"""experiments/prm_quality.py's report: what it keeps and what it draws."""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import prm_quality  # noqa: E402

RECORD = os.path.join(ROOT, "docs", "results", "prm_webshop.json")


def test_report_keeps_a_start_it_has_no_pieces_for_and_draws_figure3(
    tmp_path,
):
  """runs/ is not committed: a later session that ran only the default
  start must not drop the sparse start's record. The record's sparse
  entry comes back unchanged, the default start's piece is added, and
  the PRM-alone run's Figure-3 plot is written beside the JSON."""
  out = tmp_path / "prm_webshop.json"
  recorded = json.load(open(RECORD))
  out.write_text(json.dumps(recorded))
  (tmp_path / "runs" / "default").mkdir(parents=True)
  piece = {"held_out": {"r2": 0.1}}
  (tmp_path / "runs" / "default" / "quality.json").write_text(json.dumps(piece))
  prm_quality.report(str(tmp_path / "runs"), str(out))
  got = json.load(open(out))
  assert got["sparse"] == recorded["sparse"]
  assert got["default"] == {"quality": piece}
  png = tmp_path / "prm_webshop_figure3.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
