"""`python -m tpuserve.queued_resource create|delete|probe|describe|converge`: the flex stack's
provisioners.

The name is written into deployed stacks' Terraform (and the README), so it stays; the code is
in tpuserve.gcp.provisioner.
"""

import sys

from tpuserve.gcp.provisioner import main

if __name__ == "__main__":
    sys.exit(main())
