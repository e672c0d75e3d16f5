"""tests/sim's fixture: a project of fakes per test, as tests/render/boot's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.render.boot.support import Cloud, open_cloud


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    with open_cloud(tmp_path) as c:
        yield c
