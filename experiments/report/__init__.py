"""The studies' reports: tables (JSON and markdown) and curves from the
finished runs under a root or in the archive (experiments/run_archive.py).

One entry per kind of study; experiments/reproduce.py calls them after
its grid:

  env_report       --grid main: the paper's table per environment,
                   ``<env>.{json,md}`` (report/main_table.py);
  ablation_report  --grid ablations: ``ablations.{json,md}`` and the
                   dense-only plot (report/ablations.py);
  study_report     --grid study: the CPU study, ``study_<env>.{json,md}``
                   with bootstrap intervals (report/study.py);
  spell_report     --grid spell and --grid sparse: ``study_spell_<world>``
                   and ``study_<root's name>`` (report/spell.py).

What they share -- per-cell numbers over seeds, the outcome matrices and
their intervals, the table cells' text, atomic plots -- is
report/common.py.
"""

from report.ablations import ablation_report
from report.common import nested_interval
from report.main_table import env_report
from report.spell import spell_report
from report.study import study_report

__all__ = [
    "ablation_report",
    "env_report",
    "nested_interval",
    "spell_report",
    "study_report",
]
