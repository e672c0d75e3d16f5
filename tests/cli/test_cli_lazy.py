"""The CLI registers its commands lazily, for start-up time: `--help` lists every command from
COMMANDS without importing it, and each summary is the opening of the command's own help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli_support import invoke
from tpuserve.cli import COMMANDS, load_command

HEAVY = ("httpx", "aiohttp", "google.cloud", "openai", "matplotlib", "tpuserve.ops.loadgen",
         "tpuserve.cli.status", "tpuserve.review")


def _imported_after(*argv: str) -> set[str]:
    code = (
        "import sys\nfrom tpuserve.cli import app\ntry:\n"
        f"    app({list(argv)!r})\n"
        "except SystemExit:\n    pass\nprint('\\n'.join(sorted(sys.modules)), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return set(done.stderr.split())


def test_help_lists_every_command_and_imports_none() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.stdout
    modules = _imported_after("--help")
    assert not {m for m in modules for h in HEAVY if m == h or m.startswith(h + ".")}


def test_plan_imports_no_network_library() -> None:
    modules = _imported_after("plan", "--json")
    assert "tpuserve.planner.arithmetic" in modules  # it ran
    assert not {m for m in modules
                for h in ("httpx", "aiohttp", "google.cloud", "matplotlib", "rich", "requests")
                if m == h or m.startswith(h + ".")}
    # The default config names no capacity.profiles_dir: no tuned profile to read.
    assert not modules & {"tpuserve.settings.learned_profiles", "tpuserve.planner.tuned"}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_summary_is_the_opening_of_the_command_help(name: str) -> None:
    real = load_command(name)
    assert real.name == name
    assert " ".join((real.help or "").split()).startswith(COMMANDS[name].summary), name


def test_unknown_command_is_a_usage_error() -> None:
    result = invoke("nope")
    assert result.exit_code == 2
    assert "No such command" in result.output + result.stderr
