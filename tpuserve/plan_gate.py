"""`python -m tpuserve.plan_gate BASE_OUT PR_OUT GATED_OUT REPORTS`: the plan gate.

The plan-review workflow runs it by this name, so the name stays; the code is in
tpuserve.review.gate (stdlib only: it runs in the job that holds the plan credential).
"""

import sys

from tpuserve.review.gate import main

if __name__ == "__main__":
    sys.exit(main())
