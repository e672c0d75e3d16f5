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
fake, a proxy) would get the token and never delete the node. The arming calls
themselves (read the node, create the task) are the caller's and follow its overrides.

Used by the TPU VM stacks' `terraform_data.billing_guard` provisioners
(`python -m tpuserve.billing_guard arm|disarm`, tpuserve/billing_guard.py: its inputs, its one
deadline for every call beneath a run, its exit codes) and by `tpuserve recover`, which
re-arms after replacing a node. The target and the task's shape: tpuserve/render/guard_task.py.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuserve.gcp.api import GoogleApi, UnprovenAnswer
from tpuserve.gcp.endpoints import TPU_API
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.tpu.listing import pages
from tpuserve.render.guard_task import (
    NODE_RE,
    GuardTarget,
    build_task,
    guard_seconds,
    guard_target,
    rfc3339,
)

__all__ = ["ArmResult", "CloudTasks", "GuardApi", "GuardError", "GuardTarget", "arm",
           "build_task", "disarm", "guard_seconds", "guard_target", "parse_time"]

CLOUD_TASKS_API = "https://cloudtasks.googleapis.com/"
TASKS_VERSION = "v2"
# What follows `<node>-` in a guard task's id: the createTime epoch, then (in newer ids) an
# 8-hex digest of the task; ids of either form are this node's tasks.
_TASK_SUFFIX_RE = re.compile(r"\d+(?:-[0-9a-f]{8})?")
# Names tried for one task: a name Cloud Tasks still keeps (deleted or run within the hour)
# is refused with 409, so the same task is named anew (a salt in its digest).
NAME_TRIES = 4


class GuardError(Exception):
    """The guard cannot be armed; `str()` is one line saying why and what to do."""


def parse_time(text: str) -> dt.datetime:
    """An RFC 3339 timestamp as the TPU API writes createTime (nanoseconds allowed)."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", text)
    if not m:
        raise GuardError(f"createTime {text!r}: not an RFC 3339 timestamp")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return dt.datetime.fromisoformat(m.group(1) + zone)


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
            if exc.proves_not_found:
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
        if exc.proves_not_found:
            return None
        raise
    m = NODE_RE.fullmatch(target.node)
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
