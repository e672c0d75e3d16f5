"""Every read on the node is bounded as a whole, not per recv: an answer that drips a byte at a
time (the fakes' drip modes, tests/fakes/hostile_server.py) ends at the read's deadline
(the boot helper's bounded_get, templates/boot/boot_helper/watch_bounds.py; curl's --max-time
in lib.sh.j2 and api.sh.j2)."""

from __future__ import annotations

import hashlib
import importlib.util
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes.hostile_server import HostileServer
from tests.fakes.metadata import ATTRIBUTES_PREFIX, TOKEN_PATH
from tests.render.boot.support import NAMESPACE, Cloud, wait_for
from tpuserve.render.boot_script import boot_helper_text

KEY = "startup-script"
HANG = 60.0  # seconds a bounded read may not come near (its bound is 2 s here, 11 s booted)


@pytest.fixture
def helper(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ModuleType]:
    """boot_helper.py (the text the script carries) as a module, with the poll's grace cut to
    1 s (its bound: 1 + 1 s)."""
    path = tmp_path / "boot_helper.py"
    path.write_text(boot_helper_text())
    spec = importlib.util.spec_from_file_location("boot_helper_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "POLL_GRACE_S", 1)
    yield module


@pytest.mark.parametrize("mode", ["headers", "trickle"])
def test_the_watchers_poll_ends_at_its_deadline_when_the_answer_drips(
    helper: ModuleType, mode: str,
) -> None:
    # headers: the status line, then a header one byte every 0.2 s; trickle: a 100 MB
    # Content-Length and a body byte every 0.2 s. A per-recv timeout never fires on either.
    with HostileServer(mode, interval_s=0.2) as url:
        watcher = helper.Watcher(["--meta-host", url.removeprefix("http://"), "--run-dir", "x",
                                  "--state-dir", "x", "--recorder", "x", "--scale-us", "1000"])
        outcome: list[BaseException | object] = []

        def poll() -> None:
            try:
                outcome.append(watcher.poll("0"))
            except BaseException as e:
                outcome.append(e)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        thread.join(HANG)
        assert not thread.is_alive(), f"the poll of a dripping answer ({mode}) never ended"
    assert len(outcome) == 1 and isinstance(outcome[0], helper.PollError), outcome
    assert "no whole answer within 2 s" in str(outcome[0])


def _reconverge(cloud: Cloud, since: float = 0) -> list[str]:
    return [w.value.split(" ", 1)[1] for w in cloud.metadata.writes_in(NAMESPACE)
            if w.key == "reconverge" and w.at >= since]


def test_a_dripping_long_poll_is_ended_and_the_watcher_still_applies_a_change(
    cloud: Cloud,
) -> None:
    node = cloud.node()
    cloud.metadata.set_attribute(KEY, node.script.read_text())
    node.run()
    wait_for(lambda: _reconverge(cloud), "the watcher's first record")
    # From now on every answer to the watcher's poll drips: the script at 2 B/s would hold
    # one poll for hours; its whole-read bound is timeout_sec + 10 s = 11 s. Every poll
    # answered after dripping_since drips, and the watcher polls one at a time: a second one
    # comes only once the first was cut.
    cloud.metadata.drip(lambda r: r.path == ATTRIBUTES_PREFIX + KEY, every=0.5)
    dripping_since = time.time()
    wait_for(lambda: len([p for p in cloud.metadata.attribute_polls(KEY)
                          if p[0] >= dripping_since]) >= 2,
             "polls after a dripping one", timeout=HANG)
    assert "no whole answer within 11 s" in node.watch_log.read_text()
    # The metadata server heals: a changed script is still found and applied.
    cloud.metadata.drip(None)
    script = node.script.read_text() + "\n# changed\n"
    changed_at = time.time()
    cloud.metadata.set_attribute(KEY, script)
    sha = hashlib.sha256(script.encode()).hexdigest()
    wait_for(lambda: f"applied sha256={sha}" in _reconverge(cloud, changed_at),
             "the changed script applied", timeout=HANG)


def test_dripping_answers_to_the_boots_curl_calls_end_at_their_max_time(cloud: Cloud) -> None:
    # The token (auth_config) and a secret's access (api) each drip once: curl's --max-time
    # ends each (after 1 s: tmo's floor), the call is retried, the boot goes on. At a scale
    # where the secret's 600 s budget outlasts those seconds.
    cloud.metadata.drip(lambda r: r.path == TOKEN_PATH, every=0.5, times=1)
    cloud.secrets.drip_next(1)
    node = cloud.node(TPUSERVE_TIME_SCALE="0.03")
    node.run(timeout=120)
    assert node.attrs()["state"] == "ready"
    assert node.attrs()["secret"].startswith("fetched api_key_sha256=")
    assert cloud.metadata.drip_matches is None and cloud.secrets.drip_accesses == 0
    # The teardown kills the watcher by its process group: wait until it has one (setsid).
    wait_for(lambda: node.watch_log.exists() and "watching" in node.watch_log.read_text(),
             "the watcher to run")
