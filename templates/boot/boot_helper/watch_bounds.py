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


