"""`python -m tpuserve`: the operations CLI (same as the `tpuserve` console script)."""

from tpuserve.cli import main

if __name__ == "__main__":
    main()
