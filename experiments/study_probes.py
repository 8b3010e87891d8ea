r"""Why WebShop GRPO does not move: one table over diagnostic runs.

  python experiments/study_probes.py runs/study/webshop_grpo_baseline_s0 \
      runs/probe/*                       # markdown table on stdout

Each argument is a launch/train.py workdir (``command.txt`` holds the
command that made it, when it was not made by experiments/reproduce.py). Per
run, from ``metrics.jsonl``'s 'A' rows (A's training steps):

  steps        A steps finished (a probe stopped early has fewer),
  KL step 1    approx_kl (losses._approx_kl; mean over the step's
               updates; runs before 85b7707 logged a heavier-tailed
               form) of the first step: Adam's first update,
               m / sqrt(v) = sign(g), moves every weight by lr,
  KL later     mean approx_kl over steps 2.. (how far the policy moves a
               step once Adam's moments average the gradients),
  entropy      A's mean token entropy, first -> last step,
  signal       mean share of fresh rows with a non-zero advantage
               (adv_nonzero_frac_on; '-' where the run predates it),
  rollouts     A's rollout success, mean of the first 5 -> last 5 steps;

and, where the run finished, greedy success on the held-out goals at the
start and the end with the paired difference and its 95 % bootstrap
interval over goals (rspo_jax/intervals.py), and

  won / lost   goals (x sampling seeds) won at the end but not at the
               start / at the start but not at the end: how far greedy
               behaviour moved, whatever the net change.

A second table pools the training seeds of one setting (workdirs whose
names differ only in a trailing ``_s<seed>``) for each decoding whose
files every seed's workdir holds: greedy (``eval_start.json``,
``eval_final.json``), T = 0.4 and T = 1.0 (``eval_{start,final}_t04.json``,
``_t10.json``, 3 sampling seeds each); final success over seeds x goals x
sampling seeds and the paired final - start, 95 % bootstrap intervals
(training seeds resampled, goals shared with the start). A third compares
settings: per decoding, each later setting's final success minus the first
setting's (rspo_jax/intervals.method_difference: training seeds resampled
within each, goals shared), e.g. the sampling ablation:

  python experiments/study_probes.py \
      docs/results/archive/study_allrows/webshop_gigpo_rspo_s0 \
      docs/results/archive/study_allrows/webshop_gigpo_sample_variance_s0 \
      docs/results/archive/study_allrows/webshop_gigpo_baseline_s0
"""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np

from rspo_jax import intervals
from rspo_jax.metrics import has_metrics, metrics_path, read_metrics


def _eval(path: str):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def summarize(workdir: str) -> dict:
  """One row of the table (module docstring) for a run's workdir."""
  rows = read_metrics(metrics_path(workdir), "A")
  by_step = {r["step"]: r for r in rows}  # a redone step: its last row
  a = [by_step[s] for s in sorted(by_step)]
  get = lambda key: np.array([r.get(key, np.nan) for r in a], float)
  kl, success = get("approx_kl"), get("rollout_success_rate")
  signal = get("adv_nonzero_frac_on")
  out = {
      "run": "/".join(os.path.normpath(workdir).split(os.sep)[-2:]),
      "steps": len(a),
      "kl_first": float(kl[0]) if len(a) else np.nan,
      "kl_later": float(np.nanmean(kl[1:])) if len(a) > 1 else np.nan,
      "entropy": (float(get("entropy")[0]), float(get("entropy")[-1]))
      if len(a)
      else (np.nan, np.nan),
      "signal": float(np.nanmean(signal))
      if np.isfinite(signal).any()
      else None,
      "rollouts": (float(np.mean(success[:5])), float(np.mean(success[-5:])))
      if len(a)
      else (np.nan, np.nan),
  }
  start = _eval(os.path.join(workdir, "eval_start.json"))
  final = _eval(os.path.join(workdir, "eval_final.json"))
  if start and final and "per_task" in start and "per_task" in final:
    x0 = intervals.outcome_matrix(start["per_task"])
    x1 = intervals.outcome_matrix(final["per_task"])
    out["start"] = 100 * float(x0.mean())
    out["final"] = 100 * float(x1.mean())
    out["diff"] = intervals.paired_difference(x1, x0)
    out["won"] = int(((x1 > 0) & (x0 == 0)).sum())
    out["lost"] = int(((x0 > 0) & (x1 == 0)).sum())
  return out


def _cell(x, fmt="{:.3f}") -> str:
  return "-" if x is None or not np.isfinite(x) else fmt.format(x)


def markdown(summaries: list[dict]) -> str:
  lines = [
      "| run | steps | KL step 1 | KL later | entropy | signal | rollouts |"
      " greedy start -> final | final - start [95 %] | won / lost |",
      "|---|---:|---:|---:|---|---:|---|---|---|---|",
  ]
  for s in summaries:
    e0, e1 = s["entropy"]
    r0, r1 = s["rollouts"]
    if "diff" in s:
      d = s["diff"]
      ends = f"{s['start']:.1f} -> {s['final']:.1f}"
      diff = (
          f"{100 * d['mean']:+.1f} [{100 * d['lo']:+.1f},"
          f" {100 * d['hi']:+.1f}]"
      )
      moved = f"{s['won']} / {s['lost']}"
    else:
      ends, diff, moved = "stopped", "-", "-"
    lines.append(
        f"| {s['run']} | {s['steps']} | {_cell(s['kl_first'])} |"
        f" {_cell(s['kl_later'], '{:.4f}')} | {e0:.3f} -> {e1:.3f} |"
        f" {_cell(s['signal'], '{:.2f}')} | {r0:.2f} -> {r1:.2f} |"
        f" {ends} | {diff} | {moved} |"
    )
  return "\n".join(lines) + "\n"


DECODINGS = (("greedy", ""), ("T = 0.4", "_t04"), ("T = 1.0", "_t10"))


def setting(workdir: str) -> str:
  """A run's name without its training seed: 'probe/x_s200' -> 'probe/x'."""
  name = "/".join(os.path.normpath(workdir).split(os.sep)[-2:])
  return re.sub(r"_s\d+$", "", name)


def _by_setting(workdirs: list[str]) -> dict[str, list[str]]:
  groups: dict[str, list[str]] = {}
  for d in workdirs:
    groups.setdefault(setting(d), []).append(d)
  return groups


def _finals(dirs: list[str], tag: str) -> np.ndarray | None:
  """Final outcomes [training seeds, goals, sampling seeds] of one
  setting at one decoding; None unless every workdir holds its file."""
  paths = [os.path.join(d, f"eval_final{tag}.json") for d in dirs]
  if not all(os.path.exists(p) for p in paths):
    return None
  return np.stack(
      [intervals.outcome_matrix(_eval(p)["per_task"]) for p in paths]
  )


def pooled(workdirs: list[str]) -> list[dict]:
  """Per setting and decoding (module docstring): {'setting', 'seeds',
  'decoding', 'start', 'final' (success intervals), 'diff'}."""
  out = []
  for name, dirs in _by_setting(workdirs).items():
    for decoding, tag in DECODINGS:
      x1 = _finals(dirs, tag)
      start = os.path.join(dirs[0], f"eval_start{tag}.json")
      if x1 is None or not os.path.exists(start):
        continue
      x0 = intervals.outcome_matrix(_eval(start)["per_task"])
      out.append(
          {
              "setting": name,
              "seeds": len(dirs),
              "decoding": decoding,
              "start": intervals.success_interval(x0),
              "final": intervals.success_interval(x1),
              "diff": intervals.paired_difference(x1, x0),
          }
      )
  return out


def versus_first(workdirs: list[str]) -> list[dict]:
  """Per decoding, each later setting against the first (module
  docstring): {'setting', 'versus', 'decoding', 'diff'}; a decoding is
  compared where both settings' workdirs hold its final evaluation."""
  (first, ref_dirs), *others = _by_setting(workdirs).items()
  out = []
  for decoding, tag in DECODINGS:
    ref = _finals(ref_dirs, tag)
    for name, dirs in others:
      x = _finals(dirs, tag)
      if ref is not None and x is not None:
        out.append(
            {
                "setting": name,
                "versus": first,
                "decoding": decoding,
                "diff": intervals.method_difference(x, ref),
            }
        )
  return out


def versus_markdown(rows: list[dict]) -> str:
  lines = [
      "| setting | minus | decoding | final - final [95 %] |",
      "|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
        f"| {r['setting']} | {r['versus']} | {r['decoding']} |"
        f" {_pct(r['diff'], '+')} |"
    )
  return "\n".join(lines) + "\n"


def _pct(i: dict, sign: str = "") -> str:
  f = f"{{:{sign}.1f}}"
  return (
      f"{f.format(100 * i['mean'])} [{f.format(100 * i['lo'])},"
      f" {f.format(100 * i['hi'])}]"
  )


def pooled_markdown(rows: list[dict]) -> str:
  lines = [
      "| setting | seeds | decoding | start | final |"
      " final - start [95 %] |",
      "|---|---:|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
        f"| {r['setting']} | {r['seeds']} | {r['decoding']} |"
        f" {_pct(r['start'])} | {_pct(r['final'])} |"
        f" {_pct(r['diff'], '+')} |"
    )
  return "\n".join(lines) + "\n"


def rspo_summary(workdir: str) -> dict | None:
  """One row of the RSPO table (module docstring); None for a baseline."""
  path = metrics_path(workdir)  # gzipped in the archive
  collect = read_metrics(path, "B_collect")
  if not collect:
    return None
  a = read_metrics(path, "A")
  replaying = [r for r in a if r.get("n_rows_off", 0) > 0]
  mean = (
      lambda rows, key: float(np.nanmean([r.get(key, np.nan) for r in rows]))
      if rows
      else np.nan
  )
  ratio = [r["ratio_mean_off"] for r in replaying if "ratio_mean_off" in r]
  return {
      "run": "/".join(os.path.normpath(workdir).split(os.sep)[-2:]),
      "b_collect": mean(collect, "rollout_success_rate"),
      "a_own": mean(a, "rollout_success_rate"),
      "replaying": len(replaying),
      "replay_success": mean(replaying, "replay_success_frac"),
      "replay_signal": mean(replaying, "replay_nonzero_adv_frac"),
      "ratio": (min(ratio), max(ratio)) if ratio else (np.nan, np.nan),
      "clip_off": mean(replaying, "clip_frac_off"),
  }


def rspo_markdown(rows: list[dict]) -> str:
  lines = [
      "| run | B collect | A own | replaying A steps | replayed won |"
      " replayed signal | ratio off min / max | clip off |",
      "|---|---:|---:|---:|---:|---:|---|---:|",
  ]
  for r in rows:
    lines.append(
        f"| {r['run']} | {_cell(r['b_collect'], '{:.3f}')} |"
        f" {_cell(r['a_own'], '{:.3f}')} | {r['replaying']} |"
        f" {_cell(r['replay_success'], '{:.2f}')} |"
        f" {_cell(r['replay_signal'], '{:.2f}')} |"
        f" {_cell(r['ratio'][0])} / {_cell(r['ratio'][1])} |"
        f" {_cell(r['clip_off'], '{:.4f}')} |"
    )
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
  if not argv or argv[0] in ("-h", "--help"):
    print(__doc__)
    return 0 if argv else 2
  dirs = [d for d in argv if has_metrics(d)]
  print(markdown([summarize(d) for d in dirs]), end="")
  rows = pooled(dirs)
  if rows:
    print("\n" + pooled_markdown(rows), end="")
  versus = versus_first(dirs) if dirs else []
  if versus:
    print("\n" + versus_markdown(versus), end="")
  rspo = [r for r in map(rspo_summary, dirs) if r is not None]
  if rspo:
    print("\n" + rspo_markdown(rspo), end="")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
