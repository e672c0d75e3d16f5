"""`python -m tpuserve.base_check preflight|teardown`: the checks Terraform runs around a
deployment's base stack (a serving stack's plan-time preflight, the base's destroy guard).

The name is written into deployed stacks' Terraform, so it stays; the code is in
tpuserve.gcp.base_check.
"""

import sys

from tpuserve.gcp.base_check import main

if __name__ == "__main__":
    sys.exit(main())
