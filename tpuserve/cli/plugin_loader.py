"""pydantic's plugin loader, imported only if plugins are on.

The CLI turns pydantic's plugins off (PYDANTIC_DISABLE_PLUGINS, tpuserve/cli/__init__.py), and
pydantic's loader then finds none without reading a single entry point. Yet pydantic imports
that module (pydantic/plugin/_loader.py) the first time it builds a validator, and the module
imports importlib.metadata (email, zipfile, csv and more) at its top: measured ~15 ms of every
`plan` start on the 2-core dev VM, for a scan that never runs.

`install` puts a stand-in under the loader's name before pydantic imports it. Its
`get_plugins` answers as pydantic's does while the variable says off (the same three values);
when it says on, and for any other name asked of it, the real loader is imported in its place
and answers. Nothing else of pydantic changes.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Iterable
from typing import Any

LOADER = "pydantic.plugin._loader"
SWITCH = "PYDANTIC_DISABLE_PLUGINS"
OFF = ("__all__", "1", "true")  # pydantic's own test of the variable (_loader.get_plugins)


def _real() -> types.ModuleType:
    """The real loader, in the stand-in's place from now on."""
    if getattr(sys.modules.get(LOADER), "_tpuserve_standin", False):
        del sys.modules[LOADER]
    return importlib.import_module(LOADER)


def _get_plugins() -> Iterable[Any]:
    if os.environ.get(SWITCH) in OFF:
        return ()
    return _real().get_plugins()  # type: ignore[no-any-return]


def _getattr(name: str) -> Any:
    if name.startswith("__") and name.endswith("__"):  # the import system's questions
        raise AttributeError(f"module {LOADER!r} has no attribute {name!r}")
    return getattr(_real(), name)


def install() -> None:
    """The stand-in, where plugins are off and pydantic has not imported its loader yet."""
    if os.environ.get(SWITCH) not in OFF or LOADER in sys.modules:
        return
    standin = types.ModuleType(LOADER, __doc__)
    standin.__dict__.update(get_plugins=_get_plugins, __getattr__=_getattr,
                            _tpuserve_standin=True)
    sys.modules[LOADER] = standin
