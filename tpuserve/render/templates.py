"""The Jinja environment every renderer uses: templates/ on disk, strict about undefined names,
no HTML escaping (the output is bash or nginx; each renderer quotes what it renders)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jinja2

from tpuserve.paths import TEMPLATE_DIR


def environment(**filters: Callable[..., Any]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # bash and nginx, not HTML
    )
    env.filters.update(filters)
    return env
