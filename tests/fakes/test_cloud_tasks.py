"""The fake Cloud Tasks API's own fidelity (tests/fakes/cloud_tasks.py): it refuses what the
real API refuses and accepts the documented task shape, the one the billing guard builds."""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fakes.cloud_tasks import FakeCloudTasks
from tpuserve.gcp.billing_guard import GuardTarget, build_task, guard_target
from tpuserve.settings import Deployment

CREATED = 1_767_225_600  # 2026-01-01T00:00:00Z: the fake's clock
TOKEN = "ya29.deployer-token"


@dataclass
class Fake:
    tasks: FakeCloudTasks
    queue: str
    target: GuardTarget


@pytest.fixture
def fake(deployments: dict[str, Deployment]) -> Iterator[Fake]:
    d = deployments["spot"]
    target = guard_target(d)
    assert target is not None
    tasks = FakeCloudTasks(token=TOKEN, clock=lambda: CREATED).start()
    tasks.add_queue(d.guard_queue)
    try:
        yield Fake(tasks, d.guard_queue, target)
    finally:
        tasks.stop()


def _post(tasks: FakeCloudTasks, queue: str, body: object) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"{tasks.url}v2/{queue}/tasks", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _good(fake: Fake) -> dict[str, Any]:
    return build_task(fake.target, dt.datetime.fromtimestamp(CREATED, dt.UTC))


def _mutated(fake: Fake, change: str) -> object:
    task = _good(fake)
    http = task["httpRequest"]
    if change == "snake_case":
        task["schedule_time"] = task.pop("scheduleTime")
    elif change == "app_engine":
        task["appEngineHttpRequest"] = {"relativeUri": "/x"}
    elif change == "no_token":
        del http["oauthToken"]
    elif change == "both_tokens":
        http["oidcToken"] = {"serviceAccountEmail": http["oauthToken"]["serviceAccountEmail"]}
    elif change == "bad_time":
        task["scheduleTime"] = "2026-01-01 08:00:00"
    elif change == "too_far":
        task["scheduleTime"] = "2026-02-01T00:00:01Z"
    elif change == "foreign_name":
        task["name"] = task["name"].replace("tpuserve-guard", "other-queue")
    elif change == "bad_method":
        http["httpMethod"] = "KILL"
    elif change == "unknown_field":
        http["timeout"] = "10s"
    elif change == "no_url":
        del http["url"]
    return {"task": task}


@pytest.mark.parametrize("change", [
    "snake_case", "app_engine", "no_token", "both_tokens", "bad_time", "too_far",
    "foreign_name", "bad_method", "unknown_field", "no_url",
])
def test_the_fake_refuses_what_the_api_refuses(fake: Fake, change: str) -> None:
    status, body = _post(fake.tasks, fake.queue, _mutated(fake, change))
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT", body
    assert fake.tasks.task_names() == []


def test_the_fake_accepts_the_documented_shape_once(fake: Fake) -> None:
    status, body = _post(fake.tasks, fake.queue, {"task": _good(fake)})
    assert status == 200 and body["scheduleTime"] == "2026-01-01T08:00:00Z"
    assert _post(fake.tasks, fake.queue, {"task": _good(fake)})[0] == 409
    unnamed = {k: v for k, v in _good(fake).items() if k != "name"}
    assert _post(fake.tasks, fake.queue, {"task": unnamed})[0] == 200
    assert _post(fake.tasks, fake.queue, {"task": unnamed, "extra": 1})[0] == 400
