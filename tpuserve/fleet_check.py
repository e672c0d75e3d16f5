"""`python -m tpuserve.fleet_check preflight`: the fleet stack's plan-time check of quota, GKE
versions and enabled APIs. The name is written into the fleet stack's Terraform, so it stays;
the code is in tpuserve.gcp.fleet_check.
"""

import sys

from tpuserve.gcp.fleet_check import main

if __name__ == "__main__":
    sys.exit(main())
