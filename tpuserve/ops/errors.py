"""The operations CLI's error type and exit codes (defined in tpuserve.ops_error, below the API
clients that raise it too)."""

from tpuserve.ops_error import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    OpsError,
    one_line,
)

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TIMEOUT", "EXIT_USAGE",
           "OpsError", "one_line"]
