"""Settings: the config's pydantic models, THE loader, and the flag, capacity and string rules.

The names most code needs are here; the rest live in the module named for them.
"""

from tpuserve.settings.base import STACK_NAMES, ConfigError
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.loader import Loaded, from_raw, load, load_raw

__all__ = ["STACK_NAMES", "ConfigError", "Deployment", "Loaded", "from_raw", "load", "load_raw"]
