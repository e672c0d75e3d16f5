"""Shared fixtures of the tests/test_cli_*.py modules (no tests here).

`cli_env` points the CLI at a fake TPU API and a fake OpenAI-compatible server through the same
variables a user sets (CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU, CLOUDSDK_AUTH_ACCESS_TOKEN,
TPUSERVE_CONFIG, OPENAI_API_KEY); a node seeded with external IP 127.0.0.1 and the fake
server's port as vllm.port makes the node's endpoint the fake server.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import tests.fakes.tpu_api as tpu_fake
from tests.fakes.openai_server import FakeConfig, FakeOpenAIServer
from tpuserve.cli import app
from tpuserve.ops import png
from tpuserve.settings import Deployment, load

PROJECT = "tpuserve-test"
ZONE = "us-west4-a"
API_KEY = "sk-test-key-0123456789"


FakeTpu = tpu_fake.FakeTpuApi


def ga(fake: FakeTpu, node_id: str, attrs: dict[str, str]) -> None:
    for key, value in attrs.items():
        fake.set_guest_attribute(node_id, key, value)


BOOT_READY = {
    "boot": "2030-01-01T10:00:00.000Z started",
    "guard": "2030-01-01T10:00:00.500Z deadline=2030-01-01T18:00:00Z from=createTime",
    "secret": "2030-01-01T10:00:01.000Z fetched",
    "cache": "2030-01-01T10:00:02.000Z hit object_bytes=1 files=2 bytes=3",
    "image": "2030-01-01T10:01:00.000Z pulled vllm/vllm-tpu:nightly",
    "container": "2030-01-01T10:01:05.000Z started",
    "startup_complete": "2030-01-01T10:08:00.000Z seen",
    "health": "2030-01-01T10:08:01.000Z ok",
    "state": "2030-01-01T10:08:01.500Z ready",
}


@dataclass
class Env:
    tpu: FakeTpu
    oai: FakeOpenAIServer
    deployments: dict[str, Deployment]
    config_path: Path

    def d(self, stack: str) -> Deployment:
        return self.deployments[stack]

    def seed_ready(self, stack: str, attrs: dict[str, str] | None = None) -> Deployment:
        """A deployed, booted, healthy stack whose endpoint is the fake server."""
        d = self.d(stack)
        if d.stack.provisioning_model == "flex":
            self.tpu.seed_queued_resource(PROJECT, ZONE, d.node_name, state="ACTIVE")
            self.tpu.set_node_ip(d.node_name, "127.0.0.1")
        else:
            self.tpu.seed_node(PROJECT, ZONE, d.node_name, external_ip="127.0.0.1")
        ga(self.tpu, d.node_name, BOOT_READY if attrs is None else attrs)
        return d


def write_config(path: Path, port: int, extra: str = "", *, tls: bool = False) -> Path:
    """The fake server speaks plain HTTP unless a test gives it TLS (tests/cli/test_cli_tls.py):
    access.tls = "off" unless TLS or EXTRA's own [access] table says otherwise."""
    access = "" if tls or "[access]" in extra else '\n[access]\ntls = "off"\n'
    path.write_text(
        f'[gcp]\nproject = "{PROJECT}"\nzone = "{ZONE}"\n\n[vllm]\nport = {port}\n'
        f"max_model_len = 4096\n{extra}{access}"
    )
    return path


@pytest.fixture
def fake_tpu() -> Iterator[FakeTpu]:
    # Deletions complete on the next request; everything else moves only when a test says so.
    with FakeTpu(clock=time.time, durations={"DELETING": 0}) as api:
        yield api


@pytest.fixture
def fake_oai() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer(FakeConfig(api_key=API_KEY, max_model_len=4096))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cli_env(
    fake_tpu: FakeTpu, fake_oai: FakeOpenAIServer, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Env:
    config = write_config(tmp_path / "user.toml", fake_oai.port)
    for name, value in fake_tpu.environ().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TPUSERVE_CONFIG", str(config))
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("TPUSERVE_TIME_SCALE", "0")  # retry pauses of the Google API edge
    for name in ("TPUSERVE_PROJECT", "TPUSERVE_ZONE", "TPUSERVE_DEBUG",
                 "TPUSERVE_DEPLOY_COMMAND"):
        monkeypatch.delenv(name, raising=False)
    return Env(fake_tpu, fake_oai, load().deployments, config)


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run the CLI in-process; stdout and stderr apart (click >= 8.2)."""
    return CliRunner().invoke(app, list(args), env=env)


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """A failure reported as one line on stderr, never a traceback."""
    assert result.exit_code != 0
    assert "Traceback" not in result.output + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("tpuserve: error:")]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def is_png(data: bytes) -> bool:
    """A PNG as a decoder reads it: the signature, IHDR first, IEND last, every chunk's CRC."""
    if not data.startswith(png.SIGNATURE):
        return False
    pos, kinds = len(png.SIGNATURE), []
    while pos + 12 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        crc_bytes = data[pos + 8 + length : pos + 12 + length]
        if len(body) != length or len(crc_bytes) != 4:
            return False
        if struct.unpack(">I", crc_bytes)[0] != zlib.crc32(kind + body) & 0xFFFFFFFF:
            return False
        kinds.append(kind)
        pos += 12 + length
    return pos == len(data) and bool(kinds) and kinds[0] == b"IHDR" and kinds[-1] == b"IEND"
