"""The stand-in for pydantic's plugin loader (tpuserve/cli/plugin_loader.py): with plugins off,
pydantic builds validators without importing its loader (nor importlib.metadata); with them
on, the real loader answers. Each case runs in a fresh interpreter: whether the stand-in is
in place depends on what the process imported first."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tpuserve.cli.plugin_loader import LOADER, OFF, SWITCH


def _run(code: str, switch: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != SWITCH}
    if switch is not None:
        env[SWITCH] = switch
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


@pytest.mark.parametrize("switch", OFF)
def test_off_builds_validators_without_the_loader(switch: str) -> None:
    _run(f"""
import sys
from tpuserve.cli import plugin_loader
plugin_loader.install()
from pydantic import BaseModel, TypeAdapter
class M(BaseModel):
    x: int
assert M(x=1).x == 1 and TypeAdapter(int).validate_python(2) == 2
from pydantic.plugin._loader import get_plugins
assert tuple(get_plugins()) == ()
assert sys.modules[{LOADER!r}]._tpuserve_standin
assert "importlib.metadata" not in sys.modules
""", switch)


def test_cli_plan_imports_no_entry_point_reader() -> None:
    _run("""
import sys
from tpuserve.cli import app
try:
    app(["plan", "--json"])
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
assert "importlib.metadata" not in sys.modules, "pydantic's plugin loader was imported"
""", None)  # unset: the CLI turns plugins off itself


@pytest.mark.parametrize("switch", ["", "some-plugin"])
def test_on_is_pydantics_own_loader(switch: str) -> None:
    # Set by the user to anything but off: no stand-in, pydantic's loader reads entry points.
    _run(f"""
import sys
from tpuserve.cli import app
from pydantic import TypeAdapter
TypeAdapter(int)
loader = sys.modules[{LOADER!r}]
assert not hasattr(loader, "_tpuserve_standin")
assert loader.PYDANTIC_ENTRY_POINT_GROUP == "pydantic"
""", switch)


def test_turned_on_later_the_real_loader_takes_over() -> None:
    _run(f"""
import os, sys
from tpuserve.cli import plugin_loader
plugin_loader.install()
from pydantic import TypeAdapter
TypeAdapter(int)
assert sys.modules[{LOADER!r}]._tpuserve_standin
os.environ[{SWITCH!r}] = "some-plugin"
from pydantic.plugin._loader import get_plugins
found = list(get_plugins())
real = sys.modules[{LOADER!r}]
assert not hasattr(real, "_tpuserve_standin") and "importlib.metadata" in sys.modules
assert found == list(real.get_plugins())
assert TypeAdapter(str).validate_python("a") == "a"
""", "__all__")
