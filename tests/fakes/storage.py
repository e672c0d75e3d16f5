"""A fake Cloud Storage JSON API on 127.0.0.1: media download, media and resumable upload and
metadata patch of one bucket.

Request shapes as documented:
  GET   /storage/v1/b/BUCKET/o/OBJECT?alt=media           (OBJECT percent-encoded: / is %2F)
  GET   /storage/v1/b/BUCKET/o/OBJECT                      (the object resource, JSON)
  POST  /upload/storage/v1/b/BUCKET/o?uploadType=media&name=OBJECT  (body: the content)
  POST  /upload/storage/v1/b/BUCKET/o?uploadType=resumable&name=OBJECT  (opens a session: empty
        body or the object's JSON metadata; optional X-Upload-Content-Type/-Length; answers 200
        with the session URI in `Location`)
  PUT   <session URI> (…&upload_id=ID), the bytes, with `Content-Range: bytes A-B/TOTAL` (TOTAL
        may be *), or without one for the whole object; `bytes */TOTAL` asks for the status.
        308 (Range: bytes=0-N) while incomplete; 200 and the object resource when complete.
  Uploads take `ifGenerationMatch` (0: only if no live object), checked when the session opens
  and when the object is finalized: 412 conditionNotMet otherwise.
  GET   /storage/v1/b/BUCKET                               (buckets.get: the bucket resource;
        404 notFound "The specified bucket does not exist."; 403 forbidden when
        "storage.buckets.get" is in `denied`. `bucket` and every `add_bucket` name exist;
        objects live in `bucket` only)
  PATCH /storage/v1/b/BUCKET/o/OBJECT                      (objects.patch; Content-Type
        application/json; the body holds the fields to change: only `customTime`, an RFC 3339
        timestamp, is supported, any other field is refused)
Every request is checked against Google's storage.v1 discovery document first (method, path,
query parameters, the JSON body's fields; tests/fakes/discovery.py) and every JSON answer
against its response schema. Every call needs `Authorization: Bearer <token>`. Errors use the
JSON API's error shape ({"error": {"code", "message", "errors": [{"domain", "reason",
"message"}]}}). Downloads carry
`x-goog-hash: crc32c=...,md5=...`. Point code at it with
`CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE=<fake.endpoint>`.

customTime follows the documented rule (cloud.google.com/storage/docs/metadata#custom-time):
once set it can be neither removed nor moved earlier; an upload makes a new generation, which
starts without one. A lifecycle rule `daysSinceCustomTime` counts from it.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from werkzeug import Request, Response

from .discovery import Discovery, guarded
from .metadata import LoopbackServer, dropped

_OBJECT_PATH = re.compile(r"/storage/v1/b/([^/]+)/o/([^/]+)")
_UPLOAD_PATH = re.compile(r"/upload/storage/v1/b/([^/]+)/o")
_BUCKET_PATH = re.compile(r"/storage/v1/b/([^/]+)")
PROJECT_NUMBER = "123456789012"
# RFC 3339 date-time (the JSON API's "datetime" format): seconds required, offset required.
_RFC3339 = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:[Zz]|[+-]\d\d:\d\d)")
# Fields of the object resource that objects.patch may change: the discovery document says
# which exist; of those the fake implements customTime and refuses the rest as unsupported
# rather than silently ignoring them.
_WRITABLE = {"customTime"}


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum Google APIs report."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@dataclass
class StoredObject:
    data: bytes
    generation: int
    content_type: str
    created: float = field(default_factory=time.time)
    custom_time: str | None = None  # as the last accepted PATCH sent it
    metageneration: int = 1
    updated: float = 0.0

    def __post_init__(self) -> None:
        self.updated = self.updated or self.created


@dataclass(frozen=True)
class StorageCall:
    """One request; `at` is time.time() (comparable across processes)."""

    at: float
    method: str
    kind: str  # "download", "metadata", "upload", "patch", "bucket" or "other"
    name: str
    status: int


@dataclass
class _Session:
    bucket: str
    name: str
    content_type: str
    if_generation_match: int | None
    data: bytearray = field(default_factory=bytearray)
    declared_length: int | None = None


class FakeStorage:
    """One bucket. `objects[name]` is what is stored. Failure knobs: `outage`,
    `download_delay` (seconds before a GET answers), `download_stall` (a download sends half
    its bytes, then nothing for that many seconds), `before_finalize` (called once, just before
    an upload is finalized: another writer racing this one), `fail_next` (a queue of error
    answers, with Retry-After or as the front end's HTML page)."""

    def __init__(self, *, bucket: str, access_token: str) -> None:
        self.bucket = bucket
        self.access_token = access_token
        self.objects: dict[str, StoredObject] = {}
        self.calls: list[StorageCall] = []
        self.outage = False  # answer 503 backendError to everything
        self.more_buckets: set[str] = set()  # buckets.get finds these too (add_bucket)
        self.denied: set[str] = set()  # permissions the caller lacks ("storage.buckets.get")
        self.download_delay = 0.0  # seconds before answering a GET (a storage timeout)
        self.download_stall = 0.0  # a media download stops after half its bytes, this long
        self.before_finalize: list[Callable[[], None]] = []  # each runs once, then is dropped
        self._faults: list[tuple[str | None, int, str, str | None, list[int]]] = []
        self._sessions: dict[str, _Session] = {}
        self._generation = 1_700_000_000_000_000
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # ends a delayed answer early: stop() stays fast
        # Requests and answers checked against storage.v1's discovery document.
        self.server = LoopbackServer(guarded(Discovery.load("storage", "v1"), self._handle))

    @property
    def endpoint(self) -> str:
        """The value of CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE, as gcloud takes it."""
        return f"http://127.0.0.1:{self.server.port}/storage/v1/"

    def start(self) -> FakeStorage:
        self.server.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.server.stop()

    def put(self, name: str, data: bytes, content_type: str = "application/gzip") -> None:
        with self._lock:
            self._generation += 1
            self.objects[name] = StoredObject(data, self._generation, content_type)

    def add_bucket(self, name: str) -> None:
        """Another bucket that buckets.get finds (it holds no objects here)."""
        with self._lock:
            self.more_buckets.add(name)

    def fail_next(self, code: int, reason: str = "backendError", *, kind: str | None = None,
                  times: int = 1, retry_after: str | None = None, html: bool = False,
                  drop: bool = False) -> None:
        """The next `times` requests (of `kind`: "download", "upload", ...) get this error:
        the JSON API's error body, with html=True the front end's HTML page, with drop=True
        a connection closed without an answer."""
        reason = "drop" if drop else "html" if html else reason
        with self._lock:
            self._faults.append((kind, code, reason, retry_after, [times]))

    def _take_fault(self, kind: str) -> Response | None:
        with self._lock:
            for entry in self._faults:
                want, code, reason, retry_after, left = entry
                if want is None or want == kind:
                    left[0] -= 1
                    if left[0] <= 0:
                        self._faults.remove(entry)
                    break
            else:
                return None
        if reason == "drop":
            return dropped()
        if reason == "html":
            response = Response(f"<!DOCTYPE html><title>Error {code}</title><p>That's an error.",
                                code, mimetype="text/html")
        else:
            response = _error(code, reason, f"fake storage: injected {reason}")
        if retry_after is not None:
            response.headers["Retry-After"] = retry_after
        return response

    def calls_of(self, kind: str) -> list[StorageCall]:
        with self._lock:
            return [c for c in self.calls if c.kind == kind]

    # -- request handling
    def _handle(self, request: Request) -> Response:
        if self.download_delay and request.method == "GET":
            self._stopping.wait(self.download_delay)
        fault = self._take_fault(_kind_of(request))
        if fault is not None:  # answered instead of the request: nothing happens
            kind, name, response = _kind_of(request), request.args.get("name", ""), fault
        else:
            kind, name, response = self._route(request)
        with self._lock:
            self.calls.append(
                StorageCall(time.time(), request.method, kind, name, response.status_code)
            )
        return response

    def _route(self, request: Request) -> tuple[str, str, Response]:
        raw_path = request.environ.get("RAW_URI", request.full_path).split("?", 1)[0]
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return "other", "", _error(
                401, "required", "Anonymous caller does not have storage.objects.get access "
                "to the Google Cloud Storage object. Permission 'storage.objects.get' denied on "
                "resource (or it may not exist).",
            )
        if self.outage:
            return "other", "", _error(503, "backendError", "Backend Error")
        if m := _UPLOAD_PATH.fullmatch(raw_path):
            if request.method == "PUT" and "upload_id" in request.args:
                return self._put_session(unquote(m[1]), request)
            if request.method != "POST":
                return "other", "", _error(405, "methodNotAllowed", "Method Not Allowed")
            if request.args.get("uploadType") == "resumable":
                return ("upload_session", request.args.get("name", ""),
                        self._open_session(unquote(m[1]), request))
            return "upload", request.args.get("name", ""), self._upload(unquote(m[1]), request)
        if m := _BUCKET_PATH.fullmatch(raw_path):
            if request.method != "GET":
                return "bucket", unquote(m[1]), _error(405, "methodNotAllowed",
                                                       "Method Not Allowed")
            return "bucket", unquote(m[1]), self._get_bucket(unquote(m[1]))
        if m := _OBJECT_PATH.fullmatch(raw_path):
            # The object name is ONE path segment: a raw "/" in it would not match above.
            name = unquote(m[2])
            if request.method == "PATCH":
                return "patch", name, self._patch(unquote(m[1]), name, request)
            if request.method != "GET":
                return "other", name, _error(405, "methodNotAllowed", "Method Not Allowed")
            alt = request.args.get("alt", "json")
            kind = "download" if alt == "media" else "metadata"
            return kind, name, self._get(unquote(m[1]), name, alt)
        return "other", "", _error(404, "notFound", "Not Found")

    def _get_bucket(self, bucket: str) -> Response:
        """buckets.get: the bucket resource, as the JSON API answers it."""
        if "storage.buckets.get" in self.denied:
            return _error(
                403, "forbidden", "caller@example.iam.gserviceaccount.com does not have "
                "storage.buckets.get access to the Google Cloud Storage bucket. Permission "
                "'storage.buckets.get' denied on resource (or it may not exist).",
            )
        with self._lock:
            exists = bucket == self.bucket or bucket in self.more_buckets
        if not exists:
            return _error(404, "notFound", "The specified bucket does not exist.")
        resource = {
            "kind": "storage#bucket", "id": bucket, "name": bucket,
            "selfLink": f"https://www.googleapis.com/storage/v1/b/{bucket}",
            "projectNumber": PROJECT_NUMBER, "metageneration": "1", "location": "US-WEST4",
            "storageClass": "STANDARD", "etag": "CAE=", "locationType": "region",
            "timeCreated": "2025-01-01T00:00:00.000Z", "updated": "2025-01-01T00:00:00.000Z",
            "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True},
                                 "publicAccessPrevention": "enforced"},
            "rpo": "DEFAULT",
        }
        return Response(json.dumps(resource), 200, mimetype="application/json")

    def _bucket_error(self, bucket: str) -> Response | None:
        if bucket != self.bucket:
            return _error(404, "notFound", "The specified bucket does not exist.")
        return None

    def _get(self, bucket: str, name: str, alt: str) -> Response:
        if err := self._bucket_error(bucket):
            return err
        if alt not in ("json", "media"):
            return _error(400, "invalidParameter", f"Invalid value for alt: {alt}")
        with self._lock:
            obj = self.objects.get(name)
        if obj is None:
            return _error(404, "notFound", f"No such object: {bucket}/{name}")
        if alt == "json":
            return Response(
                json.dumps(self._resource(name, obj)), 200, mimetype="application/json"
            )
        headers = {
            "x-goog-hash": f"crc32c={_b64_crc(obj.data)},md5={_b64_md5(obj.data)}",
            "x-goog-generation": str(obj.generation),
            "x-goog-stored-content-length": str(len(obj.data)),
            "Content-Length": str(len(obj.data)),
        }
        if self.download_stall:
            data, stall, stopping = obj.data, self.download_stall, self._stopping

            def stalled() -> Iterator[bytes]:
                yield data[: len(data) // 2]
                stopping.wait(stall)  # bytes stop arriving; the client should give up
                yield data[len(data) // 2:]

            return Response(stalled(), 200, headers=headers, content_type=obj.content_type,
                            direct_passthrough=True)
        return Response(obj.data, 200, headers=headers, content_type=obj.content_type)

    def _upload(self, bucket: str, request: Request) -> Response:
        if err := self._bucket_error(bucket):
            return err
        upload_type = request.args.get("uploadType")
        if upload_type is None:
            return _error(
                400, "invalid", "Upload requests must include an uploadType URL parameter and "
                "a URL path beginning with /upload/",
            )
        if upload_type != "media":
            return _error(400, "invalidParameter", f"Invalid upload type: {upload_type}")
        name = request.args.get("name")
        if not name:
            return _error(400, "required", "Required")
        content_type = request.headers.get("Content-Type")
        if not content_type:
            return _error(400, "required", "Content-Type is required for a media upload")
        match, err = _generation_match(request)
        if err is not None:
            return err
        return self._finalize(name, request.get_data(), content_type, match)

    def _finalize(self, name: str, data: bytes, content_type: str,
                  if_generation_match: int | None) -> Response:
        while self.before_finalize:
            self.before_finalize.pop(0)()
        with self._lock:
            if (err := self._precondition(name, if_generation_match)) is not None:
                return err
            self._generation += 1
            self.objects[name] = StoredObject(data, self._generation, content_type)
            obj = self.objects[name]
            resource = self._resource(name, obj)
        return Response(json.dumps(resource), 200, mimetype="application/json")

    def _precondition(self, name: str, if_generation_match: int | None) -> Response | None:
        """ifGenerationMatch: 0 = no live object may exist; N = the live one is generation N."""
        if if_generation_match is None:
            return None
        obj = self.objects.get(name)
        current = obj.generation if obj is not None else 0
        if current != if_generation_match:
            return _error(412, "conditionNotMet",
                          "At least one of the pre-conditions you specified did not hold.")
        return None

    def _open_session(self, bucket: str, request: Request) -> Response:
        if err := self._bucket_error(bucket):
            return err
        name = request.args.get("name")
        if not name:
            return _error(400, "required", "Required")
        match, err = _generation_match(request)
        if err is not None:
            return err
        raw = request.get_data()
        if raw:
            if request.mimetype != "application/json":
                return _error(400, "parseError", "Parse Error: the metadata must be JSON")
            try:
                meta = json.loads(raw)
            except ValueError:
                return _error(400, "parseError", "Parse Error")
            if not isinstance(meta, dict):
                return _error(400, "parseError", "Parse Error: expected a JSON object")
        length = request.headers.get("X-Upload-Content-Length")
        if length is not None and not length.isdigit():
            return _error(400, "invalid", f"Invalid X-Upload-Content-Length: {length}")
        with self._lock:
            if (err := self._precondition(name, match)) is not None:
                return err
            upload_id = hashlib.sha256(f"{name}{time.time_ns()}".encode()).hexdigest()[:24]
            self._sessions[upload_id] = _Session(
                bucket, name, request.headers.get("X-Upload-Content-Type",
                                                  "application/octet-stream"),
                match, declared_length=int(length) if length else None)
        location = (f"http://127.0.0.1:{self.server.port}/upload/storage/v1/b/{bucket}/o"
                    f"?uploadType=resumable&name={quote(name, safe='')}&upload_id={upload_id}")
        return Response("", 200, headers={"Location": location})

    def _put_session(self, bucket: str, request: Request) -> tuple[str, str, Response]:
        upload_id = request.args.get("upload_id", "")
        with self._lock:
            session = self._sessions.get(upload_id)
        if session is None or session.bucket != bucket:
            return "other", "", _error(404, "notFound", "No such upload session")
        data = request.get_data()
        header = request.headers.get("Content-Range")
        total: int | None
        if header is None:  # the whole object in one request
            start, total = 0, len(data)
            if session.data:
                return "upload", session.name, _error(400, "invalid",
                                                      "Content-Range is required")
        elif m := re.fullmatch(r"bytes \*/(\d+|\*)", header):
            if data:
                return "upload", session.name, _error(400, "invalid", "Invalid Content-Range")
            total = None if m[1] == "*" else int(m[1])
            if total is not None and total == len(session.data):
                return "upload", session.name, self._complete(upload_id, session)
            return "upload", session.name, _incomplete(len(session.data))
        elif m := re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", header):
            start, end = int(m[1]), int(m[2])
            total = None if m[3] == "*" else int(m[3])
            if end < start or end - start + 1 != len(data) or start != len(session.data) or (
                    total is not None and end >= total):
                return "upload", session.name, _error(
                    400, "invalid", f"Invalid Content-Range {header!r} for {len(data)} bytes "
                    f"after {len(session.data)}")
        else:
            return "upload", session.name, _error(400, "invalid",
                                                  f"Invalid Content-Range {header!r}")
        session.data += data
        if session.declared_length is not None and total is not None and (
                total != session.declared_length):
            return "upload", session.name, _error(
                400, "invalid", "The upload length differs from X-Upload-Content-Length")
        if total is not None and len(session.data) == total:
            return "upload", session.name, self._complete(upload_id, session)
        return "upload", session.name, _incomplete(len(session.data))

    def _complete(self, upload_id: str, session: _Session) -> Response:
        with self._lock:
            self._sessions.pop(upload_id, None)
        return self._finalize(session.name, bytes(session.data), session.content_type,
                              session.if_generation_match)

    def _patch(self, bucket: str, name: str, request: Request) -> Response:
        if err := self._bucket_error(bucket):
            return err
        if request.mimetype != "application/json":
            return _error(400, "parseError", "Parse Error: the body must be application/json")
        try:
            body = json.loads(request.get_data() or b"{}")
        except ValueError:
            return _error(400, "parseError", "Parse Error")
        if not isinstance(body, dict):
            return _error(400, "parseError", "Parse Error: expected a JSON object")
        for key in body:  # the document refused unknown fields already
            if key not in _WRITABLE:
                return _error(400, "invalid", f"fake storage: patching {key} is not supported")
        value = body.get("customTime")
        when = _parse_rfc3339(value) if isinstance(value, str) else None
        if "customTime" in body and when is None:
            return _error(400, "invalid", f"Invalid value for customTime: {value!r}")
        with self._lock:
            obj = self.objects.get(name)
            if obj is None:
                return _error(404, "notFound", f"No such object: {bucket}/{name}")
            if when is not None:
                if obj.custom_time is not None and when < _parse_rfc3339(obj.custom_time):
                    return _error(400, "invalid", "The customTime of an object cannot be "
                                  "decreased or removed.")
                obj.custom_time = value
            obj.metageneration += 1
            obj.updated = time.time()
            resource = self._resource(name, obj)
        return Response(json.dumps(resource), 200, mimetype="application/json")

    def _resource(self, name: str, obj: StoredObject) -> dict[str, object]:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(obj.created))
        resource: dict[str, object] = {
            "kind": "storage#object",
            "id": f"{self.bucket}/{name}/{obj.generation}",
            "name": name,
            "bucket": self.bucket,
            "generation": str(obj.generation),
            "metageneration": str(obj.metageneration),
            "contentType": obj.content_type,
            "storageClass": "STANDARD",
            "size": str(len(obj.data)),
            "md5Hash": _b64_md5(obj.data),
            "crc32c": _b64_crc(obj.data),
            "etag": base64.b64encode(str(obj.generation).encode()).decode(),
            "timeCreated": stamp,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(obj.updated)),
        }
        if obj.custom_time is not None:
            resource["customTime"] = obj.custom_time
        return resource


def _kind_of(request: Request) -> str:
    """What a request is, as StorageCall.kind names it (no side effects)."""
    raw_path = request.environ.get("RAW_URI", request.full_path).split("?", 1)[0]
    if _UPLOAD_PATH.fullmatch(raw_path):
        if request.method == "PUT":
            return "upload"
        return "upload_session" if request.args.get("uploadType") == "resumable" else "upload"
    if _OBJECT_PATH.fullmatch(raw_path):
        if request.method == "PATCH":
            return "patch"
        return "download" if request.args.get("alt") == "media" else "metadata"
    if _BUCKET_PATH.fullmatch(raw_path):
        return "bucket"
    return "other"


def _generation_match(request: Request) -> tuple[int | None, Response | None]:
    raw = request.args.get("ifGenerationMatch")
    if raw is None:
        return None, None
    if not raw.isdigit():
        return None, _error(400, "invalid", f"Invalid value for ifGenerationMatch: {raw}")
    return int(raw), None


def _incomplete(received: int) -> Response:
    """308 Resume Incomplete, with the bytes persisted so far."""
    headers = {"Range": f"bytes=0-{received - 1}"} if received else {}
    return Response("", 308, headers=headers)


def _parse_rfc3339(text: str) -> dt.datetime | None:
    if not _RFC3339.fullmatch(text):
        return None
    # fromisoformat takes at most 6 fraction digits; a customTime's extra ones do not matter.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("z", "Z")
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _b64_md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()  # GCS's own hash


def _b64_crc(data: bytes) -> str:
    return base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()


def _error(code: int, reason: str, message: str) -> Response:
    body = {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }
    return Response(json.dumps(body), code, mimetype="application/json")
