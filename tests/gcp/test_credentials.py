"""No credentials, or credentials that fail, end fast and in one line: off Google Cloud the
metadata server is not waited on (tpuserve.gcp.credentials), on the provisioner path and the
CLI's node path alike."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_support import Env, assert_one_line_error, invoke
from tests.gcp.tpu_support import REF, one_line, run_module
from tpuserve.gcp.credentials import on_google_vm


@pytest.fixture
def silent_metadata() -> Iterator[str]:
    """A loopback socket that accepts and never answers (a network that drops the probe)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.05)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def no_credentials_env(tmp_path: Path, metadata: str) -> dict[str, str]:
    return {"HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
            "GCE_METADATA_IP": metadata, "GCE_METADATA_HOST": metadata}


@pytest.mark.skipif(on_google_vm(), reason="a Google VM may have credentials")
def test_no_credentials_off_google_cloud_fail_fast_in_one_line(
    silent_metadata: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_env: Env,
) -> None:
    env = no_credentials_env(tmp_path, silent_metadata)
    start = time.monotonic()
    done = run_module(env, "describe", "--name", REF.name)
    took = time.monotonic() - start
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert "no credentials" in line and "not a Google Cloud VM" in line
    assert "gcloud auth application-default login" in line
    # The CLI's node path (google-cloud-tpu) goes through the same resolver.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CLOUDSDK_AUTH_ACCESS_TOKEN")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    start_cli = time.monotonic()
    result = invoke("status", "spot")
    took_cli = time.monotonic() - start_cli
    assert_one_line_error(result, "no credentials", "not a Google Cloud VM")
    print(f"\nno credentials: `python -m tpuserve.queued_resource describe` failed in "
          f"{took:.2f} s (process start included); `tpuserve status spot` in {took_cli:.2f} s")


def _service_account_adc(tmp_path: Path, token_uri: str) -> Path:
    """An ADC file whose token endpoint is TOKEN_URI (service-account keys honour it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    adc = tmp_path / "adc.json"
    adc.write_text(json.dumps({
        "type": "service_account", "project_id": "proj-test-1", "private_key_id": "k",
        "private_key": pem, "client_email": "sa@proj-test-1.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": token_uri}))
    return adc


@pytest.mark.parametrize("refused", [True, False], ids=["unreachable", "refused"])
def test_a_failed_token_refresh_is_one_line_not_a_traceback(
    tmp_path: Path, silent_metadata: str, refused: bool,
) -> None:
    """ADC sessions refresh their token inside each request: google.auth's own errors (a
    transport fault, retried; a refresh the token endpoint refuses) end in one line."""
    from werkzeug.wrappers import Response

    from tests.fakes.metadata import LoopbackServer

    server = LoopbackServer(lambda _r: Response(
        json.dumps({"error": "invalid_grant", "error_description": "Token has been expired"}),
        status=400, content_type="application/json"))
    server.start()
    try:
        port = server.port
        if refused:
            server.stop()  # nothing listens: every refresh is a transport error
        adc = _service_account_adc(tmp_path, f"http://127.0.0.1:{port}/token")
        env = {**no_credentials_env(tmp_path, silent_metadata),
               "GOOGLE_APPLICATION_CREDENTIALS": str(adc)}
        done = run_module(env, "describe", "--name", REF.name)
    finally:
        server.stop()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    line = one_line(done.stderr)
    if refused:
        assert "UNAVAILABLE" in line and "refreshing the access token" in line, line
    else:
        assert "could not be refreshed" in line and "invalid_grant" in line, line
