"""fleet_helper.token(): a replica's first Cloud Storage call comes seconds after its pod
starts, when GKE's metadata server may not answer yet; the token request is retried, bounded."""

from __future__ import annotations

import importlib.util
import urllib.error
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.fakes.metadata import TOKEN_PATH, FakeMetadata
from tpuserve.render.fleet_bundle import FLEET_HELPER


@pytest.fixture
def meta() -> Iterator[FakeMetadata]:
    with_server = FakeMetadata(access_token="ya29.fleet").start()
    yield with_server
    with_server.stop()


def helper(meta: FakeMetadata, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("GCE_METADATA_HOST", meta.host)
    spec = importlib.util.spec_from_file_location("fleet_helper_under_test", FLEET_HELPER)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "TOKEN_BACKOFF_S", (0.01, 0.05))  # the same loop, shorter
    return mod


def test_the_first_token_survives_a_metadata_server_that_is_not_up_yet(meta, monkeypatch,
                                                                        capsys) -> None:
    mod = helper(meta, monkeypatch)
    meta.token_failures = 3
    meta.faults.drop(lambda r: r.path == TOKEN_PATH)  # and one connection dropped
    assert mod.token() == "ya29.fleet"
    assert meta.token_requests == 4  # 3 answered 503 + the good one (the dropped one aside)
    assert "metadata server not ready: HTTP 503" in capsys.readouterr().err
    assert mod.token() == "ya29.fleet" and meta.token_requests == 4  # cached


def test_the_retry_is_bounded_and_raises_the_last_error(meta, monkeypatch) -> None:
    mod = helper(meta, monkeypatch)
    monkeypatch.setattr(mod, "TOKEN_RETRY_S", 0.3)
    meta.token_failures = 10_000
    with pytest.raises(urllib.error.HTTPError) as exc:
        mod.token()
    assert exc.value.code == 503
    assert 2 <= meta.token_requests < 100


def test_an_answer_without_a_token_proves_nothing(meta, monkeypatch) -> None:
    from werkzeug import Response

    mod = helper(meta, monkeypatch)
    monkeypatch.setattr(mod, "TOKEN_RETRY_S", 0.2)
    meta.faults.add(lambda r: r.path == TOKEN_PATH,
                    lambda: Response('{"access_token": ""}', 200, mimetype="application/json"),
                    times=10_000)
    with pytest.raises(ValueError, match="no access token"):
        mod.token()
