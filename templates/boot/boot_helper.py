"""The boot script helper in Python: the few steps bash does badly (JSON, base64, MD5).

Static: the script carries this file verbatim (tpuserve/render/boot_script.py puts it in one
single-quoted word), writes it under its state dir at every boot and runs
`python3 "$HELPER" SUBCOMMAND ARGS...`. Standard library only (the stock python3 of a TPU VM), no
config value in it. Secrets are read from and written to files named in argv, never passed as
values. Double quotes only: the rendered script then holds it without any quote escapes.

  error-status FILE        the "status" word of a Google API error body (the JSON API of Cloud
                           Storage has none: its first "reason"), or an empty line
  secret-payload RESP DEST the payload of a Secret Manager :access answer, stripped, into DEST
                           (created with the umask of the caller)
  key-rule RAW DEST        the nginx rule marking a request that carries exactly
                           "Authorization: Bearer <key>", from the raw key file RAW
  key-header RAW DEST      that header line, 0600, for curl -H @DEST (probes of the proxy)
  md5 FILE                 base64 MD5 of FILE, as Cloud Storage reports it in x-goog-hash
  generation FILE          the "generation" of an object resource, as an integer
  watch ARGS...            the watcher: re-runs the startup-script when its content changes in
                           metadata (see watch below; the boot script starts it, start_watcher)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from email.utils import parsedate_to_datetime

# What the proxy accepts as a key: nothing nginx would read as syntax.
KEY_RE = r"[A-Za-z0-9._~+/=-]{16,512}"
KEY_RULE = (
    "# tpuserve: the API key (written at boot, 0600, tmpfs)\n"
    "if ($http_authorization = \"Bearer %s\") {\n"
    "    set $tpuserve_pass 1;\n"
    "}\n"
)


def error_status(path: str) -> None:
    try:
        with open(path) as f:
            e = json.load(f)["error"]
        print(e.get("status") or e["errors"][0]["reason"])
    except Exception:
        print("")


def secret_payload(response: str, dest: str) -> None:
    with open(response) as f:
        data = base64.b64decode(json.load(f)["payload"]["data"]).strip()
    with open(dest, "wb") as out:
        out.write(data)


def key_rule(raw: str, dest: str) -> None:
    with open(raw, "rb") as f:
        key = f.read().strip().decode("ascii", "replace")
    if not re.fullmatch(KEY_RE, key):
        sys.exit("the API key must be 16-512 characters of A-Z a-z 0-9 . _ ~ + / = -"
                 " (e.g. openssl rand -base64 32)")
    with open(dest, "w") as out:
        out.write(KEY_RULE % key)


def key_header(raw: str, dest: str) -> None:
    """The header line "Authorization: Bearer <key>" (for curl -H @DEST), written 0600: the
    probes of the proxy with a key by the boot, which never pass through argv."""
    with open(raw, "rb") as f:
        key = f.read().strip().decode("ascii", "replace")
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"Authorization: Bearer {key}\n")


def md5(path: str) -> None:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    print(base64.b64encode(h.digest()).decode())


def generation(path: str) -> None:
    with open(path) as f:
        print(int(json.load(f)["generation"]))


# ---------------------------------------------------------------- the watcher
# Metadata updates the startup-script in place (no reboot, no new VM), and the runner runs it
# only at boot: the watcher long-polls it and runs a changed script the way the runner would.
# The metadata server is trusted for what it says (the project owner writes the script) but
# not for how it answers: every request is bounded as a whole (bounded_get), a value is read
# to a size bound, and however fast or odd its answers, polls are spaced and errors back off.
SCRIPT_PATH = "/computeMetadata/v1/instance/attributes/startup-script"
MAX_SCRIPT_BYTES = 256 * 1024  # a metadata value is at most 256 KB; anything longer: not run
POLL_TIMEOUT_S = 60  # timeout_sec of one long poll (scaled; the server takes integers, >= 1)
POLL_GRACE_S = 10  # the whole poll ends this long after timeout_sec (real seconds)
MIN_POLL_GAP_S = 5  # between the starts of two polls, whatever the answers: never spins
BACKOFF_S = (1, 60)  # after a failed poll: 1 s, doubling to 60 s
APPLY_MAX_S = 4 * 3600  # the budgets of a boot (pull, readiness) end it long before
RETRIES = 3  # a script that did not reach readiness is run again at most this many times
RETRY_S = 30  # before the first retry; doubling (30, 60, 120 s), within the readiness budget
DEFAULT_READY_S = 1800  # a boot that did not write RUN_DIR/ready_timeout (an older script)
RECORD_MAX_S = 180  # one guest-attribute write through the recorder, its throttle included
KEY_REFRESH_S = 300  # the latest version of the API-key secret is read again at most this often
REFRESH_MAX_S = 600  # one run of the key refresher (its reads and the reload are bounded)
REFRESHER = "refresh_key.sh"  # in STATE_DIR, written by a boot that started the proxy
ETAG_RE = r"[A-Za-z0-9_.:+/=-]{1,128}"
OWED_KEY_RE = r"[A-Za-z0-9_-]{1,100}"  # a guest-attribute key (ga_owe in lib.sh names files so)
OWED_MAX_BYTES = 64 * 1024  # a guest-attribute value lib.sh writes is a line, far below this
PUT_MAX_S = 5  # one guest-attribute write (guest_put in lib.sh: --max-time 5, scaled)
RETRY_AFTER_MAX_S = 60  # the cap of lib.sh on a Retry-After (RETRY_AFTER_MAX_S there)
OWED_BACKOFF_S = (1, 30)  # the backoff of lib.sh: 1 s doubling to 30 s
# The metadata server takes 3 writes/s and 10/min per VM (lib.sh: ga_throttle keeps to 2/s and
# 8/min): a flush writes at most 4 values, 0.5 s apart, and the next flush of more waits 30 s.
OWED_PER_FLUSH, OWED_GAP_S, OWED_AFTER_FULL_S = 4, 0.5, 30


def retry_after_s(value: str | None) -> int:
    """A Retry-After (delta-seconds or an HTTP-date) in whole seconds, capped at
    RETRY_AFTER_MAX_S as retry_after in lib.sh caps it; 0 when absent, unreadable or past."""
    if not value:
        return 0
    value = value.strip()
    if re.fullmatch(r"[0-9]{1,9}", value):
        s = int(value)
    else:
        try:
            s = int(parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError, IndexError, OverflowError):
            return 0
    return max(0, min(s, RETRY_AFTER_MAX_S))


class PollError(Exception):
    pass


def bounded_get(url: str, headers: dict[str, str], limit: float,
                max_bytes: int) -> tuple[int, dict[str, str], bytes | None]:
    """GET URL, bounded as a whole: see bounded_request."""
    return bounded_request("GET", url, headers, limit, max_bytes)


def bounded_request(method: str, url: str, headers: dict[str, str], limit: float,
                    max_bytes: int, body: bytes | None = None,
                    ) -> tuple[int, dict[str, str], bytes | None]:
    """METHOD URL (http://) with BODY: (status, headers with lower-case names, body; None when over
    MAX_BYTES). The whole exchange (connect, request, headers, body) ends within LIMIT
    seconds: the timeout of http.client bounds each recv only, so an answer dripping a byte at a
    time would hold it without bound; a timer shuts the socket at the deadline instead.
    PollError on no answer, a broken one, or the deadline (a body cut short by it may look
    complete: never returned). Every HTTP read of the helper goes through here."""
    deadline = time.monotonic() + limit
    parts = urllib.parse.urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    if parts.scheme != "http":  # the metadata server; a Google API goes through lib.sh (curl)
        raise PollError(f"not an http:// URL: {url[:100]}")
    conn = http.client.HTTPConnection(parts.netloc, timeout=limit)
    expired = threading.Event()
    timer: threading.Timer | None = None
    try:
        conn.connect()  # bounded by the timeout; the timer needs the socket to shut
        # This socket, not conn.sock: a response that closes the connection takes it over
        # (conn.sock is then None) and reads on through it.
        sock = conn.sock

        def expire() -> None:
            expired.set()
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
        timer.daemon = True
        timer.start()
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = resp.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        answer_headers = {k.lower(): v for k, v in resp.getheaders()}
    except (OSError, http.client.HTTPException) as e:
        if expired.is_set():
            raise PollError(f"no whole answer within {limit:g} s") from None
        raise PollError(f"{type(e).__name__}: {e}") from None
    finally:
        if timer is not None:
            timer.cancel()
        conn.close()
    if expired.is_set():
        raise PollError(f"no whole answer within {limit:g} s")
    return resp.status, answer_headers, (b"".join(chunks) if size <= max_bytes else None)


class Watcher:
    """The watcher of a node: `watch --meta-host H --run-dir R --state-dir S --recorder F
    --scale-us N`. Holds RUN_DIR/watch.lock for its life (a second one exits at once).

    Long-polls SCRIPT_PATH (wait_for_change=true, last_etag, timeout_sec, header
    Metadata-Flavor: Google). A content change (sha256, not the ETag: the same script written
    again is nothing to do) is written to STATE_DIR/reconverge/startup-script.sh and run with
    bash in the environment of the watcher (that of the runner, or of its unit: see
    start_watcher), once no boot runs (the boot lock). Its guest attribute `reconverge`,
    written through the recorder (it runs ga, the boot function), one of exactly:
      watching etag=E                      started (E: the first ETag seen)
      changed sha256=HEX etag=E            a new script, about to run
      retrying sha256=HEX attempt=N/4 in=Ss WHY   it did not reach readiness; run again in S s
      applied sha256=HEX                   its boot reached readiness (final)
      failed sha256=HEX WHY                final until the next change: not ready after its
                                           retries, or not run (HEX "none": over 256 KiB)
    The end of a boot (RUN_DIR/boot.result: "<sha256 of its script> ready | failed <why>")
    says whether the script applied; the first baseline is the script the last boot ran.
    tpuserve/ops/reconverge.py parses these words (`tpuserve status --json`).
    """

    def __init__(self, argv: list[str]) -> None:
        p = argparse.ArgumentParser(prog="boot_helper.py watch")
        for name in ("--meta-host", "--run-dir", "--state-dir", "--recorder"):
            p.add_argument(name, required=True)
        p.add_argument("--scale-us", type=int, required=True)  # TPUSERVE_TIME_SCALE x 1e6
        # GA_URL and GA_OWED_DIR of lib.sh the values a boot gave up after the retries of ga
        p.add_argument("--ga-url", default="")
        p.add_argument("--owed-dir", default="")
        a = p.parse_args(argv)
        self.ga_url, self.owed_dir = a.ga_url.rstrip("/"), a.owed_dir
        self.next_flush, self.flush_backoff = 0.0, OWED_BACKOFF_S[0]
        self.host, self.run_dir, self.state_dir = a.meta_host, a.run_dir, a.state_dir
        self.recorder, self.scale = a.recorder, a.scale_us / 1e6
        self.timeout_sec = max(1, round(POLL_TIMEOUT_S * self.scale))
        self.last_words: list[str] = []

    def s(self, seconds: float) -> float:
        return seconds * self.scale

    def log(self, words: str) -> None:
        now = time.time()
        day = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
        print(f"{day}.{int(now * 1000) % 1000:03d}Z tpuserve-watch[{os.getpid()}]: {words}",
              flush=True)

    def record(self, *words: str) -> None:
        """Guest attribute `reconverge` = WORDS, through the recorder; best effort."""
        self.last_words = list(words)
        self.log("reconverge: " + " ".join(words))
        try:
            subprocess.run(["bash", self.recorder, *words], stdin=subprocess.DEVNULL,
                           timeout=max(10.0, self.s(RECORD_MAX_S)), check=False)
        except (OSError, subprocess.SubprocessError) as e:
            self.log(f"could not record: {e}")

    def poll(self, etag: str) -> tuple[bytes | None, str]:
        """One long poll: (value, None when over MAX_SCRIPT_BYTES; its ETag, "0" when the
        answer had no usable one). PollError: no answer, not a 200, or not all of it within
        timeout_sec + POLL_GRACE_S."""
        query = f"?wait_for_change=true&last_etag={etag}&timeout_sec={self.timeout_sec}"
        status, headers, body = bounded_get(f"http://{self.host}{SCRIPT_PATH}{query}",
                                            {"Metadata-Flavor": "Google"},
                                            self.timeout_sec + POLL_GRACE_S, MAX_SCRIPT_BYTES)
        if status != 200:
            raise PollError(f"HTTP {status}")
        new_etag = headers.get("etag", "")
        new_etag = new_etag if re.fullmatch(ETAG_RE, new_etag) else "0"
        return body, new_etag

    def booted_sha(self) -> str:
        """The sha256 of the script the last boot on this node ran, if it said."""
        try:
            with open(os.path.join(self.run_dir, "boot.result")) as f:
                word = f.read(200).split(" ", 1)[0]
        except OSError:
            return ""
        return word if re.fullmatch(r"[0-9a-f]{64}", word) else ""

    def wait_boot_lock(self) -> bool:
        """Wait until no boot runs (the boot lock is free); False after APPLY_MAX_S."""
        deadline = time.monotonic() + max(60.0, self.s(APPLY_MAX_S))
        with open(os.path.join(self.run_dir, "boot.lock"), "a") as lock:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True  # released on close: the script takes it itself
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(max(0.01, self.s(1)))

    def ready_budget(self) -> float:
        """The readiness budget of the last boot (RUN_DIR/ready_timeout, its READY_TIMEOUT in
        seconds), scaled: the bound of the retries of one script."""
        try:
            with open(os.path.join(self.run_dir, "ready_timeout")) as f:
                budget = int(f.read(20).strip())
        except (OSError, ValueError):
            budget = DEFAULT_READY_S
        return self.s(max(1, min(budget, APPLY_MAX_S)))

    def run_once(self, path: str, sha: str) -> tuple[str, str, bool]:
        """Run the script at PATH once, as the runner would: ("applied" | "failed", why,
        worth a retry). Applied only when the boot of exactly this script said it ended ready
        (boot.result): an exit 0 proves nothing (a truncated script ends 0 before readiness).
        """
        result_file = os.path.join(self.run_dir, "boot.result")
        limit = max(60.0, self.s(APPLY_MAX_S))
        for _attempt in range(3):
            if not self.wait_boot_lock():
                return "failed", "another boot kept the boot lock; not run", False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(result_file)
            try:
                rc = subprocess.run(["bash", path], stdin=subprocess.DEVNULL, timeout=limit,
                                    check=False).returncode
            except subprocess.TimeoutExpired:  # bash is killed; what it ran ends on its own
                return "failed", f"the script ran over {limit:.0f} s: stopped", False
            except OSError as e:
                return "failed", f"could not run bash: {e}", True
            try:
                with open(result_file) as f:
                    ran, _, outcome = f.readline().strip().partition(" ")
            except OSError:
                ran, outcome = "", ""
            if not (rc == 0 and ran and ran != sha):
                break
            # Another boot (a manual run) took the lock first: this one found it and skipped.
            self.log(f"a boot of another script (sha256={ran}) ran first; again")
        if ran == sha and outcome == "ready" and rc == 0:
            return "applied", "", False
        if ran == sha and outcome.startswith("failed "):
            return "failed", outcome[len("failed "):][:300], True
        if rc == 0:
            return "failed", "the script ended (exit 0) without reaching readiness", True
        return "failed", f"exit {rc}", True

    def apply(self, script: bytes, sha: str) -> list[str]:
        """Run SCRIPT as the runner would, retried with backoff (RETRY_S, doubling) at most
        RETRIES times while the retries start within the readiness budget; the words of its
        final outcome: applied sha256=HEX | failed sha256=HEX <why>. Each retry is recorded
        first: retrying sha256=HEX attempt=N/M in=Ss <why>."""
        folder = os.path.join(self.state_dir, "reconverge")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, "startup-script.sh")
        with open(path + ".new", "wb") as f:
            f.write(script)
        os.chmod(path + ".new", 0o700)
        os.replace(path + ".new", path)
        deadline, delay, attempts = None, RETRY_S, RETRIES + 1
        for attempt in range(1, attempts + 1):
            word, why, again = self.run_once(path, sha)
            if word == "applied":
                return ["applied", "sha256=" + sha]
            if deadline is None:  # the retries of one script fit in one readiness budget
                deadline = time.monotonic() + self.ready_budget()
            if not again or attempt == attempts:
                break
            wait = self.s(delay)
            if time.monotonic() + wait > deadline:
                why += " (no retry: the readiness budget is spent)"
                break
            self.record("retrying", "sha256=" + sha, f"attempt={attempt + 1}/{attempts}",
                        f"in={delay}s", why)
            time.sleep(wait)
            delay *= 2
        return ["failed", "sha256=" + sha, why]

    def refresh_key(self) -> None:
        """Run the key refresher (STATE_DIR/refresh_key.sh, written by the last boot that
        started or kept the API-key proxy): it reads the latest version of the secret and,
        when the key changed, rewrites the rule of the proxy in place and reloads nginx (no
        restart), or shuts every key out when no enabled version is left. Best effort: it
        logs and records (guest attribute secret) itself; skipped while a boot runs (that
        boot reads the key)."""
        path = os.path.join(self.state_dir, REFRESHER)
        if not os.path.isfile(path):
            return
        try:
            rc = subprocess.run(["bash", path], stdin=subprocess.DEVNULL,
                                timeout=max(30.0, self.s(REFRESH_MAX_S)),
                                check=False).returncode
        except (OSError, subprocess.SubprocessError) as e:
            self.log(f"key refresh: {e}")
            return
        if rc != 0:
            self.log(f"key refresh: exit {rc}")

    def owed_keys(self) -> list[str]:
        """The keys of the values owed (OWED_DIR/KEY), oldest first."""
        try:
            entries = [e for e in os.scandir(self.owed_dir)
                       if re.fullmatch(OWED_KEY_RE, e.name) and e.is_file()]
        except OSError:
            return []
        return [e.name for e in sorted(entries, key=lambda e: e.stat().st_mtime)]

    def flush_owed(self) -> None:
        """Write the guest-attribute values a boot or a refresh gave up after the retries of ga (a
        throttle outlasting them: a `state ready` lost so would leave `booting` for good): one
        try each, oldest first, each a bounded PUT. Written: cleared (unless a newer value of
        the key was owed meanwhile); refused (a 4xx but 403, 408, 429): dropped, logged; the
        first throttled, 5xx or unanswered try ends this flush, and the next waits for the
        Retry-After of the answer (capped at RETRY_AFTER_MAX_S) or the backoff, when longer. Skipped
        while a boot or a key refresh runs (key.lock, then the boot lock, as refresh_key takes
        them): their own writes flush, and an owed value never lands after a newer one."""
        if not (self.ga_url and self.owed_dir) or time.monotonic() < self.next_flush:
            return
        if not self.owed_keys():
            return
        with contextlib.ExitStack() as stack:
            for name in ("key.lock", "boot.lock"):
                lock = stack.enter_context(open(os.path.join(self.run_dir, name), "a"))
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return
            for tried, key in enumerate(self.owed_keys()):
                if tried == OWED_PER_FLUSH:
                    self.next_flush = time.monotonic() + self.s(OWED_AFTER_FULL_S)
                    return
                if tried:
                    time.sleep(self.s(OWED_GAP_S))
                path = os.path.join(self.owed_dir, key)
                try:
                    with open(path, "rb") as f:
                        value = f.read(OWED_MAX_BYTES + 1)
                except OSError:
                    continue
                if len(value) > OWED_MAX_BYTES:
                    self.log(f"guest attribute {key}: owed value over {OWED_MAX_BYTES} bytes;"
                             " dropped")
                    os.unlink(path)
                    continue
                try:
                    status, headers, _ = bounded_request(
                        "PUT", f"{self.ga_url}/{key}", {"Metadata-Flavor": "Google"},
                        max(1.0, self.s(PUT_MAX_S)), 4096, body=value)
                except PollError as e:
                    status, headers = 0, {}
                    self.log(f"guest attribute {key}: owed value not written ({e})")
                if 200 <= status < 300:
                    with contextlib.suppress(OSError), open(path, "rb") as f:
                        if f.read(OWED_MAX_BYTES + 1) == value:
                            os.unlink(path)
                    self.log(f"guest attribute {key}: owed value written")
                    self.flush_backoff = OWED_BACKOFF_S[0]
                    continue
                if status and status not in (403, 408, 429) and status < 500:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    self.log(f"guest attribute {key}: owed value refused (HTTP {status});"
                             " dropped")
                    continue
                wait = max(self.flush_backoff, retry_after_s(headers.get("retry-after")))
                self.next_flush = time.monotonic() + self.s(wait)
                self.flush_backoff = min(self.flush_backoff * 2, OWED_BACKOFF_S[1])
                if status:
                    self.log(f"guest attribute {key}: owed value not written (HTTP {status});"
                             f" again in {self.s(wait):g} s")
                return

    def run(self) -> None:
        lock = open(os.path.join(self.run_dir, "watch.lock"), "a")  # noqa: SIM115 (held for life)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # one runs already
        with open(os.path.join(self.run_dir, "watch.pid"), "w") as f:
            f.write(f"{os.getpid()}\n")
        current = self.booted_sha()
        self.log(f"watching the startup-script (booted sha256={current or None})")
        etag, backoff, last_start, announced = "0", BACKOFF_S[0], 0.0, False
        next_refresh = time.monotonic() + self.s(KEY_REFRESH_S)
        while True:
            gap = last_start + self.s(MIN_POLL_GAP_S) - time.monotonic()
            if gap > 0:
                time.sleep(gap)
            self.flush_owed()
            if time.monotonic() >= next_refresh:
                self.refresh_key()
                next_refresh = time.monotonic() + self.s(KEY_REFRESH_S)
            # A long poll ends by the next key refresh: a revoked key waits for no poll.
            self.timeout_sec = max(1, min(round(POLL_TIMEOUT_S * self.scale),
                                          int(next_refresh - time.monotonic()) + 1))
            last_start = time.monotonic()
            try:
                script, etag = self.poll(etag)
            except PollError as e:
                self.log(f"poll failed ({e}); next in {self.s(backoff):g} s")
                time.sleep(self.s(backoff))
                backoff = min(backoff * 2, BACKOFF_S[1])
                continue
            backoff = BACKOFF_S[0]
            if script is None:  # not run; its ETag is kept: the next poll waits for a change
                too_big = f"metadata: startup-script over {MAX_SCRIPT_BYTES} bytes: not run"
                words = ["failed", "sha256=none", too_big]
                if self.last_words != words:
                    self.record(*words)
                continue
            sha = hashlib.sha256(script).hexdigest()
            if not current:
                current = sha  # a boot that did not say: what metadata holds now is its script
            if not announced:
                self.record("watching", "etag=" + etag)
                announced = True
            if sha == current:
                continue
            current = sha
            self.record("changed", "sha256=" + sha, "etag=" + etag)
            self.record(*self.apply(script, sha))


def watch(*argv: str) -> None:
    Watcher(list(argv)).run()


COMMANDS = {
    "error-status": error_status,
    "secret-payload": secret_payload,
    "key-rule": key_rule,
    "key-header": key_header,
    "md5": md5,
    "generation": generation,
    "watch": watch,
}


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in COMMANDS:
        sys.exit("usage: boot_helper.py " + "|".join(COMMANDS) + " ARGS...")
    COMMANDS[argv[0]](*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
