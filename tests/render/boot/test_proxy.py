"""The proxy part: TLS off, no proxy at all, the key rule rewritten."""

from __future__ import annotations

import time

from tests.render.boot.support import (
    Cloud,
    _get,
    _tls,
)


def test_tls_off_serves_plain_http_and_publishes_so(cloud: Cloud) -> None:
    d = cloud.deployment
    node = cloud.node(d.model_copy(update={
        "access": d.access.model_copy(update={"tls": "off"}),
        "stack": d.stack.model_copy(update={"max_run_hours": 0}),
    }))
    node.run()
    attrs = node.attrs()
    assert attrs["tls"] == "off" and attrs["state"] == "ready"
    assert attrs["bypass_check"].startswith("refused count=")
    assert not list((node.root / "run/tpuserve/secrets").glob("tls-*"))
    assert _get(cloud.public_port, "/v1/models") == 401
    assert _get(cloud.public_port, "/v1/models", cloud.api_key) == 200
    assert "CALL openssl" not in node.spy_log.read_text()


def test_without_proxy_and_guard_vllm_listens_publicly(cloud: Cloud) -> None:
    d = cloud.deployment
    d = d.model_copy(update={
        "access": d.access.model_copy(update={"api_key_proxy": False}),
        "stack": d.stack.model_copy(update={"max_run_hours": 0}),
    })
    node = cloud.node(d)
    out = node.run()
    assert node.attrs()["state"] == "ready"
    assert not (node.docker_state / "containers/tpuserve-proxy.json").exists()
    assert node.container("vllm-gemma4")["cmd"][-4:] == [
        "--host", "0.0.0.0", "--port", str(cloud.public_port)]
    assert cloud.secrets.calls_for(d.api_key_secret_id) == []
    assert _get(cloud.public_port, "/v1/models") == 200  # the user's own gateway guards it
    assert "guard" not in out
    assert cloud.tpu.calls() == []


def test_a_key_rule_left_by_an_older_script_is_rewritten_on_the_next_run(cloud: Cloud) -> None:
    d = cloud.deployment
    node = cloud.node(d.model_copy(update={"stack": d.stack.model_copy(
        update={"max_run_hours": 0})}))
    node.run()
    rule = node.root / "run/tpuserve/secrets/api-key.conf"
    # The format before the raw-target rule: it answered 401 on /health too.
    rule.write_text(f'if ($http_authorization != "Bearer {cloud.api_key}") {{\n'
                    '    return 401;\n}\n')
    since = time.time()
    node.run()
    assert '= "Bearer ' in rule.read_text() and "set $tpuserve_pass 1;" in rule.read_text()
    started = [argv[argv.index("--name") + 1] for argv in node.docker_commands("run", since)]
    assert started == ["tpuserve-proxy"]  # a new rule is a new proxy; vLLM keeps serving
    assert _get(cloud.public_port, "/health", tls=_tls(node)) == 200
