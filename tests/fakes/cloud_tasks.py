"""A fake Cloud Tasks API (v2 REST) on 127.0.0.1: the calls the billing guard makes.

Every request is checked against Google's cloudtasks.v2 discovery document first (method,
path, query parameters, the body's fields, types, enums and read-only fields;
tests/fakes/discovery.py) and every answer against its response schema. Of the documented
shapes of `projects.locations.queues.tasks` it serves:

- create: POST /v2/{queue}/tasks, body {"task": Task, "responseView"?: BASIC|FULL}; the Task
  this project sends is {name?, scheduleTime (RFC 3339), httpRequest {url, httpMethod,
  oauthToken {serviceAccountEmail, scope?}}}. Anything else (an unknown field, an App Engine
  target, headers or a body on this DELETE, both token kinds, a name outside the queue, a
  malformed timestamp, a schedule more than 30 days ahead) is refused with the API's error JSON.
- list: GET /v2/{queue}/tasks (pageSize, pageToken, responseView);
- delete: DELETE /v2/{queue}/tasks/{id}.

The queue must exist (`add_queue`, as Terraform would create it): otherwise NOT_FOUND. A task
name stays taken after the task is deleted or has run (the API keeps names for a while):
ALREADY_EXISTS. `run_due(now)` plays the dispatcher: each task whose scheduleTime has come is
sent as its HTTP request, with a bearer token standing for its service account, and removed.
The dispatcher reaches what Google's network would: a task URL under a public root given to
`route` (https://tpu.googleapis.com/ -> the fake TPU API) is delivered there; a task aimed at
any other host (a loopback fake, a proxy) is not delivered (status 0), and its token never
leaves the fake.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

from werkzeug.wrappers import Request, Response

from tests.fakes.discovery import Discovery, guarded
from tests.fakes.metadata import LoopbackServer

DEFAULT_TOKEN = "fake-tasks-token"
MAX_AHEAD_S = 30 * 24 * 3600  # "scheduleTime ... cannot be more than 30 days in the future"
_LOC = r"projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/locations/[a-z0-9-]+"
_QUEUE = rf"{_LOC}/queues/[A-Za-z0-9-]{{1,100}}"
_TASK_ID = r"[A-Za-z0-9_-]{1,500}"
_TIMESTAMP_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)")


class TasksFault(Exception):
    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


def _invalid(message: str) -> TasksFault:
    return TasksFault(400, "INVALID_ARGUMENT", message)


def parse_rfc3339(text: str) -> dt.datetime:
    m = _TIMESTAMP_RE.fullmatch(text)
    if not m:
        raise _invalid(f"Invalid value at 'task.schedule_time' (type.googleapis.com/"
                       f"google.protobuf.Timestamp), Field 'scheduleTime', Invalid time format: "
                       f"{text!r}")
    base = text[:19] + ("+00:00" if text.endswith("Z") else text[-6:])
    return dt.datetime.fromisoformat(base)


@dataclass
class Task:
    name: str
    schedule_time: dt.datetime
    http_request: dict[str, Any]
    created: dt.datetime

    def json(self, view: str = "BASIC") -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "scheduleTime": self.schedule_time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "createTime": self.created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "dispatchDeadline": "600s", "dispatchCount": 0, "responseCount": 0,
            "view": view,
        }
        http = {k: v for k, v in self.http_request.items() if view == "FULL" or k != "body"}
        out["httpRequest"] = http
        return out


@dataclass(frozen=True)
class Dispatch:
    task: str
    method: str
    url: str
    token_for: str
    status: int


class FakeCloudTasks:
    def __init__(self, *, token: str = DEFAULT_TOKEN,
                 clock: Callable[[], float] = time.time) -> None:
        self.token = token
        self.clock = clock
        self.queues: set[str] = set()
        self.tasks: dict[str, Task] = {}
        self.used_names: set[str] = set()
        self.requests: list[tuple[str, str, Any]] = []
        self.dispatched: list[Dispatch] = []
        self.routes: dict[str, str] = {}  # public API root -> the local fake serving it
        self._lock = threading.RLock()
        self._server = LoopbackServer(guarded(Discovery.load("cloudtasks", "v2"), self._locked))

    # -- lifecycle
    def start(self) -> Self:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}/"

    def environ(self) -> dict[str, str]:
        return {"CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDTASKS": self.url}

    # -- test side
    def add_queue(self, queue: str) -> None:
        assert re.fullmatch(_QUEUE, queue), queue
        self.queues.add(queue)

    def task_names(self) -> list[str]:
        with self._lock:
            return sorted(self.tasks)

    def route(self, public_root: str, local_root: str) -> None:
        """Deliver tasks aimed under `public_root` (https://HOST/) to `local_root` instead."""
        assert re.fullmatch(r"https://[a-z0-9.-]+/", public_root), public_root
        self.routes[public_root] = local_root if local_root.endswith("/") else local_root + "/"

    def _routed(self, url: str) -> str | None:
        for public, local in self.routes.items():
            if url.startswith(public):
                return local + url[len(public):]
        return None

    def run_due(self, now: float, *, token_for: Callable[[str], str]) -> list[Dispatch]:
        """Send every task whose time has come (as the dispatcher would), then drop it."""
        with self._lock:
            due = [t for t in self.tasks.values() if t.schedule_time.timestamp() <= now]
            for t in due:
                del self.tasks[t.name]
        out = []
        for t in due:
            email = t.http_request["oauthToken"]["serviceAccountEmail"]
            local = self._routed(t.http_request["url"])
            status = 0  # no route: Google's network would not reach a test-local host
            if local is not None:
                req = urllib.request.Request(
                    local, method=t.http_request["httpMethod"],
                    headers={"Authorization": f"Bearer {token_for(email)}"})
                try:
                    with urllib.request.urlopen(req, timeout=10) as resp:
                        status = resp.status
                except urllib.error.HTTPError as exc:
                    status = exc.code
            out.append(Dispatch(t.name, t.http_request["httpMethod"], t.http_request["url"],
                                email, status))
        self.dispatched.extend(out)
        return out

    # -- HTTP
    def _locked(self, request: Request) -> Response:
        with self._lock:
            return self._handle(request)

    def _handle(self, request: Request) -> Response:
        raw = request.get_data(as_text=True)
        self.requests.append((request.method, request.path, raw))
        try:
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                raise TasksFault(401, "UNAUTHENTICATED",
                                 "Request is missing required authentication credential.")
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                raise _invalid("Invalid JSON payload received.") from None
            path = request.path
            if m := re.fullmatch(rf"/v2/({_QUEUE})/tasks", path):
                if request.method == "POST":
                    return self._ok(self._create(m.group(1), body))
                if request.method == "GET":
                    return self._ok(self._list(m.group(1), request))
            m = re.fullmatch(rf"/v2/(({_QUEUE})/tasks/{_TASK_ID})", path)
            if m and request.method == "DELETE":
                self._queue(m.group(2))
                if self.tasks.pop(m.group(1), None) is None:
                    raise TasksFault(404, "NOT_FOUND", "Requested entity was not found.")
                return self._ok({})
            raise TasksFault(404, "NOT_FOUND", f"Method not found: {request.method} {path}")
        except TasksFault as fault:
            return Response(json.dumps({"error": {"code": fault.code, "message": fault.message,
                                                  "status": fault.status}}),
                            fault.code, mimetype="application/json")

    @staticmethod
    def _ok(payload: dict[str, Any]) -> Response:
        return Response(json.dumps(payload), 200, mimetype="application/json")

    def _queue(self, queue: str) -> None:
        if queue not in self.queues:
            raise TasksFault(404, "NOT_FOUND", "Requested entity was not found.")

    def _create(self, queue: str, body: Any) -> dict[str, Any]:
        # Fields, types and enums: the discovery document checked them (guarded).
        body = body or {}
        view = body.get("responseView", "BASIC")
        task = body.get("task")
        if not isinstance(task, dict):
            raise _invalid("Invalid argument: task is required.")
        if "appEngineHttpRequest" in task or "dispatchDeadline" in task:
            raise _invalid("Invalid argument: fake policy: the billing guard sends an "
                           "httpRequest task only.")
        http = task.get("httpRequest")
        if not isinstance(http, dict):
            raise _invalid("Invalid argument: Task.http_request is required.")
        url = http.get("url")
        if not isinstance(url, str) or not re.match(r"https?://[^/\s]+/", url):
            raise _invalid("Invalid argument: HttpRequest.url must be a valid http(s) URL.")
        if "headers" in http or "body" in http:
            raise _invalid("Invalid argument: fake policy: the guard's DELETE has no headers "
                           "and no body.")
        if "oidcToken" in http and "oauthToken" in http:
            raise _invalid("Invalid argument: only one of oauth_token and oidc_token may be set.")
        token = http.get("oauthToken")
        if not isinstance(token, dict) or set(token) - {"serviceAccountEmail", "scope"}:
            raise _invalid("Invalid argument: fake policy: the guard authenticates with an "
                           "oauthToken {serviceAccountEmail, scope}.")
        if not isinstance(token.get("serviceAccountEmail"), str) or not token[
            "serviceAccountEmail"
        ].endswith(".iam.gserviceaccount.com"):
            raise _invalid("Invalid argument: OAuthToken.service_account_email is required.")
        now = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        schedule = now
        if "scheduleTime" in task:
            schedule = parse_rfc3339(task["scheduleTime"])
            if (schedule - now).total_seconds() > MAX_AHEAD_S:
                raise _invalid("Invalid argument: Task.schedule_time cannot be more than 30 "
                               "days in the future.")
        self._queue(queue)
        name = task.get("name")
        if name is None:
            name = f"{queue}/tasks/{len(self.used_names) + 1:020d}"
        elif not isinstance(name, str) or not re.fullmatch(rf"{re.escape(queue)}/tasks/"
                                                          rf"{_TASK_ID}", name):
            raise _invalid(f"Invalid argument: Task.name {name!r} must be {queue}/tasks/TASK_ID "
                           "(letters, digits, hyphens, underscores).")
        if name in self.used_names:
            raise TasksFault(409, "ALREADY_EXISTS", "Requested entity already exists")
        self.used_names.add(name)
        self.tasks[name] = Task(name, schedule, dict(http), now)
        return self.tasks[name].json(view if view != "VIEW_UNSPECIFIED" else "BASIC")

    def _list(self, queue: str, request: Request) -> dict[str, Any]:
        self._queue(queue)
        size = int(request.args.get("pageSize", "1000") or 1000)
        if not 0 <= size <= 1000:
            raise _invalid("Invalid argument: page_size must be between 0 and 1000.")
        size = size or 1000
        names = sorted(n for n in self.tasks if n.startswith(queue + "/tasks/"))
        start = int(request.args.get("pageToken", "0") or 0)
        page = names[start:start + size]
        out: dict[str, Any] = {"tasks": [self.tasks[n].json() for n in page]}
        if start + size < len(names):
            out["nextPageToken"] = str(start + size)
        return out
