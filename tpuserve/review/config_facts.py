"""A revision's config/ read by the CURRENT code: argv, env, compile-cache key, plan, warnings.

The package's one door into tpuserve.settings: every other module of tpuserve.review asks
here (config_facts, flag_rule, MODEL_ARG), so a change of the settings API is adapted here.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuserve.contracts import CONFIG_ENV, PROJECT_ENV, ZONE_ENV
from tpuserve.planner.arithmetic import Plan
from tpuserve.render.boot_script import vllm_command
from tpuserve.render.vllm_args import compile_cache_key, container_env, served_config_sha256
from tpuserve.settings import ConfigError, flag_rules, from_raw, load_raw
from tpuserve.settings.capacity import plan_for
from tpuserve.settings.derived_labels import derived_figures, flag_rule_labels, weights_label
from tpuserve.settings.loader import all_warnings

# Re-exported for effects.py: the review reaches tpuserve.settings through this module only.
from tpuserve.settings.pair_sources import BOOT_TIMES_KEY as BOOT_TIMES_KEY
from tpuserve.settings.sections import CapacitySettings

from .revision_facts import ConfigFacts, StackFacts

# The key argv_options gives the positional model argument of `vllm serve`.
MODEL_ARG: str = flag_rules.MODEL_ARG


def flag_rule(name: str) -> flag_rules.FlagRule | None:
    """The measured rule behind a `vllm serve` option or container variable, if any."""
    return flag_rules.rule_for(name)


def config_facts(project: Path, environ: Mapping[str, str] | None = None) -> ConfigFacts:
    """Load a revision's config/ with the CURRENT code; problems instead of exceptions."""
    path = project / "config" / "default.toml"
    try:
        raw = _revision_geometry(load_raw(path, environ=environ or {}), project / "config")
        deployments = from_raw(raw).deployments
    except ConfigError as exc:
        return ConfigFacts({}, tuple(exc.problems))
    except (OSError, tomllib.TOMLDecodeError, ValueError) as exc:
        return ConfigFacts({}, (f"{path.relative_to(project)}: {exc}",))
    stacks: dict[str, StackFacts] = {}
    for name, d in deployments.items():
        argv = vllm_command(d)
        plan: Plan | None = None
        error: str | None = None
        try:
            plan = plan_for(d)
        except (OSError, ValueError) as exc:
            error = str(exc)
        stacks[name] = StackFacts(
            name=name,
            provisioning_model=d.stack.provisioning_model,
            image=d.vllm.image,
            argv=tuple(argv),
            env=container_env(d.vllm),
            cache_key=compile_cache_key(d, argv),
            cache_enabled=d.cache.enabled,
            plan=plan,
            plan_error=error,
            warnings=tuple(all_warnings(d)),
            config_sha256=served_config_sha256(d, argv),
            derived=derived_figures(d),
            rule_labels=flag_rule_labels(d),
            weights_label=weights_label(d),
        )
    return ConfigFacts(stacks)


def _revision_geometry(raw: dict[str, Any], config_dir: Path) -> dict[str, Any]:
    """Point capacity.model_geometry at the revision's own file (relative names are relative
    to config/, which the current code would otherwise read from the current checkout)."""
    default = CapacitySettings.model_fields["model_geometry"].default
    sections = [raw, *(s for s in raw.get("stacks", {}).values() if isinstance(s, dict))]
    for i, section in enumerate(sections):
        capacity = section.get("capacity")
        if capacity is not None and not isinstance(capacity, dict):
            continue  # malformed: the validators will say so
        name = (capacity or {}).get("model_geometry")
        if name is None and i == 0:
            name = default
        if isinstance(name, str) and (config_dir / name).is_file():
            section["capacity"] = {**(capacity or {}), "model_geometry": str(config_dir / name)}
    return raw


def config_environ(config: Path | None, environ: Mapping[str, str] | None = None
                   ) -> dict[str, str]:
    """What load_raw sees: project and zone from the environment, never an ambient
    TPUSERVE_CONFIG (a review compares the repository's configs), only the user's --config."""
    src = os.environ if environ is None else environ
    env = {k: src[k] for k in (PROJECT_ENV, ZONE_ENV) if k in src}
    if config is not None:
        env[CONFIG_ENV] = str(config.resolve())
    return env
