"""`tpuserve endpoint`: the base URL and the command that prints the key, never the key."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_support import (
    API_KEY,
    PROJECT,
    ZONE,
    Env,
    assert_one_line_error,
    invoke,
    write_config,
)
from tpuserve.settings import load


def test_endpoint_prints_url_and_key_command_not_the_key(cli_env: Env) -> None:
    cli_env.seed_ready("flex")
    result = invoke("endpoint", "flex")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert f"http://127.0.0.1:{cli_env.oai.port}" in out
    assert (f'export OPENAI_API_KEY="$(gcloud secrets versions access latest '
            f'--secret=tpuserve-api-key --project={PROJECT})"') in out
    assert "gcloud secrets versions add tpuserve-api-key" in out  # how to create one
    assert API_KEY not in out + result.stderr
    assert cli_env.oai.requests == []  # the server is not even asked


def test_endpoint_json(cli_env: Env) -> None:
    cli_env.seed_ready("spot")
    doc = json.loads(invoke("endpoint", "spot", "--json").stdout)
    assert doc["openai_base_url"] == f"http://127.0.0.1:{cli_env.oai.port}/v1"
    assert doc["api_key_required"] is True
    assert doc["api_key_secret"] == "tpuserve-api-key"
    assert API_KEY not in json.dumps(doc)


def test_endpoint_without_the_proxy(cli_env: Env, tmp_path: Path) -> None:
    write_config(cli_env.config_path, cli_env.oai.port,
                 '\n[access]\napi_key_proxy = false\napi_source_ranges = ["10.0.0.0/8"]\n')
    assert load().deployments["spot"].access.api_key_proxy is False
    cli_env.seed_ready("spot")
    result = invoke("endpoint", "spot", "--json")
    doc = json.loads(result.stdout)
    assert doc["api_key_required"] is False and doc["api_key_command"] is None


def test_endpoint_of_a_node_without_ip(cli_env: Env) -> None:
    d = cli_env.d("ondemand")
    cli_env.tpu.seed_node(PROJECT, ZONE, d.node_name, state="CREATING", external_ip=None)
    result = invoke("endpoint", "ondemand")
    assert_one_line_error(result, "CREATING", "no external IP", "tpuserve wait ondemand")


def test_endpoint_not_deployed(cli_env: Env) -> None:
    assert_one_line_error(invoke("endpoint", "flex"), "does not exist", "npx cdktf deploy flex")
