"""Operations logic behind the CLI: node status, waiting, smoke checks, benchmark, recovery.

Nothing here prints or exits: the CLI (tpuserve.cli) renders what these modules return.
"""
