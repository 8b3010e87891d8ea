"""``launch/train.py ... --dry_run | python -m rspo_jax.plan``: the dry
run's plan (JSON on stdin) as its memory table (``report.table``)."""

import json
import sys

from rspo_jax.plan.report import table

if __name__ == "__main__":
  print(table(json.load(sys.stdin)))
