"""The measured rule behind each `vllm serve` flag and tpu-inference variable (SPEC 4), by name.

`review` prints these next to a changed flag so a reviewer sees why the old value was chosen
without opening SPEC. They explain; they do not enforce. Each is a setting's note in
tpuserve/settings/measured_rules.py, named by the flag its setting renders to (the `Flag` in
settings/vllm.py), a tpu-inference variable's own name, or the note's own `flag`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuserve.settings.measured_rules import MODEL_ARG, RULES, Flag, Rule
from tpuserve.settings.vllm import VllmSettings

__all__ = ["FLAG_RULES", "MODEL_ARG", "FlagRule", "flag_of", "rule_for"]


@dataclass(frozen=True)
class FlagRule:
    name: str  # the flag as vLLM spells it, or the environment variable
    setting: str  # the setting that decides it (docs/configuration.md)
    rule: str  # what was measured, one short line, with its SPEC section


def flag_of(setting: str) -> str | None:
    """The `vllm serve` option or container variable a setting renders to, if any."""
    section, _, name = setting.rpartition(".")
    if section == "vllm.env":
        return name  # tpu-inference's variables are named by their settings
    if section == "vllm" and name in VllmSettings.model_fields:
        flags = [m for m in VllmSettings.model_fields[name].metadata if isinstance(m, Flag)]
        return flags[0].spelling if flags else None
    return None


def _name(note: Rule) -> str:
    name = note.flag or flag_of(note.setting)
    if name is None:
        raise ValueError(f"{note.setting}: a note names no flag (give it flag=...)")
    return name


FLAG_RULES: dict[str, FlagRule] = {
    _name(r): FlagRule(_name(r), r.setting, r.note) for r in RULES if r.level == "note"
}


def rule_for(name: str) -> FlagRule | None:
    """The measured rule behind a flag (`--max-model-len`), `model`, or an env var name."""
    return FLAG_RULES.get(name)
