"""One error type for everything the operations CLI reports: one line, what happened and what to do.

Exit codes are part of the CLI's contract (scripts branch on them). Below every layer (standard
library only), so the API clients that raise it (the Kubernetes client beside the Google edge,
tpuserve.gcp.kube) import nothing above them; tpuserve.ops.errors is its name for the CLI.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # a check failed, a state is bad, an API call failed
EXIT_USAGE = 2  # bad arguments or configuration (typer uses 2 as well)
EXIT_TIMEOUT = 3  # `wait` ran out of time
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


class OpsError(Exception):
    """A failure the user can act on. `str()` is the whole one-line report."""

    def __init__(self, message: str, *, hint: str = "", exit_code: int = EXIT_FAILED) -> None:
        self.message = " ".join(message.split())  # one line, whatever the source said
        self.hint = " ".join(hint.split())
        self.exit_code = exit_code
        super().__init__(self.line)

    @property
    def line(self) -> str:
        return f"{self.message} -> {self.hint}" if self.hint else self.message


def one_line(text: object, limit: int = 300) -> str:
    """Collapse whitespace and cut long server answers so an error stays one readable line."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
