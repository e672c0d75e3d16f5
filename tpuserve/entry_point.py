"""The skeleton every `python -m tpuserve.X` program Terraform runs shares: its failures are one
line on stderr with the exit code the contract names, never a traceback (Terraform shows a
provisioner's stderr as it is).

    0    done
    1    a check refused, an API failed, an answer proved nothing
    2    bad input (arguments, environment, stdin)
    130  interrupted

Each program says which of its exceptions are bad input and which are failures, and what
prefixes a failure's line; `run` maps them. Standard library only: the provisioners import it
on every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Errors = tuple[type[BaseException], ...]


def notes(exc: BaseException) -> str:
    """What was added to EXC on its way up (what a failure left behind), '; '-joined."""
    return "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))


def run(body: Callable[[], int], err: IO[str], *, usage: Errors = (), failed: Errors = (),
        prefix: str = "", exit_code: Callable[[BaseException], int] | None = None,
        interrupt: bool = True, unexpected: str | None = None) -> int:
    """BODY's exit code; its USAGE exceptions: 'tpuserve: <exc>', 2; its FAILED ones:
    'tpuserve: <prefix><exc>', 1 (or EXIT_CODE(exc)); Ctrl-C (INTERRUPT): 'tpuserve:
    interrupted', 130. UNEXPECTED (a prefix) turns any other exception into one line and 1;
    None lets it through."""
    def say(line: str) -> None:
        print(line, file=err, flush=True)

    try:
        return body()
    except usage as exc:
        say(f"tpuserve: {exc}{notes(exc)}")
        return EXIT_USAGE
    except failed as exc:
        say(f"tpuserve: {prefix}{exc}{notes(exc)}")
        return exit_code(exc) if exit_code is not None else EXIT_FAILED
    except KeyboardInterrupt as exc:
        if not interrupt:
            raise
        say(f"tpuserve: interrupted{notes(exc)}")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if unexpected is None:
            raise
        detail = " ".join(str(exc).split())[:300]
        say(f"tpuserve: {unexpected}: unexpected {type(exc).__name__}: {detail}")
        return EXIT_FAILED
