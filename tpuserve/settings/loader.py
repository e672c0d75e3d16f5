"""Every rule at once: the settings' own validators, then the planner's capacity rules.

config.py validates settings; capacity.py applies the planner to a validated Deployment. This
module runs both and reports every problem together, which is what synth (main.py) and the
CLI's `plan` need. Data flows one way: config -> capacity -> checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuserve.settings.capacity import capacity_problems, capacity_warnings
from tpuserve.settings.models import (
    ConfigError,
    Deployment,
    deployment_warnings,
    load_raw,
    merge_stacks,
    validate,
)


def checked_deployments(environ: Mapping[str, str] | None = None) -> dict[str, Deployment]:
    """Load, validate and capacity-check every stack; raise ConfigError with every problem."""
    return check_raw(load_raw(environ=environ))


def check_raw(raw: Mapping[str, Any]) -> dict[str, Deployment]:
    """Validate and capacity-check a raw config; raise ConfigError with every problem."""
    deployments, problems = validate(raw)
    for name, d in deployments.items():
        problems.extend(f"[{name}] {p}" for p in capacity_problems(d))
    if problems:
        raise ConfigError(merge_stacks(problems))
    return deployments


def all_warnings(d: Deployment) -> list[str]:
    return deployment_warnings(d) + capacity_warnings(d)
