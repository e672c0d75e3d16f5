"""Progress lines of the programs Terraform runs: one line per state change, or a spinner on a
terminal. A process concern (what the provisioner prints), apart from the Google API layer,
which reports progress through its Progress callback only."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import IO

from tpuserve.gcp.tpu.queued_resources import Progress


class StatePrinter:
    """A Progress callback that prints one line whenever the state changes."""

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self.label = label
        self.stream = stream
        self.last: str | None = None

    def __call__(self, state: str, elapsed: float) -> None:
        if state != self.last:
            self.last = state
            print(f"tpuserve: {self.label}: {state} ({elapsed:.0f} s)",
                  file=self.stream or sys.stderr, flush=True)


@contextlib.contextmanager
def rich_progress(label: str, stream: IO[str] | None = None) -> Iterator[Progress]:
    """A spinner for terminals (rich); one line per state change otherwise (provisioners)."""
    out = stream or sys.stderr
    if not out.isatty():  # Terraform's local-exec, CI, a pipe: plain lines, and no rich import
        yield StatePrinter(label, out)
        return
    from rich.console import Console

    console = Console(file=out)
    with console.status(f"{label}: ...") as status:
        printer = StatePrinter(label, console.file)

        def update(state: str, elapsed: float) -> None:
            if state != printer.last:
                console.log(f"{label}: {state}")
                printer.last = state
            status.update(f"{label}: {state} ({elapsed:.0f} s)")

        yield update
