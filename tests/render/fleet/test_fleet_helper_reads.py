"""The fleet helper's reads are bounded as a whole (templates/fleet/fleet_helper.py: every
connection lives at most its timeout, a download at most its deadline): an answer dripping a
byte at a time, which a per-recv timeout never ends, is cut."""

from __future__ import annotations

import importlib.util
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes.hostile_server import HostileServer
from tests.fakes.metadata import TOKEN_PATH, FakeMetadata
from tpuserve.paths import REPO_ROOT

HANG = 60.0  # seconds no bounded read comes near (its bounds here: 10 s, 2 s)


@pytest.fixture
def helper() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location(
        "fleet_helper_under_test", REPO_ROOT / "templates" / "fleet" / "fleet_helper.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    urllib.request.install_opener(None)  # the helper installs its opener at import


def _outcome(fn: Callable[[], object]) -> list[object]:
    """What FN returned or raised, run in a thread given HANG seconds (empty: it hung)."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG)
    return list(out)  # a copy: what ends later (a stopped server ends any read) is not it


def test_a_token_answer_dripping_its_headers_is_cut_at_the_token_timeout(
    helper: ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with HostileServer("headers", interval_s=0.2) as url:
        monkeypatch.setattr(helper, "META", url + TOKEN_PATH)
        out = _outcome(helper.token)
    assert out, "the token read of a dripping answer never ended"
    assert isinstance(out[0], (OSError, ValueError)), out


def test_a_dripping_download_ends_at_its_deadline(
    helper: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    metadata = FakeMetadata(access_token="ya29.fake-token").start()
    try:
        monkeypatch.setattr(helper, "META", f"http://{metadata.host}{TOKEN_PATH}")
        # A 100 MB Content-Length, then a byte every 0.2 s: never a recv timeout.
        with HostileServer("trickle", interval_s=0.2) as url:
            monkeypatch.setattr(helper, "API", url + "/")
            dest = tmp_path / "object"
            out = _outcome(lambda: helper.download("b", "o", str(dest), time.time() + 2))
    finally:
        metadata.stop()
    assert out, "a dripping download never ended"
    assert isinstance(out[0], TimeoutError), out


def test_answers_that_end_in_time_are_read_whole_and_share_one_watchdog(
    helper: ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    metadata = FakeMetadata(access_token="ya29.fake-token").start()
    try:
        monkeypatch.setattr(helper, "META", f"http://{metadata.host}{TOKEN_PATH}")
        for _ in range(30):
            monkeypatch.setattr(helper, "_token", ("", 0.0))  # read it again
            assert helper.token() == "ya29.fake-token"
    finally:
        metadata.stop()
        # No thread a connection (a Timer each would live its whole timeout): one watchdog.
        assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
        assert helper._watchdog._thread is not None and helper._watchdog._thread.is_alive()
