"""Arm and disarm the billing guard: one Cloud Tasks task per node, off the node.

The task deletes the node through the TPU API at `createTime + max_run_hours`, with an OAuth
token of the guard service account (stacks/guard.py says why this design). Arming is
idempotent and keyed on the live node and on the task itself: the task id is
`<node>-<createTime epoch>-<digest of the task's deadline and request>`, so arming the same
node twice is a no-op, while a node recreated under the same name, a new max run or a new
endpoint gets a new task and the node's other tasks are deleted (an old node's task would
delete the new node at the old deadline). A new task needs a new name: Cloud Tasks keeps a
deleted or run task's name for about an hour.

The task calls `https://tpu.googleapis.com/`, or the Private Service Connect endpoint of
`[gcp] tpu_api_endpoint` (TPUSERVE_GUARD_TPU_ENDPOINT, set by the stack from the validated
setting): never an endpoint override of the arming shell. The task runs in Google's cloud and
Cloud Tasks sends the guard account's token with it, so a host inherited from the caller (a
fake, a proxy) would get the token and never delete the node (issue 22). The arming calls
themselves (read the node, create the task) are the caller's and follow its overrides.

Used by the TPU VM stacks' `terraform_data.billing_guard` provisioners
(`python -m tpuserve.billing_guard arm|disarm`, inputs in TPUSERVE_GUARD_* variables) and by
`tpuserve recover`, which re-arms after replacing a node.

One run of `arm` or `disarm` ends within DEADLINE_S (300 s): every call beneath it (the node's
read, the task list's pages, each create and delete), its retries and each try's last byte
included, is bounded by it (the edge's `deadline_within`); Terraform's local-exec has no
timeout of its own. A call cut by it is one line naming the bound, exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from tpuserve.facts import CLOUD_PLATFORM_SCOPE
from tpuserve.gcp.api import GoogleApi, UnprovenAnswer
from tpuserve.gcp.endpoints import TPU_API, guard_task_root
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.tpu.listing import pages

CLOUD_TASKS_API = "https://cloudtasks.googleapis.com/"
TASKS_VERSION = "v2"
# Cloud Tasks refuses a scheduleTime more than 30 days ahead (config: max_run_hours <= 720).
MAX_SCHEDULE_S = 30 * 24 * 3600
# One arm or disarm run's bound, every call and retry beneath it included (the edge caps one try
# at 30 s and one call's retries at 120 s).
DEADLINE_S = 300.0

ENV_NODE = "TPUSERVE_GUARD_NODE"  # projects/P/locations/Z/nodes/N
ENV_QUEUE = "TPUSERVE_GUARD_QUEUE"  # projects/P/locations/R/queues/Q
ENV_SERVICE_ACCOUNT = "TPUSERVE_GUARD_SERVICE_ACCOUNT"  # the guard's email
ENV_SECONDS = "TPUSERVE_GUARD_MAX_RUN_SECONDS"
# The root the task calls (the stack sets it from [gcp] tpu_api_endpoint); unset: production.
ENV_TPU_ENDPOINT = "TPUSERVE_GUARD_TPU_ENDPOINT"
# What follows `<node>-` in a guard task's id: the createTime epoch, then (since issue 22) an
# 8-hex digest of the task; ids of either form are this node's tasks.
_TASK_SUFFIX_RE = re.compile(r"\d+(?:-[0-9a-f]{8})?")
# Names tried for one task: a name Cloud Tasks still keeps (deleted or run within the hour)
# is refused with 409, so the same task is named anew (a salt in its digest).
NAME_TRIES = 4

_NODE_RE = re.compile(r"projects/([a-z][a-z0-9-]{4,28}[a-z0-9])/locations/([a-z0-9-]+)/nodes/"
                      r"([a-z]([-a-z0-9]{0,61}[a-z0-9])?)")
_QUEUE_RE = re.compile(r"projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/locations/[a-z0-9-]+/queues/"
                       r"[A-Za-z0-9-]{1,100}")
_EMAIL_RE = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]\."
                       r"iam\.gserviceaccount\.com")


class GuardError(Exception):
    """The guard cannot be armed; `str()` is one line saying why and what to do."""


@dataclass(frozen=True)
class GuardTarget:
    """One node's guard: which node, which queue, as whom, after how long."""

    node: str
    queue: str
    service_account: str
    max_run_seconds: int
    tpu_endpoint: str = TPU_API  # the root the task calls: production or a PSC endpoint

    def __post_init__(self) -> None:
        if guard_task_root("billing guard TPU endpoint", self.tpu_endpoint) != self.tpu_endpoint:
            raise ValueError(f"billing guard TPU endpoint {self.tpu_endpoint!r}: write it as "
                             "https://HOST/")
        for what, value, rule in (("node", self.node, _NODE_RE), ("queue", self.queue, _QUEUE_RE),
                                  ("service account", self.service_account, _EMAIL_RE)):
            if not rule.fullmatch(value):
                raise ValueError(f"billing guard {what} {value!r}: not a valid name")
        if not 0 < self.max_run_seconds <= MAX_SCHEDULE_S:
            raise ValueError(
                f"billing guard max run {self.max_run_seconds} s: must be 1 s to 30 days "
                "(Cloud Tasks schedules at most 30 days ahead)"
            )

    @property
    def node_id(self) -> str:
        return self.node.rsplit("/", 1)[1]


def guard_target(d: Any) -> GuardTarget | None:
    """The guard of a deployment (a settings Deployment), or None: flex stops by itself
    (SPEC 2) and max_run_hours = 0 turns the guard off."""
    if not d.has_billing_guard:
        return None
    return GuardTarget(d.node_path, d.guard_queue, d.guard_service_account_email,
                       guard_seconds(d.stack.max_run_hours),
                       guard_task_root("gcp.tpu_api_endpoint", d.gcp.tpu_api_endpoint))


def guard_seconds(max_run_hours: float) -> int:
    """At least one second: a fraction of an hour never rounds the guard off."""
    return max(1, round(max_run_hours * 3600))


def rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> dt.datetime:
    """An RFC 3339 timestamp as the TPU API writes createTime (nanoseconds allowed)."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", text)
    if not m:
        raise GuardError(f"createTime {text!r}: not an RFC 3339 timestamp")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return dt.datetime.fromisoformat(m.group(1) + zone)


def task_id(node_id: str, created: dt.datetime, digest: str) -> str:
    return f"{node_id}-{int(created.timestamp())}-{digest}"


def build_task(target: GuardTarget, created: dt.datetime, salt: int = 0) -> dict[str, Any]:
    """The Cloud Tasks `Task` (v2 REST shape) that deletes the node at its deadline. Pure:
    nothing in it comes from the environment (the URL is the target's tpu_endpoint). `salt`
    names the same task anew when Cloud Tasks still keeps the name (see arm)."""
    deadline = created + dt.timedelta(seconds=target.max_run_seconds)
    content = {
        "scheduleTime": rfc3339(deadline),
        "httpRequest": {
            "url": f"{target.tpu_endpoint}v2/{target.node}",
            "httpMethod": "DELETE",
            "oauthToken": {
                "serviceAccountEmail": target.service_account,
                "scope": CLOUD_PLATFORM_SCOPE,
            },
        },
    }
    keyed = {**content, "salt": salt} if salt else content
    digest = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:8]
    return {"name": f"{target.queue}/tasks/{task_id(target.node_id, created, digest)}",
            **content}


class CloudTasks(GoogleApi):
    """The three Cloud Tasks calls the guard makes (v2 REST)."""

    def __init__(self, *, environ: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__("cloudtasks", CLOUD_TASKS_API, environ=environ, **kwargs)

    def create_task(self, queue: str, task: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", f"{TASKS_VERSION}/{queue}/tasks", body={"task": dict(task)},
                            action=f"create the billing guard task in {queue}")

    def list_tasks(self, queue: str) -> list[dict[str, Any]]:
        """Every task of the queue, every page (ListTasksResponse: `tasks`, omitted when none,
        and `nextPageToken`). An answer that is not that shape (`tasks` null or not a list of
        objects, a token that is not a string or repeats) proves nothing: UnprovenAnswer, not
        "no tasks", so arm never leaves an old deadline in place and disarm never reports a
        queue it could not read as clean."""
        return list(pages(self, f"{TASKS_VERSION}/{queue}/tasks", "tasks",
                          action=f"list the billing guard tasks of {queue}", page_size=1000))

    def delete_task(self, name: str) -> bool:
        """True when deleted, False when it was gone already."""
        try:
            self.request("DELETE", f"{TASKS_VERSION}/{name}",
                         action=f"delete the billing guard task {name}")
        except ApiError as exc:
            if exc.code == 404:
                return False
            raise
        return True


@dataclass(frozen=True)
class ArmResult:
    task: str
    deadline: dt.datetime
    created: bool  # False: that node's task was there already
    removed: tuple[str, ...]  # stale tasks of earlier nodes with the same name

    def describe(self, now: dt.datetime | None = None) -> str:
        verb = "armed" if self.created else "already armed"
        stale = f"; removed {len(self.removed)} stale task(s)" if self.removed else ""
        now = now or dt.datetime.now(dt.UTC)
        past = " (already past: Cloud Tasks runs it now)" if self.deadline <= now else ""
        return (f"billing guard {verb}: deletes the node at {rfc3339(self.deadline)}{past}"
                f"{stale}")


def _node_tasks(tasks: CloudTasks, target: GuardTarget) -> list[str]:
    prefix = f"{target.queue}/tasks/{target.node_id}-"
    return [str(t["name"]) for t in tasks.list_tasks(target.queue)
            if str(t.get("name", "")).startswith(prefix)
            and _TASK_SUFFIX_RE.fullmatch(str(t["name"])[len(prefix):])]


def arm(target: GuardTarget, *, tasks: CloudTasks, tpu: GoogleApi) -> ArmResult:
    """Make sure exactly one task deletes the live node at createTime + max run."""
    data = _get_node(tpu, target)
    if data is None:
        raise GuardError(
            f"node {target.node} does not exist: nothing to guard (deploy the stack first)"
        )
    created = parse_time(str(data.get("createTime", "")))
    # never tpu.root: that is the caller's endpoint, not one Google's network reaches
    candidates = [build_task(target, created, salt) for salt in range(NAME_TRIES)]
    removed = []
    try:
        existing = _node_tasks(tasks, target)
        task = next((t for t in candidates if t["name"] in existing), None)
        made = task is None
        if task is None:
            task = _create_unused(tasks, target, candidates)
        # Only once the new deadline is in place: a failure never leaves the node unguarded.
        for name in existing:
            if name != task["name"]:
                tasks.delete_task(name)
                removed.append(name)
    except ApiError as exc:
        if exc.code == 404:
            raise GuardError(
                f"{exc}; the queue {target.queue} is missing: deploy the stack (it creates the "
                "queue); a queue deleted less than 3 days ago cannot be recreated under its "
                "name (Cloud Tasks' tombstone): wait, or set gcp.deployment"
            ) from None
        raise
    deadline = created + dt.timedelta(seconds=target.max_run_seconds)
    return ArmResult(str(task["name"]), deadline, made, tuple(removed))


def _create_unused(tasks: CloudTasks, target: GuardTarget,
                   candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """Create the first candidate whose name Cloud Tasks accepts. A 409 means the task was
    created meanwhile (queued: the node is guarded) or deleted or run within the hour (Cloud
    Tasks keeps the name, and nothing guards the node): then the next name."""
    for task in candidates:
        try:
            tasks.create_task(target.queue, task)
            return task
        except ApiError as exc:
            if exc.code != 409:
                raise
        if task["name"] in _node_tasks(tasks, target):
            return task
    raise GuardError(
        f"Cloud Tasks refused {len(candidates)} names for the task (409 ALREADY_EXISTS, none "
        "queued: it keeps a deleted or run task's name for about an hour), and the node runs "
        "WITHOUT its billing guard; re-arm later, or delete the node when done"
    )


def disarm(target: GuardTarget, *, tasks: CloudTasks) -> list[str]:
    """Delete every guard task of this node name (the stack is being destroyed)."""
    return [name for name in _node_tasks(tasks, target) if tasks.delete_task(name)]


def _get_node(tpu: GoogleApi, target: GuardTarget) -> dict[str, Any] | None:
    """The node, or None when it does not exist. A 200 proves it only with the node itself (its
    `name`; the project may be named by number): another node's createTime would set this
    one's deadline."""
    action = f"get node {target.node}"
    try:
        data = tpu.request("GET", f"v2/{target.node}", action=action)
    except ApiError as exc:
        if exc.code == 404:
            return None
        raise
    m = _NODE_RE.fullmatch(target.node)
    assert m is not None  # GuardTarget checked it
    name = data.get("name")
    if not (isinstance(name, str) and re.fullmatch(
            rf"projects/[^/]+/locations/{re.escape(m.group(2))}/nodes/{re.escape(m.group(3))}",
            name)):
        shown = repr(name)[:80] if name is not None else "missing"
        raise UnprovenAnswer(200, f"the answer is not node {target.node} (its name is {shown}): "
                             "it proves nothing", action=action, service=tpu.service)
    return data


class GuardApi:
    """Arms a deployment's guard with the caller's credentials (`tpuserve recover`)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ

    def arm(self, d: Any) -> str | None:
        """What was done, in words; None when the deployment has no guard."""
        target = guard_target(d)
        if target is None:
            return None
        tasks = CloudTasks(environ=self._environ)
        tpu = GoogleApi("tpu", TPU_API, environ=self._environ)
        return arm(target, tasks=tasks, tpu=tpu).describe()


# ----------------------------------------------------------------------------- entry point


def target_from_env(environ: Mapping[str, str], *, endpoint: bool = True) -> GuardTarget:
    """The target the stack's provisioner describes in TPUSERVE_GUARD_*. The task's endpoint
    comes from ENV_TPU_ENDPOINT only (unset: production), never from an endpoint override;
    `endpoint=False` (disarm, which builds no task) does not read it."""
    missing = [v for v in (ENV_NODE, ENV_QUEUE, ENV_SERVICE_ACCOUNT, ENV_SECONDS)
               if not environ.get(v)]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}: the stack's provisioner sets them")
    raw = environ[ENV_SECONDS]
    if not raw.isdigit():
        raise ValueError(f"{ENV_SECONDS} = {raw!r}: whole seconds")
    root = guard_task_root(ENV_TPU_ENDPOINT,
                           (environ.get(ENV_TPU_ENDPOINT) or None) if endpoint else None)
    return GuardTarget(environ[ENV_NODE], environ[ENV_QUEUE], environ[ENV_SERVICE_ACCOUNT],
                       int(raw), root)


def main(argv: list[str] | None = None, *, environ: Mapping[str, str] | None = None,
         stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    env = os.environ if environ is None else environ
    out, err = stdout or sys.stdout, stderr or sys.stderr
    parser = argparse.ArgumentParser(
        prog="python -m tpuserve.billing_guard",
        description="Arm or disarm a TPU node's billing guard (a Cloud Tasks task); used by "
                    f"the spot and on-demand stacks. Inputs: ${ENV_NODE}, ${ENV_QUEUE}, "
                    f"${ENV_SERVICE_ACCOUNT}, ${ENV_SECONDS}, ${ENV_TPU_ENDPOINT} (optional).",
    )
    parser.add_argument("command", choices=("arm", "disarm"))
    args = parser.parse_args(argv)
    hint = (f"billing guard {args.command} ends every call within {DEADLINE_S:g} s in all (its "
            "overall deadline): run it again once the API answers")
    try:
        target = target_from_env(env, endpoint=args.command == "arm")
        tasks = CloudTasks(environ=env)
        with contextlib.ExitStack() as bounds:
            bounds.enter_context(tasks.deadline_within(DEADLINE_S, hint=hint))
            if args.command == "arm":
                tpu = GoogleApi("tpu", TPU_API, environ=env)
                bounds.enter_context(tpu.deadline_within(DEADLINE_S, hint=hint))
                print(f"tpuserve: {target.node_id}: "
                      f"{arm(target, tasks=tasks, tpu=tpu).describe()}", file=out)
            else:
                removed = disarm(target, tasks=tasks)
                print(f"tpuserve: {target.node_id}: billing guard disarmed ({len(removed)} "
                      "task(s) deleted)", file=out)
    except ValueError as exc:
        print(f"tpuserve: {exc}", file=err)
        return 2
    except (ApiError, GuardError) as exc:
        print(f"tpuserve: billing guard {args.command}: {exc}", file=err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
