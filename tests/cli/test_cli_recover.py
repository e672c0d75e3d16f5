"""`tpuserve recover`: delete what is dead, re-run the deployment, bounded retries."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_support import (
    API_KEY,
    PROJECT,
    ZONE,
    Env,
    assert_one_line_error,
    invoke,
)
from tests.fakes.cloud_tasks import FakeCloudTasks
from tpuserve.gcp.tpu.client import TpuClient
from tpuserve.ops import recovery
from tpuserve.ops.errors import EXIT_INTERRUPTED, OpsError


@pytest.fixture(autouse=True)
def tasks(cli_env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCloudTasks]:
    """The Cloud Tasks API the billing guard is armed in, with the deployment's queue."""
    with FakeCloudTasks(token=cli_env.tpu.token) as fake:
        fake.add_queue(cli_env.d("spot").guard_queue)
        for name, value in fake.environ().items():
            monkeypatch.setenv(name, value)
        yield fake


class Deployer:
    """Stands in for `npx cdktf deploy STACK`: what Terraform would create, in the fake."""

    def __init__(self, env: Env, *, fail_times: int = 0) -> None:
        self.env, self.fail_times, self.calls = env, fail_times, []

    def __call__(self, stack: str, log: recovery.Log) -> int:
        self.calls.append(stack)
        # Recovery must have deleted the dead resource before redeploying.
        d = self.env.d(stack)
        if stack == "flex":
            assert self.env.tpu.state_of(d.node_name) is None
        else:
            assert f"projects/{PROJECT}/locations/{ZONE}/nodes/{d.node_name}" not in (
                self.env.tpu.nodes)
        log("terraform: apply complete")
        if len(self.calls) <= self.fail_times:
            return 1
        if stack == "flex":
            self.env.tpu.seed_queued_resource(PROJECT, ZONE, d.node_name, state="ACCEPTED")
        else:
            self.env.tpu.seed_node(PROJECT, ZONE, d.node_name, state="CREATING")
        return 0


# A TERMINATED spot VM cannot be started again: recovered like a PREEMPTED one.
@pytest.mark.parametrize("lost", ["PREEMPTED", "TERMINATED"])
def test_preempted_spot_node_is_deleted_then_redeployed(cli_env: Env, tasks: FakeCloudTasks,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        lost: str) -> None:
    d = cli_env.seed_ready("spot")
    cli_env.tpu.set_node_state(d.node_name, lost)
    deployer = Deployer(cli_env)
    monkeypatch.setattr("tpuserve.cli.common.deploy_runner", lambda: deployer)
    result = invoke("recover", "spot", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["action"] == "recovered" and doc["attempts"] == 1
    assert doc["reason"] == f"node {lost}"
    assert deployer.calls == ["spot"]
    assert [c.method for c in cli_env.tpu.calls("DELETE")] == ["DELETE"]
    assert f"deleting node tpuserve-spot ({lost})" in result.stderr
    assert "tpuserve wait spot" in result.stderr
    # The new node's billing guard is armed: one task, at its createTime + 8 h.
    assert doc["guard"].startswith("billing guard armed: deletes the node at ")
    [task] = tasks.task_names()
    created = cli_env.tpu.nodes[f"projects/{PROJECT}/locations/{ZONE}/nodes/{d.node_name}"].created
    assert re.search(rf"/tasks/tpuserve-spot-{int(created)}-[0-9a-f]{{8}}$", task)
    # The CLI reaches the fake TPU API through the shell's endpoint override; the task that
    # runs in Google's cloud calls Google's API.
    assert os.environ["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"] == cli_env.tpu.url
    assert tasks.tasks[task].http_request["url"] == (
        f"https://tpu.googleapis.com/v2/projects/{PROJECT}/locations/{ZONE}/nodes/{d.node_name}")


def test_suspended_flex_queued_resource_is_replaced(cli_env: Env,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    d = cli_env.seed_ready("flex")
    cli_env.tpu.set_state(d.node_name, "SUSPENDED")
    deployer = Deployer(cli_env)
    monkeypatch.setattr("tpuserve.cli.common.deploy_runner", lambda: deployer)
    result = invoke("recover", "flex")
    assert result.exit_code == 0, result.stderr
    (delete,) = cli_env.tpu.calls("DELETE", "/queuedResources/")
    assert delete.query.get("force") == "true"
    assert deployer.calls == ["flex"]
    assert cli_env.tpu.state_of(d.node_name) == "ACCEPTED"
    assert "recovered (queued resource ACCEPTED)" in result.stderr
    assert "billing guard" not in result.stderr  # flex-start stops by itself (SPEC 2)


def test_healthy_stack_is_left_alone_and_its_guard_re_armed(
    cli_env: Env, tasks: FakeCloudTasks, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cli_env.seed_ready("ondemand")
    deployer = Deployer(cli_env)
    monkeypatch.setattr("tpuserve.cli.common.deploy_runner", lambda: deployer)
    result = invoke("recover", "ondemand", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["action"] == "none" and doc["guard"].startswith("billing guard armed")
    assert deployer.calls == [] and cli_env.tpu.calls("DELETE") == []
    [task] = tasks.task_names()
    again = json.loads(invoke("recover", "ondemand", "--json").stdout)
    assert again["guard"].startswith("billing guard already armed")
    assert tasks.task_names() == [task]


def test_a_guard_that_cannot_be_armed_is_a_one_line_error(
    cli_env: Env, tasks: FakeCloudTasks,
) -> None:
    cli_env.seed_ready("spot")
    tasks.queues.clear()  # the queue is gone (destroyed, or never deployed)
    result = invoke("recover", "spot")
    assert_one_line_error(result, "WITHOUT its billing guard", "404 NOT_FOUND",
                          "tombstone")


def test_missing_node_is_not_recreated_behind_the_billing_guard(cli_env: Env,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                ) -> None:
    deployer = Deployer(cli_env)
    monkeypatch.setattr("tpuserve.cli.common.deploy_runner", lambda: deployer)
    result = invoke("recover", "spot")
    assert result.exit_code == 0
    assert "billing guard may have deleted it" in result.stderr and deployer.calls == []


def test_retries_are_bounded(cli_env: Env) -> None:
    d = cli_env.seed_ready("spot")
    cli_env.tpu.set_node_state(d.node_name, "PREEMPTED")
    deployer = Deployer(cli_env, fail_times=99)
    pauses: list[float] = []
    logs: list[str] = []
    with pytest.raises(OpsError) as err:
        recovery.recover(d, tpu=TpuClient(), deploy=deployer, retries=3,
                         backoff_s=(5, 7), sleep=pauses.append, log=logs.append)
    assert deployer.calls == ["spot"] * 3
    assert pauses == [5, 7]  # between attempts, none after the last
    assert "3 attempt(s) failed" in err.value.line and "exited with status 1" in err.value.line
    assert sum("failed: the deployment exited with status 1" in m for m in logs) == 3


def test_a_failed_attempt_is_retried(cli_env: Env) -> None:
    d = cli_env.seed_ready("spot")
    cli_env.tpu.set_node_state(d.node_name, "PREEMPTED")
    deployer = Deployer(cli_env, fail_times=1)
    result = recovery.recover(d, tpu=TpuClient(), deploy=deployer,
                              retries=3, sleep=lambda _s: None)
    assert result.action == "recovered" and result.attempts == 2


def test_cli_reports_exhausted_retries_as_one_line(cli_env: Env,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    d = cli_env.seed_ready("spot")
    cli_env.tpu.set_node_state(d.node_name, "PREEMPTED")
    monkeypatch.setattr("tpuserve.cli.common.deploy_runner",
                        lambda: Deployer(cli_env, fail_times=9))
    result = invoke("recover", "spot", "--retries", "1")
    assert_one_line_error(result, "recover spot: 1 attempt(s) failed", "npx cdktf deploy spot")


# ---------------------------------------------------------------- the real deploy runner


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "deploy.py"
    path.write_text(body)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(path))} {{stack}}"


def test_deploy_command_is_injectable_and_gets_no_api_key(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "import os, sys\n"
                  "print('deploying', sys.argv[1])\n"
                  "print('key:', os.environ.get('OPENAI_API_KEY'))\n"
                  "sys.exit(3)\n")
    env = {**os.environ, recovery.DEPLOY_COMMAND_ENV: cmd, "OPENAI_API_KEY": API_KEY}
    logs: list[str] = []
    rc = recovery.run_deploy("flex", logs.append, environ=env, cwd=tmp_path)
    assert rc == 3
    assert "  deploying flex" in logs
    assert "  key: None" in logs  # secrets of this process never reach the child
    assert logs[0].startswith("running: ") and logs[0].endswith("flex")


def test_default_deploy_command() -> None:
    assert recovery.deploy_argv("spot", {}) == ["npx", "cdktf", "deploy", "spot",
                                                "--auto-approve"]


def test_missing_deploy_tool_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, recovery.DEPLOY_COMMAND_ENV: "/nonexistent/cdktf deploy {stack}"}
    with pytest.raises(OpsError) as err:
        recovery.run_deploy("spot", lambda _m: None, environ=env, cwd=tmp_path)
    assert "cannot run the deployment" in err.value.line
    assert recovery.DEPLOY_COMMAND_ENV in err.value.line


def test_ctrl_c_stops_the_deployment_gracefully(tmp_path: Path) -> None:
    """SIGINT is forwarded to the deployment and waited for: Terraform saves its state."""
    marker = tmp_path / "stopped"
    cmd = _script(tmp_path, "import signal, sys, time, pathlib\n"
                  "def stop(*_):\n"
                  f"    pathlib.Path({str(marker)!r}).write_text('graceful')\n"
                  "    sys.exit(0)\n"
                  "signal.signal(signal.SIGINT, stop)\n"
                  "print('applying', flush=True)\n"
                  "time.sleep(30)\n")
    env = {**os.environ, recovery.DEPLOY_COMMAND_ENV: cmd}
    logs: list[str] = []

    def log(msg: str) -> None:
        logs.append(msg)
        if msg == "  applying":
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, reaching only us

    # Python's own Ctrl-C handler, as in a fresh `tpuserve` process: in two serial runs of the
    # whole suite (never alone, never under xdist) the signal did not interrupt the deployment;
    # a handler left behind in this long-lived process must not swallow it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(OpsError) as err:
            recovery.run_deploy("spot", log, environ=env, cwd=tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert err.value.exit_code == EXIT_INTERRUPTED
    assert marker.read_text() == "graceful"  # the child finished its own shutdown first
    assert any("stop gracefully" in m for m in logs)
