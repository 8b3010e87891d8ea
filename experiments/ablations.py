r"""The paper's ablations (WebShop GRPO): the runs and their report.

  python experiments/ablations.py [--seeds 0] [--parallel 2] [--report_only]
  # the same as: python experiments/reproduce.py --grid ablations ...

Variants (workdir ``<root>/webshop_grpo_<variant>_s<seed>``; ``rspo`` and
``baseline`` are the main grid's runs, shared, not rerun; the grid is
``grid.ablation_grid``):

  rspo             full RSPO: reward-based replay sampling, B's data
  sample_variance  rspo.sampling=variance
  sample_random    rspo.sampling=random
  rspo_h           rspo.data_source=history  (RSPO_H: A's own past groups)
  rspo_o           rspo.data_source=outcome  (RSPO_O: B on outcome reward)
  dense_only       one policy on the dense reward alone (reward hacking)
  baseline         rspo=0 (plain GRPO: the repeated-state reference)

Report in ``--out`` (experiments/report/ablations.py): ``ablations.{json,md}``
(another env/algo than WebShop GRPO: ``ablations_<env>_<algo>.*``), one
row per (group, setting): success rate and score (%) after training, mean
+- std (ddof 0) over the finished seeds, n, the paper's success rate, and
the repeated-state count -- per run the mean of
``rollout_repeated_states`` over A's training steps, then mean +- std over
seeds. ``ablations_dense_only.png``: the dense-only run's
``dense_reward_mean`` (left axis) and ``rollout_success_rate`` (right
axis) by A step, mean +- std over seeds; hacking shows as the first rising
while the second falls.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import reproduce


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  return reproduce.main(["--grid", "ablations", *argv])


if __name__ == "__main__":
  sys.exit(main())
