"""The billing guard off the node: arming, re-arming and disarming a Cloud Tasks task against
the fake Cloud Tasks and TPU APIs, and the task firing the node's deletion. The fake's own
fidelity is tested beside it (tests/fakes/test_cloud_tasks.py)."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.cloud_tasks import FakeCloudTasks
from tests.fakes.tpu_api import FakeTpuApi
from tpuserve.billing_guard import (
    ENV_NODE,
    ENV_QUEUE,
    ENV_SECONDS,
    ENV_SERVICE_ACCOUNT,
    ENV_TPU_ENDPOINT,
    main,
)
from tpuserve.gcp.api import GoogleApi
from tpuserve.gcp.billing_guard import (
    NAME_TRIES,
    CloudTasks,
    GuardError,
    GuardTarget,
    arm,
    build_task,
    disarm,
    guard_seconds,
    guard_target,
)
from tpuserve.gcp.endpoints import TOKEN_ENV, TPU_API
from tpuserve.settings import Deployment

CREATED = 1_767_225_600  # 2026-01-01T00:00:00Z
TOKEN = "ya29.deployer-token"


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Apis:
    def __init__(self, d: Deployment) -> None:
        self.d = d
        self.clock = Clock(CREATED)
        # token=None: the TPU fake takes any bearer token, so a dispatched task can call it.
        self.tpu = FakeTpuApi(token=None, clock=self.clock).start()
        self.tasks = FakeCloudTasks(token=TOKEN, clock=self.clock).start()
        self.tasks.add_queue(d.guard_queue)
        # Google's network: the production TPU root reaches the fake TPU API, nothing else does.
        self.tasks.route(TPU_API, self.tpu.url)
        # The caller's shell points the arming calls at the fakes: the task must not follow.
        self.env = {**self.tasks.environ(), "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": self.tpu.url,
                    TOKEN_ENV: TOKEN}
        target = guard_target(d)
        assert target is not None
        self.target = target

    def seed_node(self, at: float) -> None:
        self.clock.t = at
        self.tpu.nodes.pop(self.d.node_path, None)
        self.tpu.seed_node(self.d.gcp.project, self.d.gcp.zone, self.d.node_name)

    def arm(self) -> Any:
        return arm(self.target, tasks=CloudTasks(environ=self.env),
                   tpu=GoogleApi("tpu", "https://tpu.googleapis.com/", environ=self.env))

    def stop(self) -> None:
        self.tpu.stop()
        self.tasks.stop()


@pytest.fixture
def apis(deployments: dict[str, Deployment]) -> Iterator[Apis]:
    a = Apis(deployments["spot"])
    try:
        yield a
    finally:
        a.stop()


def test_the_guard_applies_to_spot_and_ondemand_only(deployments: dict[str, Deployment]) -> None:
    spot = guard_target(deployments["spot"])
    assert spot is not None and spot.max_run_seconds == 8 * 3600  # default.toml: 8 h
    assert spot.service_account == "tpuserve-guard@tpuserve-placeholder.iam.gserviceaccount.com"
    assert guard_target(deployments["ondemand"]) is not None
    assert guard_target(deployments["flex"]) is None  # flex stops by itself (SPEC 2)
    off = deployments["spot"].model_copy(update={
        "stack": deployments["spot"].stack.model_copy(update={"max_run_hours": 0})})
    assert guard_target(off) is None
    assert guard_seconds(0.5) == 1800 and guard_seconds(1e-6) == 1  # never rounds to off


def test_the_task_is_a_one_shot_delete_as_the_guard_account(apis: Apis) -> None:
    created = dt.datetime.fromtimestamp(CREATED, dt.UTC)
    task = build_task(apis.target, created)
    name = task.pop("name")
    assert re.fullmatch(rf"{apis.d.guard_queue}/tasks/tpuserve-spot-{CREATED}-[0-9a-f]{{8}}",
                        name)
    assert task == {
        "scheduleTime": "2026-01-01T08:00:00Z",
        "httpRequest": {
            "url": "https://tpu.googleapis.com/v2/projects/tpuserve-placeholder/locations/"
                   "us-west4-a/nodes/tpuserve-spot",
            "httpMethod": "DELETE",
            "oauthToken": {
                "serviceAccountEmail": "tpuserve-guard@tpuserve-placeholder.iam."
                                       "gserviceaccount.com",
                "scope": "https://www.googleapis.com/auth/cloud-platform",
            },
        },
    }


def test_arming_creates_one_task_at_create_time_plus_max_run_and_is_idempotent(
    apis: Apis,
) -> None:
    apis.seed_node(CREATED)
    apis.clock.t = CREATED + 300  # armed five minutes after the node was created
    first = apis.arm()
    assert first.created and first.removed == ()
    assert first.deadline == dt.datetime(2026, 1, 1, 8, tzinfo=dt.UTC)
    before = dt.datetime(2026, 1, 1, 7, 59, tzinfo=dt.UTC)
    assert first.describe(before) == "billing guard armed: deletes the node at 2026-01-01T08:00:00Z"
    after = dt.datetime(2026, 1, 1, 8, tzinfo=dt.UTC)
    assert "(already past: Cloud Tasks runs it now)" in first.describe(after)
    again = apis.arm()
    assert not again.created and again.task == first.task
    assert apis.tasks.task_names() == [first.task]
    posts = [r for r in apis.tasks.requests if r[0] == "POST"]
    assert len(posts) == 1
    sent = json.loads(posts[0][2])
    # The arming shell's CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU (the fake) is not the task's.
    assert apis.env["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"] == apis.tpu.url
    assert sent["task"]["httpRequest"]["url"] == f"{TPU_API}v2/{apis.d.node_path}"


def test_a_recreated_node_is_re_armed_and_the_old_deadline_removed(apis: Apis) -> None:
    apis.seed_node(CREATED)
    old = apis.arm()
    apis.seed_node(CREATED + 7200)  # replaced two hours later under the same name
    new = apis.arm()
    assert new.created and new.removed == (old.task,)
    assert apis.tasks.task_names() == [new.task]
    assert new.deadline == dt.datetime(2026, 1, 1, 10, tzinfo=dt.UTC)


def test_the_task_deletes_the_node_at_its_deadline_and_not_before(apis: Apis) -> None:
    apis.seed_node(CREATED)
    apis.arm()
    tokens: list[str] = []

    def token_for(email: str) -> str:
        tokens.append(email)
        return "guard-token"

    assert apis.tasks.run_due(CREATED + 8 * 3600 - 1, token_for=token_for) == []
    assert apis.tpu.calls("DELETE") == []
    [fired] = apis.tasks.run_due(CREATED + 8 * 3600, token_for=token_for)
    assert (fired.method, fired.status) == ("DELETE", 200)
    assert tokens == [apis.d.guard_service_account_email]
    assert [r.path for r in apis.tpu.calls("DELETE")] == [f"/v2/{apis.d.node_path}"]
    assert apis.tpu.nodes[apis.d.node_path].state == "DELETING"


def test_disarm_deletes_this_nodes_tasks_only(apis: Apis) -> None:
    apis.seed_node(CREATED)
    mine = apis.arm()
    other = GuardTarget(apis.target.node.replace("tpuserve-spot", "tpuserve-ondemand"),
                        apis.target.queue, apis.target.service_account, 3600)
    apis.tpu.seed_node(apis.d.gcp.project, apis.d.gcp.zone, "tpuserve-ondemand")
    theirs = arm(other, tasks=CloudTasks(environ=apis.env),
                 tpu=GoogleApi("tpu", "https://tpu.googleapis.com/", environ=apis.env))
    assert disarm(apis.target, tasks=CloudTasks(environ=apis.env)) == [mine.task]
    assert apis.tasks.task_names() == [theirs.task]
    assert disarm(apis.target, tasks=CloudTasks(environ=apis.env)) == []


def test_no_node_or_no_queue_is_a_one_line_error(apis: Apis) -> None:
    with pytest.raises(GuardError, match="does not exist: nothing to guard"):
        apis.arm()
    apis.seed_node(CREATED)
    apis.tasks.queues.clear()
    with pytest.raises(GuardError, match=r"404 NOT_FOUND.*tombstone.*gcp.deployment"):
        apis.arm()


def test_the_entry_point_arms_and_disarms_from_its_environment(apis: Apis) -> None:
    apis.seed_node(CREATED)
    env = {**apis.env, ENV_NODE: apis.target.node, ENV_QUEUE: apis.target.queue,
           ENV_SERVICE_ACCOUNT: apis.target.service_account, ENV_SECONDS: "3600"}
    out, err = io.StringIO(), io.StringIO()
    assert main(["arm"], environ=env, stdout=out, stderr=err) == 0, err.getvalue()
    assert "armed: deletes the node at 2026-01-01T01:00:00Z" in out.getvalue()
    assert main(["disarm"], environ=env, stdout=out, stderr=err) == 0
    assert apis.tasks.task_names() == []
    bad = {**env, ENV_SECONDS: "8h"}
    assert main(["arm"], environ=bad, stdout=out, stderr=err) == 2
    assert f"{ENV_SECONDS} = '8h'" in err.getvalue()
    missing = {k: v for k, v in env.items() if k != ENV_QUEUE}
    assert main(["arm"], environ=missing, stdout=out, stderr=err) == 2
    assert f"missing {ENV_QUEUE}" in err.getvalue()


# -------------------------------------------------------------------------- the task's target
# Values of the arming shell that must never reach the task Cloud Tasks runs in Google's cloud.
HOSTILE_SHELL = {
    "GOOGLE_CLOUD_QUOTA_PROJECT": "canary-quota-project",
    "CLOUDSDK_BILLING_QUOTA_PROJECT": "canary-billing-quota",
    "CLOUDSDK_CORE_PROJECT": "canary-core-project",
    "HTTPS_PROXY": "http://canary-proxy.invalid:3128",
    "NO_PROXY": "canary-no-proxy.invalid",
    "GOOGLE_APPLICATION_CREDENTIALS": "/canary/credentials.json",
    "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": "https://canary-compute.invalid/",
    "TPUSERVE_TIME_SCALE": "0.000317",
}


def _guard_env(apis: Apis, **extra: str) -> dict[str, str]:
    return {**apis.env, ENV_NODE: apis.target.node, ENV_QUEUE: apis.target.queue,
            ENV_SERVICE_ACCOUNT: apis.target.service_account, ENV_SECONDS: "3600", **extra}


def _posted_tasks(apis: Apis) -> list[dict[str, Any]]:
    return [json.loads(body)["task"] for method, _path, body in apis.tasks.requests
            if method == "POST"]


def test_the_arming_shell_reaches_neither_the_task_nor_its_token(apis: Apis) -> None:
    apis.seed_node(CREATED)
    env = _guard_env(apis, **HOSTILE_SHELL)
    out, err = io.StringIO(), io.StringIO()
    assert main(["arm"], environ=env, stdout=out, stderr=err) == 0, err.getvalue()
    [task] = _posted_tasks(apis)
    # The arming calls went to the fakes (the shell's overrides), the task names Google's API.
    assert env["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"] == apis.tpu.url and apis.tpu.calls("GET")
    assert task["httpRequest"] == {
        "url": f"{TPU_API}v2/{apis.target.node}", "httpMethod": "DELETE",
        "oauthToken": {"serviceAccountEmail": apis.target.service_account,
                       "scope": "https://www.googleapis.com/auth/cloud-platform"}}
    text = json.dumps(task)
    for value in (*HOSTILE_SHELL.values(), apis.tpu.url, apis.tasks.url, TOKEN):
        assert value not in text, value
    # Google's network delivers it to the TPU API: the node is deleted at its deadline.
    [fired] = apis.tasks.run_due(CREATED + 3600, token_for=lambda _e: "guard-token")
    assert fired.status == 200 and apis.tpu.nodes[apis.d.node_path].state == "DELETING"


def test_a_task_aimed_at_a_host_of_the_callers_shell_never_deletes_the_node(apis: Apis) -> None:
    """What the old code armed (the task's URL = CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU): Google's
    dispatcher cannot reach that host, so the node outlives its deadline."""
    apis.seed_node(CREATED)
    task = build_task(apis.target, dt.datetime.fromtimestamp(CREATED, dt.UTC))
    task["httpRequest"]["url"] = f"{apis.tpu.url}v2/{apis.target.node}"
    CloudTasks(environ=apis.env).create_task(apis.target.queue, task)
    [fired] = apis.tasks.run_due(CREATED + 8 * 3600, token_for=lambda _e: "guard-token")
    assert fired.status == 0  # not delivered
    assert apis.tpu.calls("DELETE") == [] and apis.tpu.nodes[apis.d.node_path].state == "READY"


PSC = "https://tpu-guard.p.googleapis.com/"


def test_the_task_calls_the_private_service_connect_endpoint_the_stack_names(
    apis: Apis,
) -> None:
    apis.seed_node(CREATED)
    apis.tasks.route(PSC, apis.tpu.url)
    env = _guard_env(apis, **{ENV_TPU_ENDPOINT: PSC.rstrip("/")})
    out, err = io.StringIO(), io.StringIO()
    assert main(["arm"], environ=env, stdout=out, stderr=err) == 0, err.getvalue()
    [task] = _posted_tasks(apis)
    assert task["httpRequest"]["url"] == f"{PSC}v2/{apis.target.node}"
    [fired] = apis.tasks.run_due(CREATED + 3600, token_for=lambda _e: "guard-token")
    assert fired.status == 200 and apis.tpu.nodes[apis.d.node_path].state == "DELETING"


@pytest.mark.parametrize("value", [
    "http://tpu-guard.p.googleapis.com/", "https://127.0.0.1:8443/", "https://tpu.example.com/",
    "https://tpu-guard.p.googleapis.com.evil.example/", "https://tpu-guard.p.googleapis.com/v2/",
    "https://user@tpu-guard.p.googleapis.com/", "https://tpu-guard.p.googleapis.com:444/",
])
def test_a_task_endpoint_that_is_not_google_production_or_psc_is_refused(
    apis: Apis, value: str,
) -> None:
    apis.seed_node(CREATED)
    out, err = io.StringIO(), io.StringIO()
    assert main(["arm"], environ=_guard_env(apis, **{ENV_TPU_ENDPOINT: value}), stdout=out,
                stderr=err) == 2
    [line] = err.getvalue().splitlines()
    assert f"{ENV_TPU_ENDPOINT} = {value!r}" in line and ".p.googleapis.com" in line
    assert apis.tasks.requests == []  # refused before any call
    # Disarm builds no task: it does not read the endpoint at all.
    assert main(["disarm"], environ=_guard_env(apis, **{ENV_TPU_ENDPOINT: value}), stdout=out,
                stderr=err) == 0


def test_the_setting_reaches_the_target_and_the_target_refuses_other_hosts(
    deployments: dict[str, Deployment],
) -> None:
    d = deployments["spot"]
    psc = d.model_copy(update={"gcp": d.gcp.model_copy(update={"tpu_api_endpoint": PSC})})
    target = guard_target(psc)
    assert target is not None and target.tpu_endpoint == PSC
    assert guard_target(d).tpu_endpoint == TPU_API  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="billing guard TPU endpoint"):
        GuardTarget(target.node, target.queue, target.service_account, 60,
                    "http://127.0.0.1:9/")


def test_a_changed_endpoint_or_deadline_re_arms_under_a_new_name(apis: Apis) -> None:
    """Cloud Tasks keeps a deleted task's name for about an hour: a task that changes must get
    a new name, or its create is a 409 and the node is left with no (or the old) task."""
    apis.seed_node(CREATED)
    first = apis.arm()
    psc = GuardTarget(apis.target.node, apis.target.queue, apis.target.service_account,
                      apis.target.max_run_seconds, PSC)
    moved = arm(psc, tasks=CloudTasks(environ=apis.env),
                tpu=GoogleApi("tpu", TPU_API, environ=apis.env))
    assert moved.created and moved.removed == (first.task,) and moved.task != first.task
    sooner = GuardTarget(psc.node, psc.queue, psc.service_account, 3600, PSC)
    again = arm(sooner, tasks=CloudTasks(environ=apis.env),
                tpu=GoogleApi("tpu", TPU_API, environ=apis.env))
    assert again.created and again.removed == (moved.task,)
    [name] = apis.tasks.task_names()
    assert apis.tasks.tasks[name].schedule_time == dt.datetime(2026, 1, 1, 1, tzinfo=dt.UTC)


def test_a_task_armed_by_the_old_code_at_the_callers_endpoint_is_replaced(apis: Apis) -> None:
    apis.seed_node(CREATED)
    legacy = build_task(apis.target, dt.datetime.fromtimestamp(CREATED, dt.UTC))
    legacy["name"] = f"{apis.target.queue}/tasks/tpuserve-spot-{CREATED}"  # the old id
    legacy["httpRequest"]["url"] = f"{apis.tpu.url}v2/{apis.target.node}"
    CloudTasks(environ=apis.env).create_task(apis.target.queue, legacy)
    result = apis.arm()
    assert result.created and result.removed == (legacy["name"],)
    [name] = apis.tasks.task_names()
    assert apis.tasks.tasks[name].http_request["url"] == f"{TPU_API}v2/{apis.target.node}"


def test_a_task_name_kept_by_cloud_tasks_is_not_taken_for_a_guard(apis: Apis) -> None:
    """Disarm then arm the same task within the hour (`terraform apply -replace`): the name is
    refused with 409 and no task is queued. That is not "already armed": a new name is."""
    apis.seed_node(CREATED)
    armed = apis.arm()
    assert disarm(apis.target, tasks=CloudTasks(environ=apis.env)) == [armed.task]
    again = apis.arm()
    assert again.created and again.task != armed.task
    assert apis.tasks.task_names() == [again.task]
    assert not apis.arm().created  # and that one is found next time
    for _ in range(NAME_TRIES):  # every name used: one line, never a silent "armed"
        disarm(apis.target, tasks=CloudTasks(environ=apis.env))
        try:
            apis.arm()
        except GuardError as exc:
            assert "409 ALREADY_EXISTS" in str(exc) and "WITHOUT its billing guard" in str(exc)
            break
    else:
        pytest.fail("arming never ran out of names")
    assert apis.tasks.task_names() == []


# -------------------------------------------------------------------------- one overall deadline


@pytest.mark.parametrize(("command", "mode"), [("arm", "trickle"), ("arm", "hang"),
                                               ("disarm", "trickle")])
def test_a_run_ends_at_its_overall_deadline(apis: Apis, monkeypatch, command: str,
                                            mode: str) -> None:
    """Cloud Tasks answering a byte at a time (or not at all): the run's one deadline cuts
    it, one line naming the bound (on the old code each call had 30 s a try, 120 s of
    retries, and a run as many calls as the task list has pages)."""
    from tests.fakes.hostile_server import HostileServer, finishes_within
    from tpuserve import billing_guard

    monkeypatch.setattr(billing_guard, "DEADLINE_S", 2.0, raising=False)
    apis.seed_node(CREATED)
    with HostileServer(mode, interval_s=0.2) as root:
        env = _guard_env(apis, CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDTASKS=f"{root}/",
                         TPUSERVE_TIME_SCALE="0")
        out, err = io.StringIO(), io.StringIO()
        code = finishes_within(25, lambda: main([command], environ=env, stdout=out, stderr=err))
    assert (code, out.getvalue()) == (1, "")
    line = err.getvalue()
    assert line.count("\n") == 1 and line.startswith(f"tpuserve: billing guard {command}: ")
    assert "DEADLINE_EXCEEDED" in line and "within 2 s in all (its overall deadline)" in line


# -------------------------------------------------------------------------- a list proves nothing
@pytest.mark.parametrize(("command", "answer", "said"), [
    ("disarm", '{"tasks": null}', "'tasks' is null, not a list"),
    ("disarm", '{"tasks": "x"}', "'tasks' is a string, not a list"),
    ("disarm", '{"tasks": [7]}', "'tasks' holds a number, not an object"),
    ("disarm", '{"tasks": [], "nextPageToken": 7}', "nextPageToken is a number"),
    ("disarm", '{"tasks": [], "nextPageToken": "same"}', "repeated page token 'same'"),
    ("arm", '{"tasks": null}', "'tasks' is null, not a list"),
])
def test_a_task_list_that_is_not_the_documented_answer_proves_nothing(
        apis: Apis, command: str, answer: str, said: str) -> None:
    """A ListTasksResponse that is not one is not "no tasks": disarm would report a queue it
    never read as clean (a task left there deletes a new node of the same name at the old
    deadline), arm would leave an old deadline in place. On the old code `null` was a
    traceback, a string or [7] counted as no tasks, and a repeated token looped for ever."""
    from werkzeug import Response

    from tests.fakes.hostile_server import finishes_within
    from tests.fakes.metadata import LoopbackServer

    apis.seed_node(CREATED)
    server = LoopbackServer(lambda _r: Response(answer, 200, mimetype="application/json"))
    server.start()
    try:
        env = _guard_env(apis, CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDTASKS=(
            f"http://127.0.0.1:{server.port}/"), TPUSERVE_TIME_SCALE="0")
        out, err = io.StringIO(), io.StringIO()
        code = finishes_within(25, lambda: main([command], environ=env, stdout=out, stderr=err))
    finally:
        server.stop()
    assert (code, out.getvalue()) == (1, "")
    line = err.getvalue()
    assert line.count("\n") == 1 and line.startswith(f"tpuserve: billing guard {command}: ")
    assert said in line and "list the billing guard tasks" in line


@pytest.mark.parametrize("name", ["projects/proj-test-1/locations/us-west4-a/nodes/another",
                                  None])
def test_arm_refuses_a_node_answer_that_is_another_node(apis: Apis, name: str | None) -> None:
    """Another node's createTime (or an answer naming none) would set this node's deadline:
    one line, no task (on the old code the task was armed at the stranger's deadline)."""
    apis.seed_node(CREATED)
    stranger = {"createTime": "2020-01-01T00:00:00Z", "state": "READY",
                **({"name": name} if name else {})}
    apis.tpu.answer_next(200, json.dumps(stranger), method="GET")
    out, err = io.StringIO(), io.StringIO()
    code = main(["arm"], environ=_guard_env(apis), stdout=out, stderr=err)
    assert (code, out.getvalue()) == (1, "")
    shown = repr(name) if name else "missing"
    assert err.getvalue() == (f"tpuserve: billing guard arm: get node {apis.target.node}: 200 "
                              f"OK: the answer is not node {apis.target.node} (its name is "
                              f"{shown}): it proves nothing\n")
    assert apis.tasks.task_names() == []
