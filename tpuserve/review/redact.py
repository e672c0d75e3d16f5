"""Masks anything token-shaped in what a review writes. Defensive: the stacks and configs
hold no secret, but a review quotes synth errors and attachments verbatim."""

from __future__ import annotations

import re

_TOKEN_SHAPES = (
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----",
               re.DOTALL),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),  # OpenAI-style API keys
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),  # Google API key
    re.compile(r"\bya29\.[0-9A-Za-z_.-]{10,}"),  # Google OAuth access token
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bxox[abprs]-[0-9A-Za-z-]{10,}"),  # Slack
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT
)
# NAME=value / NAME: value where NAME says it holds a secret (HF_TOKEN=..., "password": ...).
_ASSIGNED = re.compile(
    r"""(?P<name>\b[A-Z][A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|API_KEY|APIKEY)\b"""
    r"""|"[a-z_]*(?:token|secret|password|api_key|private_key)")"""
    r"""(?P<sep>\s*[=:]\s*)(?P<q>["']?)(?P<value>(?![/$<{])[^\s"']{8,})"""
)
REDACTED = "[REDACTED]"


def redact(text: str) -> str:
    """Mask anything token-shaped. Defensive: the stacks and configs hold no secret."""
    for shape in _TOKEN_SHAPES:
        text = shape.sub(REDACTED, text)
    return _ASSIGNED.sub(lambda m: f"{m['name']}{m['sep']}{m['q']}{REDACTED}", text)
