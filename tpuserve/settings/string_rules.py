"""Allow-list patterns for every config string that reaches bash, nginx, vLLM's argv or Terraform.

A config string is data; these patterns keep it data. Each rule names what it admits and why,
and `check` refuses anything else with a message naming the setting, the value and the rule.
None admits whitespace, quotes, `$`, backticks, braces, `%`, `;`, `#` or control characters,
and none a leading `-` (a value can never be read as an option of vLLM or docker).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Values are shown in messages at most this long: a 200 KB value must not flood the terminal.
SHOWN_CHARS = 80


def shown(value: object) -> str:
    """repr(value), cut to SHOWN_CHARS (control characters stay escaped by repr)."""
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str | bytes) else ""
    return f"{text[:SHOWN_CHARS]}...{size}"


@dataclass(frozen=True)
class Rule:
    pattern: str  # matched with re.fullmatch, so no anchor can be fooled by a trailing newline
    words: str  # the rule as the user reads it
    max_len: int

    def ok(self, value: str) -> bool:
        return len(value) <= self.max_len and re.fullmatch(self.pattern, value) is not None


# OCI distribution reference grammar (distribution/reference, regexp.go): a domain with
# optional port, then lowercase path components joined by '.', '_', '__' or dashes.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
IMAGE = Rule(
    rf"{_NAME}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?",
    "an image reference [registry[:port]/]path[:tag][@sha256:<64 hex>] (OCI distribution "
    "reference grammar: lowercase path components, a tag of at most 128 word characters, dots "
    "or dashes)",
    # distribution/reference: a name is at most 255 characters; tag and digest come on top.
    255 + 129 + 72,
)
# Hugging Face repo ids (huggingface_hub validate_repo_id): `org/name`, each part word
# characters, dots and dashes, at most 96 characters, not starting or ending with '.' or '-',
# and no '--' or '..' anywhere.
_HF_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
HF_REPO = Rule(
    rf"(?!.*(?:--|\.\.)){_HF_PART}/{_HF_PART}",
    "a Hugging Face repo id org/name (letters, digits, '_', '.', '-'; each part at most 96 "
    "characters, not starting or ending with '.' or '-'; no '--' or '..')",
    193,
)
# vLLM's parser registries name parsers in lowercase words: gemma4, llama3_json, granite-20b-fc.
PARSER = Rule(
    r"[a-z0-9][a-z0-9_.-]*",
    "a vLLM parser name: lowercase letters, digits, '_', '.', '-', starting with a letter or "
    "digit, at most 64 characters",
    64,
)
# Google's rule for project ids: 6-30 characters, lowercase letter first, no trailing hyphen.
PROJECT = Rule(
    r"[a-z][a-z0-9-]{4,28}[a-z0-9]",
    "a project id: 6-30 lowercase letters, digits or hyphens, starting with a letter and not "
    "ending with a hyphen (set TPUSERVE_PROJECT)",
    30,
)
ZONE = Rule(r"[a-z]+-[a-z]+[0-9]+-[a-z]", "a zone like us-west4-a (set TPUSERVE_ZONE)", 63)
# Compute Engine resource names (RFC 1035 labels), or a network's relative resource name.
_GCE_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
NETWORK = Rule(
    rf"(?:projects/[a-z][a-z0-9-]{{4,28}}[a-z0-9]/global/networks/)?{_GCE_NAME}",
    "a VPC network name (1-63 lowercase letters, digits or hyphens, starting with a letter, not "
    "ending with a hyphen) or projects/PROJECT/global/networks/NAME; unset it to let tpuserve "
    "create one",
    63 + 50,
)
# TPU runtime versions are lowercase words with dots and dashes: v2-alpha-tpuv5-lite.
RUNTIME_VERSION = Rule(
    r"[a-z0-9]+(?:[.-][a-z0-9]+)*",
    "a TPU runtime version like v2-alpha-tpuv5-lite: lowercase letters and digits joined by "
    "'.' or '-', at most 64 characters",
    64,
)
# GCP label values: at most 63 characters, lowercase letters, digits, '_' and '-'.
LABEL_VALUE = Rule(
    r"[a-z0-9_-]*", "a GCP label value: at most 63 lowercase letters, digits, '_' or '-'", 63
)
# Docker's --shm-size: a number and a unit (b, k, m, g).
SHM_SIZE = Rule(r"[1-9][0-9]{0,5}[kmg]b?", "a size like 10gb or 512m (1-6 digits, k/m/g)", 8)
# Cloud Storage bucket names: 3-63 characters per dot-separated part, 222 in all.
GCS_BUCKET = Rule(
    r"(?!goog)(?![0-9.]+$)[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?"
    r"(?:\.[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?)*",
    "a Cloud Storage bucket name: lowercase letters, digits, '-', '_' and dots, each part "
    "starting and ending with a letter or digit, at most 63 characters a part and 222 in all, "
    "not starting with 'goog' and not an IP address",
    222,
)
GCS_PREFIX = Rule(
    r"[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*",
    "an object-name prefix: '/'-separated parts of letters, digits, '_', '.', '-', each "
    "starting with a letter, digit or '_'",
    200,
)
DURATION = Rule(
    r"(?:[0-9]{1,7}[dhms])+", "a duration like 4h, 90m, 7d, 14400s or 1h30m", 32
)
# A local file read at synth (never rendered): printable characters, no newline.
PROFILES_DIR = Rule(r"[^\x00-\x1f\x7f]+", "a directory path, without control characters", 1024)
GEOMETRY_PATH = Rule(
    r"[^\x00-\x1f\x7f]+\.json", "a path to a .json file, without control characters", 1024
)


def check(setting: str, value: str, rule: Rule) -> str:
    """`value` if the rule admits it; otherwise a ValueError naming setting, value and rule."""
    if not rule.ok(value):
        size = f" (it has {len(value)})" if len(value) > rule.max_len else ""
        raise ValueError(
            f"{setting} = {shown(value)}: must be {rule.words}, at most {rule.max_len} "
            f"characters{size} (config strings reach bash, nginx, vLLM's argv and Terraform: "
            "only these characters are data in all four)"
        )
    return value
