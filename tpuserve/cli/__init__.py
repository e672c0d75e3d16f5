"""The `tpuserve` operations CLI: one typer app; each command lives in its own module, imported
only when that command runs.

Adding a command is one line: put a module here with `register(app: typer.Typer)` and add it
to COMMANDS with the opening words of its docstring (tests/cli/test_cli_lazy.py checks they match).

Start-up time is part of the interface (bench/cli: `tpuserve --help` within 1.4x of a minimal
two-command typer app's): `--help` lists COMMANDS without importing them, and a command imports
only what it uses (httpx, aiohttp, the TPU client, matplotlib stay out of `plan`).

Exit codes (tpuserve.ops.errors): 0 ok, 1 failed, 2 bad usage or configuration, 3 `wait`
timed out, 130 interrupted.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, NamedTuple

# pydantic looks for plugins by scanning every installed distribution's entry points the first
# time a model is built: ~25 ms of `plan`'s start-up, for plugins this CLI never uses.
# A user who wants one sets PYDANTIC_DISABLE_PLUGINS themselves; setdefault keeps their value.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from tpuserve.cli import plugin_loader

plugin_loader.install()  # ... nor imports the loader that would find none (plugin_loader.py)

import typer  # noqa: E402
from typer.core import TyperCommand, TyperGroup  # noqa: E402

if TYPE_CHECKING:
    # typer runs on its own copy of click (typer._click): importing the click package as well
    # would load a second one on every start that nothing here runs on.
    from typer._click import Command, Context


class _Entry(NamedTuple):
    module: str
    summary: str  # the opening words of the command's docstring, for --help


COMMANDS: dict[str, _Entry] = {
    "status": _Entry("status", "Node (and queued resource) state, health, endpoint, boot phases, "
                     "time running, money spent and time left, for each deployed stack."),
    "wait": _Entry("wait", "Wait for queued resource ACTIVE (flex) -> node READY -> boot "
                   "phases -> /health, then print the endpoint."),
    "endpoint": _Entry("endpoint", "The server's base URL (the external IP changes with every "
                       "new node: never hard-code it), its TLS certificate"),
    "smoke": _Entry("smoke", "Health, a chat completion, a get_weather tool call, an image, a "
                    "prompt near max_model_len, and (with the API-key proxy) refusals without "
                    "the key."),
    "bench": _Entry("bench", "Aggregate output tok/s, median and p90 TTFT, per-stream tok/s, "
                    "TPOT and their cv across repetitions, per context x clients; $/M output "
                    "tokens per provisioning model."),
    "rotate-key": _Entry("rotate_key", "Add a new version of the stack's API-key secret "
                         "(Secret Manager) and wait until the node's proxy reports it"),
    "recover": _Entry("recover", "Delete what is dead and re-run `npx cdktf deploy STACK "
                      "--auto-approve`"),
    "plan": _Entry("plan", "HBM budget, KV cache, blocks, KV wall, decode floor and $/M output "
                   "tokens (SPEC 5-7)."),
    "prices": _Entry("prices", "Cloud TPU prices per region and provisioning model, each "
                     "with its source: `refresh` reads today's from the Cloud Billing Catalog "
                     "API"),
    "review": _Entry("review", "Synthesize BASE and HEAD offline and report, per stack, the "
                     "Terraform resources added, removed and changed"),
    "tune": _Entry("tune", "Search the stack's serving flags on its own node"),
}


def load_command(name: str) -> Command:
    """Import one command's module and build its click command (what running it needs)."""
    sub = typer.Typer(add_completion=False, rich_markup_mode="markdown")
    importlib.import_module(f"{__name__}.{COMMANDS[name].module}").register(sub)
    command = typer.main.get_command(sub)
    command.name = name
    return command


class LazyGroup(TyperGroup):
    """Lists COMMANDS from their summaries; imports a command only to run it (or show its
    own --help)."""

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        entry = COMMANDS.get(cmd_name)
        # The listing in --help: a stand-in that carries the summary and never runs.
        return None if entry is None else TyperCommand(cmd_name, help=entry.summary)

    def resolve_command(
        self, ctx: Context, args: list[str]
    ) -> tuple[str | None, Command | None, list[str]]:
        if args and args[0] in COMMANDS and args[0] not in self.commands:
            self.commands[args[0]] = load_command(args[0])
        return super().resolve_command(ctx, args)


app = typer.Typer(
    name="tpuserve",
    cls=LazyGroup,
    help="Operate Gemma 4 E2B on Cloud TPU v5e: status, wait, endpoint, smoke, bench, recover.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # errors are one line (tpuserve.cli.common.command)
    rich_markup_mode="markdown",
)


@app.callback()
def _root() -> None:
    """Makes the app a group even though no command is registered until it runs."""


def main() -> None:
    app()
