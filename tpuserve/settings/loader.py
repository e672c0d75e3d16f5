"""THE config loader: TOML in, validated and capacity-checked deployments plus warnings out.

Synth (main.py), every CLI command, the plan review and the tests load through `load` (the
default TOML, TPUSERVE_CONFIG's files, later ones winning, and TPUSERVE_PROJECT/ZONE) or
`from_raw` (a dict already read). Each runs every stack's validators, then the planner's
capacity rules (settings/capacity.py), and raises one ConfigError listing every problem; soft
rules come back as warnings. Data flows one way: sections -> deployment -> capacity,
warnings -> loader.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tpuserve.contracts import CONFIG_ENV, PROJECT_ENV, ZONE_ENV
from tpuserve.kinds import KINDS, STACK_NAMES, words
from tpuserve.paths import DEFAULT_CONFIG
from tpuserve.settings.base import ConfigError
from tpuserve.settings.base_stack import BASE_STACK, Base
from tpuserve.settings.capacity import capacity_problems, capacity_warnings
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.measured_rules import rule_context
from tpuserve.settings.price_warnings import cheaper_elsewhere
from tpuserve.settings.sections import CacheSettings, GcpSettings, StateSettings
from tpuserve.settings.stack import STACK_SWITCH, StackKeys
from tpuserve.settings.string_rules import shown
from tpuserve.settings.warnings import deployment_warnings


@dataclass(frozen=True)
class Loaded:
    """Every stack's deployment, the long-lived base they stand on, and the warnings to print."""

    deployments: dict[str, Deployment]
    warnings: list[str] = field(default_factory=list)
    base: Base | None = None  # None only when no serving stack is configured (or switched off)


def load(environ: Mapping[str, str] | None = None, *, path: Path = DEFAULT_CONFIG) -> Loaded:
    """The configuration as synth sees it; environ defaults to os.environ."""
    return from_raw(load_raw(path, environ=environ))


def from_raw(raw: Mapping[str, Any], *, warnings: bool = True) -> Loaded:
    """Validate and capacity-check a raw config; raise ConfigError with every problem.
    `warnings=False`: Loaded.warnings stays empty, for a caller that words its own (plan)."""
    deployments, problems = validate(raw)
    for name, d in deployments.items():
        problems.extend(f"[{name}] {p}" for p in capacity_problems(d) + _learned_problems(d))
    base = None
    if not problems and (deployments or switched_off(raw)):  # all off: the base stays
        base, base_problems = base_of(raw, deployments)
        problems.extend(base_problems)
    if problems:
        raise ConfigError(merge_stacks(problems))
    said = [f"[{name}] {w}" for name, d in deployments.items()
            for w in not_applicable(raw, d) + all_warnings(d)] if warnings else []
    return Loaded(deployments, said, base)


def switched_off(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """The stacks whose [stacks.NAME] table says enabled = false, in the registry's order."""
    stacks = raw.get("stacks")
    if not isinstance(stacks, Mapping):
        return ()
    return tuple(n for n in STACK_NAMES if isinstance(stacks.get(n), Mapping)
                 and stacks[n].get(STACK_SWITCH) is False)


def base_of(raw: Mapping[str, Any], deployments: Mapping[str, Deployment],
            ) -> tuple[Base | None, list[str]]:
    """The deployment's base, from the top-level [gcp], [cache] and [state] tables, and one
    problem per stack whose own table moves it off that base (another project, region,
    deployment, network or state): it would look for a base nobody deploys."""
    any_stack = next(iter(deployments.values()), None)
    try:
        base = Base(
            gcp=GcpSettings.model_validate(raw.get("gcp", {})),
            cache=CacheSettings.model_validate(raw.get("cache", {})),
            state=StateSettings.model_validate(raw.get("state", {})),
        )
    except ValidationError:
        # The top level alone is incomplete (say, [gcp] only in the stack tables, and every
        # stack agrees): the stacks' shared base is the base.
        if any_stack is None:  # and no serving stack to find it in: no base
            return None, []
        base = any_stack.base
    problems = []
    for name, d in deployments.items():
        for setting, want in base.identity.items():
            got = d.base.identity[setting]
            if got != want:
                problems.append(
                    f"[{name}] {setting} = {shown(got)}: must be the base's {shown(want)} "
                    f"(the `{BASE_STACK}` stack holds the network, identities, secrets and "
                    "buckets of one deployment in one project and region, and a serving stack "
                    "finds them by name); set it at the top level for every stack, or give "
                    "this stack a config file of its own with its own gcp.deployment "
                    "(TPUSERVE_CONFIG), which makes a base of its own"
                )
    return base, problems


def not_applicable(raw: Mapping[str, Any], d: Deployment) -> list[str]:
    """The keys of the stack's own table that its kind ignores: accepted (a config that worked
    keeps working), and named, so a setting that does nothing is not mistaken for one in force."""
    kind = d.kind
    table = raw.get("stacks", {}).get(d.name, {})
    why = f"does nothing for provisioning_model = {kind.provisioning_model!r}"
    out = []
    for key in d.stack.ignored:
        have = words(tuple(k.name for k in KINDS if key in k.stack_keys), "and")
        out.append(f"stacks.{d.name}.{key} = {shown(table.get(key))}: {why} (only the {have} "
                   "stacks have it); ignored")
    if not kind.on_gke and isinstance(table.get("fleet"), Mapping):
        gke = words(tuple(k.name for k in KINDS if k.on_gke), "and")
        out.append(f"stacks.{d.name}.fleet: {why} (only the {gke} stack reads [fleet]); "
                   "ignored")
    return out


def all_warnings(d: Deployment) -> list[str]:
    """One stack's soft rules: its settings' own, then the planner's (capacity, then a
    cheaper region for its accelerator and provisioning model; a tuned profile its image does
    not pin)."""
    return deployment_warnings(d) + capacity_warnings(d) + cheaper_elsewhere(d) + \
        _learned_notes(d)


# With no capacity.profiles_dir there is no profile to read (learned_profiles._of_pair): no
# problem and no note, and its readers stay unimported (start-up time: bench/cli).
def _learned_problems(d: Deployment) -> list[str]:
    if d.capacity.profiles_dir_path is None:
        return []
    from tpuserve.settings.learned_profiles import learned_problems

    return learned_problems(d)


def _learned_notes(d: Deployment) -> list[str]:
    if d.capacity.profiles_dir_path is None:
        return []
    from tpuserve.settings.learned_profiles import learned_notes

    return learned_notes(d)


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_raw(
    path: Path = DEFAULT_CONFIG, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The default TOML, with TPUSERVE_CONFIG's files (in order, later ones win) and
    TPUSERVE_PROJECT/ZONE merged over."""
    env = os.environ if environ is None else environ
    raw = _read_toml(path, f"the default config = {shown(str(path))}")
    if user := env.get(CONFIG_ENV):
        for user_path, label in config_files(user):
            raw = deep_merge(raw, _anchor_geometry(_read_toml(user_path, label),
                                                   user_path.parent))
    for var, key in ((PROJECT_ENV, "project"), (ZONE_ENV, "zone")):
        if value := env.get(var):
            raw = deep_merge(raw, {"gcp": {key: value}})
    return raw


# TPUSERVE_CONFIG holds one file or several, separated like PATH; a later file wins.
CONFIG_SEPARATOR = ":"
_LIST_RULE = (f"{CONFIG_ENV} is a list of TOML files separated by {CONFIG_SEPARATOR!r}, each "
              "merged over the ones before it (later ones win)")


def config_files(value: str) -> list[tuple[Path, str]]:
    """TPUSERVE_CONFIG's files in merge order, each with the label its errors start with; a
    ConfigError (one line) for an empty element: it names no file, and skipping it would
    hide a typo such as `a.toml::b.toml` or a stray ':' at either end."""
    parts = value.split(CONFIG_SEPARATOR)
    if len(parts) == 1:
        return [(Path(value), f"{CONFIG_ENV} = {shown(value)}")]
    out = []
    for i, part in enumerate(parts, 1):
        where = f"{CONFIG_ENV} = {shown(value)}: file {i} of {len(parts)}"
        if not part:
            raise ConfigError([f"{where} is empty; {_LIST_RULE}, and no name is empty"])
        out.append((Path(part), f"{where} = {shown(part)}"))
    return out


def _anchor_geometry(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """A relative capacity.model_geometry, weights_index or pricing.catalog_file in the user's
    file names a file beside that file, not one in this checkout's config/ (the default
    config's names are against it)."""
    stacks = raw.get("stacks")
    tables = [raw, *(t for t in stacks.values() if isinstance(t, dict))] \
        if isinstance(stacks, dict) else [raw]
    for table in tables:
        for section, key in (("capacity", "model_geometry"), ("capacity", "weights_index"),
                             ("capacity", "profiles_dir"), ("pricing", "catalog_file")):
            values = table.get(section)
            name = values.get(key) if isinstance(values, dict) else None
            if isinstance(name, str) and name and not Path(name).is_absolute():
                values[key] = str(base.resolve() / name)  # type: ignore[index]
    return raw


def _read_toml(path: Path, label: str) -> dict[str, Any]:
    """A TOML file as a dict; an unreadable or malformed file is a ConfigError, not a traceback.
    `label` names the setting and the file (`TPUSERVE_CONFIG = '...'`)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{label}: cannot be read ({_one_line(exc)})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{label}: not valid TOML ({_one_line(exc)})"]) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _format_error(stack: str, err: Mapping[str, Any]) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "value_error" and " = " in msg.split(":", 1)[0]:
        return f"[{stack}] {msg}"  # our own rule: it already names setting and value
    # A key the user wrote is part of the location: shown like a value unless it is a plain word.
    where = ".".join(
        str(p) if re.fullmatch(r"[A-Za-z0-9_\[\]-]{1,64}", str(p)) else shown(p)
        for p in err["loc"]
    ) or "(top level)"
    value = err.get("input")
    text = "" if isinstance(value, Mapping) else f" = {shown(value)}"
    return f"[{stack}] {where}{text}: {msg}{_type_hint(err['type'], value)}"


def _type_hint(kind: str, value: object) -> str:
    """Strict types: say how TOML spells the wanted type."""
    if kind in ("int_type", "bool_type", "float_type", "finite_number") and isinstance(value, str):
        return " (TOML has types: write the value without quotes, e.g. 8000 or true)"
    if kind == "bool_type":
        return " (TOML has types: a boolean is true or false)"
    if kind == "int_type":
        return " (TOML has types: an integer has no decimal point and is not true/false)"
    if kind == "string_type":
        return " (TOML has types: a string is quoted)"
    return ""


# Keys the loader sets itself: the stack's name (from its [stacks.NAME] table) and the stack's
# own settings (gathered from that table into `stack`). A user who writes them is refused.
LOADER_KEYS = ("name", "stack")


def _stack_tables(raw: Mapping[str, Any], problems: list[str]) -> dict[str, Mapping[str, Any]]:
    """The [stacks.NAME] tables; what is not a table is a problem, not a traceback."""
    stacks = raw.get("stacks", {})
    if not isinstance(stacks, Mapping):
        problems.append(
            f"stacks = {shown(stacks)}: must be a table of stacks, [stacks.spot] ... "
            f"(the stacks are {list(STACK_NAMES)})"
        )
        return {}
    unknown = ", ".join(sorted(shown(k) for k in set(stacks) - set(STACK_NAMES)))
    if unknown:
        problems.append(f"stacks: unknown stack(s) {unknown}; the stacks are {list(STACK_NAMES)}")
    out: dict[str, Mapping[str, Any]] = {}
    for name in STACK_NAMES:
        if name not in stacks:
            continue
        table = stacks[name]
        if not isinstance(table, Mapping):
            problems.append(f"[{name}] stacks.{name} = {shown(table)}: must be a table")
            continue
        out[name] = table
    return out


def _loader_keys_written(raw: Mapping[str, Any], tables: Mapping[str, Mapping[str, Any]],
                         ) -> list[str]:
    why = {"name": "the [stacks.NAME] table names the stack",
           "stack": "a stack's settings go directly in its [stacks.NAME] table"}
    found = [(key, key) for key in LOADER_KEYS if key in raw]
    found += [(f"stacks.{n}.{key}", key) for n, t in tables.items() for key in LOADER_KEYS
              if key in t]
    return [f"{where}: set by the loader itself ({why[key]}); remove it" for where, key in found]


def validate(raw: Mapping[str, Any]) -> tuple[dict[str, Deployment], list[str]]:
    """Validate every stack of a raw config: the stacks that passed, and every problem found."""
    problems: list[str] = []
    out: dict[str, Deployment] = {}
    stacks = _stack_tables(raw, problems)
    problems.extend(_loader_keys_written(raw, stacks))
    if problems:
        return out, problems
    shared = {k: v for k, v in raw.items() if k != "stacks"}
    for name, table in stacks.items():
        over = dict(table)
        enabled = over.pop(STACK_SWITCH, True)
        stack_keys = {k: over.pop(k) for k in list(over) if k in StackKeys.model_fields}
        if enabled is not True:
            # Off (or not a boolean): only the table's own keys are checked; a stack switched
            # off is not validated with the rest, nor synthesized.
            # A key that is neither a section nor a stack key is a typo here too (refused).
            typos = {k: v for k, v in over.items() if k not in Deployment.model_fields}
            try:
                StackKeys.model_validate(stack_keys | typos | {STACK_SWITCH: enabled})
            except ValidationError as exc:
                problems.extend(_format_error(name, {**e, "loc": ("stacks", name, *e["loc"])})
                                for e in exc.errors())
            continue
        data = deep_merge(shared, over) | {"name": name, "stack": stack_keys}
        try:
            out[name] = Deployment.model_validate(data, context=rule_context(data))
        except ValidationError as exc:
            problems.extend(_format_error(name, e) for e in exc.errors())
    return out, problems


def merge_stacks(problems: list[str]) -> list[str]:
    """A shared setting fails in every stack: say it once, naming the stacks."""
    by_msg: dict[str, list[str]] = {}
    for p in problems:
        stack, _, msg = p.partition("] ")
        if not p.startswith("[") or not msg:  # a problem of the file, not of a stack
            by_msg.setdefault(p, [])
            continue
        by_msg.setdefault(msg, []).append(stack.lstrip("["))
    return [f"[{', '.join(stacks)}] {msg}" if stacks else msg for msg, stacks in by_msg.items()]
