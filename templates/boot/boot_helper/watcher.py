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
