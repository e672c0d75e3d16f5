"""The settings' common ground: strict models, the rule-error shape, the stack names."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
)

from tpuserve.kinds import PROVISIONING_MODELS, STACK_NAMES
from tpuserve.settings import string_rules as rules
from tpuserve.settings.string_rules import check, shown

# The serving stacks, each named for what it runs on (tpuserve/kinds: `fleet` is replicas on
# GKE); STACK_NAMES is re-exported from the registry for the settings' users.
ProvisioningModel = Literal[PROVISIONING_MODELS]  # type: ignore[valid-type]
__all__ = ["STACK_NAMES", "ConfigError", "ProvisioningModel", "StrictModel", "image_reference",
           "parse_duration", "spec_error"]

class StrictModel(BaseModel):
    """Unknown keys are typos: reject them instead of silently ignoring a setting.

    Strict: TOML has types, so "off" is no boolean, "8000" no port and 1.5 no integer; and
    inf/nan are no numbers.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False
    )


def spec_error(setting: str, value: object, rule: str, why: str) -> ValueError:
    return ValueError(f"{setting} = {shown(value)}: {rule} ({why})")


def parse_duration(text: str) -> int:
    """'4h', '90m', '7d', '14400s' or '1h30m' -> seconds (gcloud's duration words)."""
    parts = re.findall(r"(\d+)([dhms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration like 4h, 90m, 7d or 14400s")
    scale = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(int(n) * scale[u] for n, u in parts)


def image_reference(setting: str, v: str) -> str:
    """An image reference docker can pull: `vllm.image` and `access.proxy_image` alike."""
    if re.fullmatch(r"(sha256:)?[0-9a-f]{64}", v):
        raise spec_error(
            setting, v, "give a tag (repo:tag) or a manifest digest (repo@sha256:...)",
            "SPEC 1: the sha256 id that `docker images` prints is a config-blob id; "
            "`docker pull` by it fails with 'unexpected media type'",
        )
    return check(setting, v, rules.IMAGE)



class ConfigError(Exception):
    """Every problem found in the configuration, gathered so the user sees them at once."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


