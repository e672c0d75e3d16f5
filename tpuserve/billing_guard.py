"""`python -m tpuserve.billing_guard arm|disarm`: the TPU VM stacks' billing-guard provisioners.

The name is written into deployed stacks' Terraform (and the README), so it stays; the code is
in tpuserve.gcp.billing_guard.
"""

import sys

from tpuserve.gcp.billing_guard import main

if __name__ == "__main__":
    sys.exit(main())
