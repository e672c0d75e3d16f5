"""Every command that talks to a node pins the certificate the node published (access.tls =
"self-signed", the default): the fake OpenAI server serves HTTPS with a certificate made here
by openssl the way the boot makes it, and the fake TPU API holds its guest attribute
`tpuserve/tls`. A server presenting another certificate is refused in one line before the
key or any prompt is sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_support import (
    API_KEY,
    BOOT_READY,
    FakeTpu,
    assert_one_line_error,
    ga,
    invoke,
    write_config,
)
from tests.fakes.openai_server import FakeConfig, FakeOpenAIServer
from tpuserve.ops import tls
from tpuserve.settings import Deployment, load


@dataclass(frozen=True)
class Cert:
    pem: Path
    key: Path
    der: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.der).hexdigest()

    @property
    def attribute(self) -> str:
        """The boot script's guest attribute value for this certificate."""
        return (f"2030-01-01T10:00:01.500Z sha256={self.sha256} "
                f"cert={base64.b64encode(self.der).decode()}")

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.pem, self.key)
        return ctx


def make_cert(base: Path, name: str) -> Cert:
    """As the boot's tls_cert does: EC P-256, self-signed, IP SAN 127.0.0.1."""
    pem, key = base / f"{name}.pem", base / f"{name}-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=tpuserve", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(pem)], check=True, capture_output=True)
    der = ssl.PEM_cert_to_DER_cert(pem.read_text())
    return Cert(pem, key, der)


@dataclass
class TlsEnv:
    tpu: FakeTpu
    oai: FakeOpenAIServer
    served: Cert  # what the server presents
    other: Cert  # a certificate the server does not have
    deployments: dict[str, Deployment]

    def seed(self, stack: str, cert: Cert | None) -> Deployment:
        """A READY node at 127.0.0.1 whose boot published CERT (None: nothing yet)."""
        d = self.deployments[stack]
        self.tpu.seed_node(d.gcp.project, d.gcp.zone, d.node_name, external_ip="127.0.0.1")
        attrs = dict(BOOT_READY)
        if cert is not None:
            attrs["tls"] = cert.attribute
        ga(self.tpu, d.node_name, attrs)
        return d


@pytest.fixture
def tls_env(fake_tpu: FakeTpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            ) -> Iterator[TlsEnv]:
    served, other = make_cert(tmp_path, "served"), make_cert(tmp_path, "other")
    server = FakeOpenAIServer(FakeConfig(api_key=API_KEY, max_model_len=4096),
                              tls=served.server_context())
    server.start()
    config = write_config(tmp_path / "user.toml", server.port, tls=True)
    for name, value in fake_tpu.environ().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TPUSERVE_CONFIG", str(config))
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.chdir(tmp_path)
    for name in ("TPUSERVE_PROJECT", "TPUSERVE_ZONE", "TPUSERVE_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    deployments = load().deployments
    assert deployments["spot"].access.tls_on  # the default
    yield TlsEnv(fake_tpu, server, served, other, deployments)
    server.stop()


def test_status_and_wait_check_health_over_pinned_tls(tls_env: TlsEnv) -> None:
    tls_env.seed("spot", tls_env.served)
    (s,) = json.loads(invoke("status", "spot", "--json").stdout)["stacks"]
    assert s["endpoint"] == f"https://127.0.0.1:{tls_env.oai.port}"
    assert s["health"] == {"ok": True, "detail": "HTTP 200"}
    result = invoke("wait", "spot", "--poll-interval", "0")
    assert result.exit_code == 0, result.stderr
    assert f"https://127.0.0.1:{tls_env.oai.port}/v1" in result.stdout
    assert tls.colons(tls_env.served.sha256) in result.stdout


def test_status_refuses_a_server_with_another_certificate(tls_env: TlsEnv) -> None:
    tls_env.seed("spot", tls_env.other)  # the node published one; port 8000 serves another
    (s,) = json.loads(invoke("status", "spot", "--json").stdout)["stacks"]
    assert s["health"]["ok"] is False
    assert "CERTIFICATE_VERIFY_FAILED" in s["health"]["detail"]


def test_smoke_and_bench_of_a_stack_run_over_pinned_tls(tls_env: TlsEnv, tmp_path: Path,
                                                       ) -> None:
    tls_env.seed("spot", tls_env.served)
    result = invoke("smoke", "spot")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "9/9 passed or skipped" in result.stdout
    assert f"smoke test of https://127.0.0.1:{tls_env.oai.port}" in result.stdout
    result = invoke("bench", "spot", "--contexts", "32", "--clients", "2", "--repetitions", "1",
                    "--output-tokens", "4", "--requests-per-client", "1", "--no-chart",
                    "--out", str(tmp_path / "out"), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["base_url"] == f"https://127.0.0.1:{tls_env.oai.port}"
    assert doc["cells"] and not doc.get("errors")


def test_a_server_with_another_certificate_never_gets_the_key(tls_env: TlsEnv) -> None:
    tls_env.seed("spot", tls_env.other)
    for command in ("smoke", "bench"):
        result = invoke(command, "spot")
        assert_one_line_error(result, f"https://127.0.0.1:{tls_env.oai.port} presents a "
                              f"certificate with SHA-256 {tls.colons(tls_env.served.sha256)}",
                              f"not the pinned {tls.colons(tls_env.other.sha256)}",
                              "refusing to send the key")
    assert tls_env.oai.requests == []  # not one HTTP request reached it


def test_a_node_that_has_not_published_its_certificate_is_not_contacted(tls_env: TlsEnv,
                                                                        ) -> None:
    tls_env.seed("spot", None)
    assert_one_line_error(invoke("smoke", "spot"), "has not published its TLS certificate",
                          "tpuserve wait spot")
    (s,) = json.loads(invoke("status", "spot", "--json").stdout)["stacks"]
    assert s["health"]["ok"] is None and "not published" in s["health"]["detail"]
    doc = json.loads(invoke("endpoint", "spot", "--json").stdout)
    assert doc["base_url"] == f"https://127.0.0.1:{tls_env.oai.port}" and doc["tls"] is None
    assert "has not published its TLS certificate" in doc["tls_pending"]
    assert tls_env.oai.requests == []


def test_an_explicit_https_endpoint_takes_a_fingerprint_or_a_cacert(tls_env: TlsEnv) -> None:
    base = tls_env.oai.base_url
    right = tls.colons(tls_env.served.sha256)
    ok = invoke("smoke", "--endpoint", base, "--fingerprint", right, "--json")
    assert ok.exit_code == 0, ok.stderr
    ok = invoke("smoke", "--endpoint", base, "--cacert", str(tls_env.served.pem), "--json")
    assert ok.exit_code == 0, ok.stderr
    before = len(tls_env.oai.requests)
    wrong = invoke("smoke", "--endpoint", base, "--fingerprint", tls_env.other.sha256)
    assert_one_line_error(wrong, "presents a certificate", "given with --fingerprint")
    # The system's CAs do not know a self-signed certificate: every check fails to connect.
    plain = invoke("smoke", "--endpoint", base, "--json")
    assert plain.exit_code == 1
    assert "CERTIFICATE_VERIFY_FAILED" in plain.stdout + plain.stderr
    assert len(tls_env.oai.requests) == before
    assert_one_line_error(invoke("smoke", "--endpoint", base, "--fingerprint", "abc"),
                          "--fingerprint = 'abc': not a SHA-256 fingerprint")
    assert_one_line_error(invoke("smoke", "spot", "--fingerprint", right),
                          "--fingerprint and --cacert go with --endpoint")


def test_endpoint_prints_the_https_url_and_how_clients_trust_the_certificate(
    tls_env: TlsEnv, tmp_path: Path,
) -> None:
    tls_env.seed("spot", tls_env.served)
    base = f"https://127.0.0.1:{tls_env.oai.port}"
    result = invoke("endpoint", "spot")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert f"OpenAI base  {base}/v1" in out
    assert tls.colons(tls_env.served.sha256) in out
    assert "tpuserve endpoint spot --cert-out tpuserve-spot.pem" in out
    assert "curl --cacert tpuserve-spot.pem" in out
    assert 'verify=ssl.create_default_context(cafile="tpuserve-spot.pem")' in out
    cert = tmp_path / "node.pem"
    doc = json.loads(invoke("endpoint", "spot", "--cert-out", str(cert), "--json").stdout)
    assert doc["openai_base_url"] == f"{base}/v1"
    assert doc["tls"]["sha256"] == tls_env.served.sha256
    assert ssl.PEM_cert_to_DER_cert(cert.read_text()) == tls_env.served.der
    assert API_KEY not in out + json.dumps(doc)
    assert tls_env.oai.requests == []
    # What it prints works: curl with the written certificate reaches the server.
    curl = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert",
                           str(cert), f"{base}/health"], capture_output=True, text=True,
                          check=False)
    assert curl.stdout == "200", curl.stderr


def test_a_published_attribute_that_does_not_hash_to_its_fingerprint_is_an_error() -> None:
    der = b"not really a certificate"
    good = f"t sha256={hashlib.sha256(der).hexdigest()} cert={base64.b64encode(der).decode()}"
    assert isinstance(tls.published_tls({"tls": good}, where="n"), tls.Pin)
    assert tls.published_tls({"tls": "t off"}, where="n") == "off"
    assert tls.published_tls({}, where="n") is None
    # An earlier boot's certificate (the tmpfs, and so the key, died with that boot).
    stale = good.replace("t ", "2030-01-01T09:00:00.000Z ", 1)
    assert tls.published_tls({"tls": stale, "boot": "2030-01-01T10:00:00.000Z started"},
                             where="n") is None
    assert isinstance(tls.published_tls({"tls": stale, "boot": "2030-01-01T08:00:00.000Z x"},
                                        where="n"), tls.Pin)
    bad = good.replace("sha256=", "sha256=0")[:-1]
    with pytest.raises(tls.OpsError, match="is not a certificate and its SHA-256"):
        tls.published_tls({"tls": bad}, where="n")
    assert tls.parse_fingerprint("SHA256 Fingerprint=" + tls.colons("ab" * 32)) == "ab" * 32


def test_fingerprints_print_verbatim_not_as_emoji() -> None:
    # rich turns ":ab:" into an emoji unless told not to; a fingerprint is full of them.
    result = invoke("smoke", "--endpoint", "https://127.0.0.1:9", "--fingerprint", "1E:AB:53")
    assert_one_line_error(result, "--fingerprint = '1E:AB:53'")
