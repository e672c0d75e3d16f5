"""tpuserve fleet helper: Cloud Storage steps of a vLLM pod and of the stage-weights Job.

Static text (no config value is written into it): shipped in the ConfigMap `tpuserve-fleet`,
run with the vLLM image's own python3 (stdlib only; the stage step also imports the image's
huggingface_hub). Every setting arrives in the environment. Cloud Storage is reached with the
pod's Kubernetes service account (Workload Identity: the GKE metadata server hands out its
token), over the JSON API.

  restore-cache    BUCKET OBJECT DEST MAX_S: the compile cache's object (a tar.gz of the cache
                   directory, the VM stacks' format and name) into DEST; a miss, a slow or broken
                   download or an outage is logged and never fails the pod.
  publish-cache    BUCKET OBJECT SRC HEALTH_URL: once vLLM answers HEALTH_URL, create the object
                   from SRC only if it is absent (ifGenerationMatch=0: one replica publishes, the
                   rest get 412 and skip); then renew its customTime (the bucket's lifecycle).
                   Then idles until the pod stops (a sidecar).
  restore-weights  BUCKET PREFIX DEST MAX_S: a staged Hugging Face snapshot into the HF cache
                   (DEST), when PREFIX + COMPLETE exists; else (or on any failure) nothing, and
                   vLLM downloads from Hugging Face as on a VM.
  stage-weights    MODEL BUCKET PREFIX: download MODEL with the token file (HF_TOKEN_PATH) and
                   write its snapshot under PREFIX, COMPLETE last.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import hashlib
import heapq
import http.client
import json
import os
import shutil
import signal
import socket
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

# GCE_METADATA_HOST: the variable Google's own clients read (unset in a pod: the GKE metadata
# server at the link-local address).
META = ("http://" + os.environ.get("GCE_METADATA_HOST", "169.254.169.254")
        + "/computeMetadata/v1/instance/service-accounts/default/token")
# With Workload Identity the GKE metadata server does not answer a pod's first seconds (GKE's
# Workload Identity restrictions; seen by clients: r-lib/gargle #186, googleapis/google-auth-
# library-python #1261): a token request is retried for up to TOKEN_RETRY_S, backing off from
# 0.5 s to 4 s between attempts.
TOKEN_RETRY_S = 30.0
TOKEN_BACKOFF_S = (0.5, 4.0)
API = "https://storage.googleapis.com/"
_token: tuple[str, float] = ("", 0.0)


# Every request is bounded as a whole, not per recv: urllib's timeout bounds each socket
# operation only, so an answer dripping a byte at a time (headers or body) would hold a read
# without bound. Here a request's timeout (or `_bound.seconds`, set by call for the duration of
# its urlopen) is the life of its connection: one watchdog thread shuts the socket when it runs
# out, and the read fails (IncompleteRead, a reset, a cut JSON; a download also checks its
# deadline). One thread for all: a weights restore opens thousands of connections.
_bound = threading.local()


class _Watchdog:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._due: list[tuple[float, int, socket.socket]] = []  # a heap: (deadline, id, socket)
        self._thread: threading.Thread | None = None

    def watch(self, sock: socket.socket, seconds: float) -> None:
        with self._cv:
            heapq.heappush(self._due, (time.monotonic() + max(0.0, seconds), id(sock), sock))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="deadlines", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        with self._cv:
            while True:
                now = time.monotonic()
                while self._due and (self._due[0][0] <= now or self._due[0][2].fileno() < 0):
                    _, _, sock = heapq.heappop(self._due)
                    if sock.fileno() >= 0:  # still open at its deadline: cut
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                self._cv.wait(self._due[0][0] - now if self._due else None)


_watchdog = _Watchdog()


def _watch(sock: socket.socket, seconds: float | None) -> None:
    if seconds is not None:
        _watchdog.watch(sock, seconds)


def _life(timeout: object) -> float | None:
    seconds = getattr(_bound, "seconds", None)
    if seconds is not None:
        return seconds
    return timeout if isinstance(timeout, (int, float)) else None


class _HTTPConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _watch(self.sock, _life(self.timeout))


class _HTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _watch(self.sock, _life(self.timeout))


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(_HTTPSConnection, req, context=self._context)


urllib.request.install_opener(urllib.request.build_opener(_HTTPHandler, _HTTPSHandler))


def log(*words: object) -> None:
    print("tpuserve-fleet:", *words, file=sys.stderr, flush=True)


def env(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        sys.exit(f"tpuserve-fleet: {name} is not set")
    return value


def _fetch_token(timeout: float) -> tuple[str, int]:
    req = urllib.request.Request(META, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = json.load(r)
    tok, ttl = body.get("access_token"), body.get("expires_in", 300)
    if not isinstance(tok, str) or not tok or not isinstance(ttl, int):  # proves nothing
        raise ValueError("the metadata server answered no access token")
    return tok, ttl


def token() -> str:
    """The pod's access token; retried (bounded, with backoff) while the metadata server is
    not yet answering, then the last error is raised."""
    global _token
    if time.time() < _token[1]:
        return _token[0]
    deadline = time.monotonic() + TOKEN_RETRY_S
    delay, cap = TOKEN_BACKOFF_S
    while True:
        left = deadline - time.monotonic()
        try:
            tok, ttl = _fetch_token(max(0.5, min(10.0, left)))
            break
        except (OSError, ValueError) as exc:  # URLError/HTTPError are OSErrors
            if left <= delay:
                raise
            log("metadata server not ready:", status(exc), f"(retrying in {delay:g} s)")
            time.sleep(delay)
            delay = min(cap, delay * 2)
    _token = (tok, time.time() + ttl - 60)
    return _token[0]


def call(method: str, url: str, *, body=None, headers=None, timeout: float = 30,
         whole: float | None = None):
    """One request; returns the open response (2xx) or raises urllib.error.HTTPError. Its
    connection lives at most `whole` seconds (default: timeout), reading the answer included."""
    h = {"Authorization": "Bearer " + token(), **(headers or {})}
    req = urllib.request.Request(url, data=body, method=method, headers=h)
    _bound.seconds = whole
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    finally:
        _bound.seconds = None


def obj_url(bucket: str, name: str, *, media: bool = False) -> str:
    q = "?alt=media" if media else ""
    return f"{API}storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}{q}"


def status(exc: BaseException) -> str:
    return f"HTTP {exc.code}" if isinstance(exc, urllib.error.HTTPError) else repr(exc)[:200]


def download(bucket: str, name: str, dest: str, deadline: float) -> None:
    """GET the object's media into dest, checking the md5 Cloud Storage reports."""
    with call("GET", obj_url(bucket, name, media=True), timeout=30,
              whole=deadline - time.time()) as r, open(dest, "wb") as f:
        want = ""
        for part in r.headers.get_all("x-goog-hash") or []:
            for item in part.split(","):
                k, _, v = item.strip().partition("=")
                if k == "md5":
                    want = v
        h = hashlib.md5()
        try:
            while block := r.read(1 << 20):
                if time.time() > deadline:
                    raise TimeoutError("over the time allowed")
                h.update(block)
                f.write(block)
        except (OSError, http.client.HTTPException):
            if time.time() > deadline:  # the connection was cut at its deadline
                raise TimeoutError("over the time allowed") from None
            raise
        if time.time() > deadline:  # a body cut at the deadline may look complete
            raise TimeoutError("over the time allowed")
    if want and base64.b64encode(h.digest()).decode() != want:
        raise ValueError("md5 mismatch (partial download)")


def upload(bucket: str, name: str, path: str, *, if_generation_match: int | None = None) -> None:
    """A resumable upload streamed from disk (one PUT), optionally conditional."""
    size = os.path.getsize(path)
    q = {"uploadType": "resumable", "name": name}
    if if_generation_match is not None:
        q["ifGenerationMatch"] = str(if_generation_match)
    init = f"{API}upload/storage/v1/b/{bucket}/o?" + urllib.parse.urlencode(q)
    with call("POST", init, body=b"{}", headers={
            "Content-Type": "application/json; charset=UTF-8",
            "X-Upload-Content-Length": str(size)}) as r:
        session = r.headers["Location"]
    if not session.startswith(API + "upload/"):
        raise ValueError("unexpected upload session URI")
    with open(path, "rb") as f:
        call("PUT", session, body=f, headers={"Content-Length": str(size)}, timeout=600).close()


def restore_cache(bucket: str, obj: str, dest: str, max_s: str) -> None:
    archive = os.path.join(dest, ".restore.tar.gz")
    try:
        download(bucket, obj, archive, time.time() + float(max_s))
        with tarfile.open(archive, "r:gz") as t:
            t.extractall(dest, filter="data")
        log("cache hit", f"gs://{bucket}/{obj}")
    except urllib.error.HTTPError as exc:
        log("cache miss", f"gs://{bucket}/{obj}:", status(exc))
    except Exception as exc:  # a miss never fails the pod
        log("cache miss", f"gs://{bucket}/{obj}:", status(exc))
        for entry in os.listdir(dest):  # a partial extract is no cache
            p = os.path.join(dest, entry)
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
    finally:
        if os.path.exists(archive):
            os.remove(archive)


def idle() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


def publish_cache(bucket: str, obj: str, src: str, health_url: str) -> None:
    while True:  # the startupProbe, not this sidecar, decides when a boot has failed
        try:
            with urllib.request.urlopen(health_url, timeout=5) as r:
                if r.status == 200:
                    break
        except Exception:
            pass
        time.sleep(10)
    try:
        try:
            call("GET", obj_url(bucket, obj)).close()
            log("cache present", f"gs://{bucket}/{obj}: not published again")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            archive = "/tmp/publish.tar.gz"
            with tarfile.open(archive, "w:gz") as t:
                t.add(src, arcname=".")
            try:
                upload(bucket, obj, archive, if_generation_match=0)
                log("cache published", f"gs://{bucket}/{obj}")
            except urllib.error.HTTPError as exc2:
                if exc2.code != 412:
                    raise
                log("cache published by another replica meanwhile", f"gs://{bucket}/{obj}")
            finally:
                os.remove(archive)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        call("PATCH", obj_url(bucket, obj), body=json.dumps({"customTime": now}).encode(),
             headers={"Content-Type": "application/json"}).close()
    except Exception as exc:  # best effort: serving never depends on it
        log("cache publish failed", f"gs://{bucket}/{obj}:", status(exc))
    idle()


def list_objects(bucket: str, prefix: str) -> list[dict]:
    items, page = [], ""
    while True:
        q = {"prefix": prefix, **({"pageToken": page} if page else {})}
        url = f"{API}storage/v1/b/{bucket}/o?" + urllib.parse.urlencode(q)
        with call("GET", url) as r:
            body = json.load(r)
        items += body.get("items", [])
        page = body.get("nextPageToken", "")
        if not page:
            return items


def restore_weights(bucket: str, prefix: str, dest: str, max_s: str) -> None:
    deadline = time.time() + float(max_s)
    try:
        call("GET", obj_url(bucket, prefix + "COMPLETE")).close()
    except Exception as exc:
        log("weights not staged", f"gs://{bucket}/{prefix}:", status(exc), "(vLLM downloads)")
        return
    try:
        marker = prefix + "COMPLETE"
        names = [o["name"] for o in list_objects(bucket, prefix) if o["name"] != marker]
        for n in names:
            if ".." in n.split("/"):
                raise ValueError(f"unsafe object name {n!r}")

        def one(name: str) -> None:
            path = os.path.join(dest, name[len(prefix):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            download(bucket, name, path, deadline)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(one, names))
        log("weights restored", f"gs://{bucket}/{prefix}", f"files={len(names)}")
    except Exception as exc:
        log("weights restore failed", f"gs://{bucket}/{prefix}:", status(exc), "(vLLM downloads)")
        shutil.rmtree(dest, ignore_errors=True)


def stage_weights(model: str, bucket: str, prefix: str) -> None:
    try:
        call("GET", obj_url(bucket, prefix + "COMPLETE")).close()
        log("weights already staged", f"gs://{bucket}/{prefix}")
        return
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
    from huggingface_hub import snapshot_download  # the vLLM image's own

    snap = snapshot_download(repo_id=model)  # HF_HOME and HF_TOKEN_PATH from the environment
    repo_dir = os.path.dirname(os.path.dirname(snap))
    revision = os.path.basename(snap)
    for root, _, files in os.walk(snap):
        for f in files:
            path = os.path.join(root, f)  # a symlink into blobs/: uploaded as the file itself
            rel = os.path.relpath(path, repo_dir)
            upload(bucket, prefix + rel, os.path.realpath(path))
    for rel in ("refs/main",):
        if os.path.exists(os.path.join(repo_dir, rel)):
            upload(bucket, prefix + rel, os.path.join(repo_dir, rel))
    marker = "/tmp/COMPLETE"
    with open(marker, "w") as m:
        m.write(revision + "\n")
    upload(bucket, prefix + "COMPLETE", marker)
    log("weights staged", f"gs://{bucket}/{prefix}", f"revision={revision}")


COMMANDS = {
    "restore-cache": (restore_cache, ("BUCKET", "OBJECT", "DEST", "MAX_S")),
    "publish-cache": (publish_cache, ("BUCKET", "OBJECT", "SRC", "HEALTH_URL")),
    "restore-weights": (restore_weights, ("BUCKET", "PREFIX", "DEST", "MAX_S")),
    "stage-weights": (stage_weights, ("MODEL", "BUCKET", "PREFIX")),
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in COMMANDS:
        sys.exit("usage: fleet_helper.py " + "|".join(COMMANDS))
    fn, names = COMMANDS[sys.argv[1]]
    fn(*(env(n) for n in names))
