"""The billing guard's task, as the TPU VM stacks describe it and the guard program builds it.

The stack puts a node's GuardTarget into `terraform_data.billing_guard`'s input (and from there
the guard program's environment); the program turns it into the Cloud Tasks `Task` that
deletes the node at `createTime + max_run_hours` (tpuserve.gcp.billing_guard arms it). Both
take it from here, so they cannot drift. Pure: no API call, nothing from the environment.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from tpuserve.facts import CLOUD_PLATFORM_SCOPE
from tpuserve.gcp.endpoints import TPU_API, guard_task_root

# Cloud Tasks refuses a scheduleTime more than 30 days ahead (config: max_run_hours <= 720).
MAX_SCHEDULE_S = 30 * 24 * 3600

NODE_RE = re.compile(r"projects/([a-z][a-z0-9-]{4,28}[a-z0-9])/locations/([a-z0-9-]+)/nodes/"
                     r"([a-z]([-a-z0-9]{0,61}[a-z0-9])?)")
_QUEUE_RE = re.compile(r"projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/locations/[a-z0-9-]+/queues/"
                       r"[A-Za-z0-9-]{1,100}")
_EMAIL_RE = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]\."
                       r"iam\.gserviceaccount\.com")


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
        for what, value, rule in (("node", self.node, NODE_RE), ("queue", self.queue, _QUEUE_RE),
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
