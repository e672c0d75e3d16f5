"""The `tpuserve` operations CLI: one typer app; each command group lives in its own module.

Adding a command group is one line: put a module here with `register(app: typer.Typer)` and
add its name to COMMAND_MODULES.

Exit codes (tpuserve.ops.errors): 0 ok, 1 failed, 2 bad usage or configuration, 3 `wait`
timed out, 130 interrupted.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="tpuserve",
    help="Operate Gemma 4 E2B on Cloud TPU v5e: status, wait, endpoint, smoke, bench, recover.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # errors are one line (tpuserve.cli.common.command)
    rich_markup_mode="markdown",
)

COMMAND_MODULES = ("status", "wait", "endpoint", "smoke", "bench", "recover", "plan", "review")

for _name in COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_name}").register(app)


def main() -> None:
    app()
