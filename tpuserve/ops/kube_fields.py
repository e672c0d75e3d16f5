"""Fields of Kubernetes objects read as JSON: a value at a path, a list, an int, a quantity.

Every object the cluster answers is hostile: a missing or mistyped field reads as absent
(None, [], 0), never as a crash.
"""

from __future__ import annotations

import re
from typing import Any


def parse_quantity(text: object) -> float | None:
    """A Kubernetes quantity ('3', '3500m', '1.5k', '2Ki') as a number; None if it is not one."""
    if isinstance(text, (int, float)):
        return float(text)
    if not isinstance(text, str):
        return None
    m = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", text.strip())
    if not m:
        return None
    scale = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10,
             "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
    try:
        return float(m.group(1)) * scale
    except ValueError:
        return None


def dig(obj: Any, *path: str) -> Any:
    for p in path:
        obj = obj.get(p) if isinstance(obj, dict) else None
    return obj


def dig_list(obj: Any, *path: str) -> list[Any]:
    value = dig(obj, *path)
    return value if isinstance(value, list) else []


def as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0

