"""`python -m tpuserve.kubectl apply|delete`: the fleet stack's provisioners.

The name is written into deployed stacks' Terraform, so it stays; the code is in
tpuserve.gcp.kubectl.
"""

import sys

from tpuserve.gcp.kubectl import main

if __name__ == "__main__":
    sys.exit(main())
