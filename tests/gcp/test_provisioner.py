"""`python -m tpuserve.queued_resource`: the flex stack's provisioners (create, delete, probe,
describe) and their progress lines, run in-process against the fake TPU API."""

from __future__ import annotations

import base64
import gzip
import io
import json
import re

import pytest

from tests.fakes.tpu_api import FakeTpuApi
from tests.gcp.tpu_support import PROJECT, QR_ID, REF, ZONE, body
from tpuserve.gcp.provisioner import new_generation, probe
from tpuserve.gcp.tpu.queued_resources import MISSING
from tpuserve.progress_lines import rich_progress
from tpuserve.queued_resource import main
from tpuserve.render.queued_resource_body import with_generation


def run_cli(argv: list[str], env: dict[str, str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, environ=env, stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()

@pytest.fixture
def env(fast_api: FakeTpuApi) -> dict[str, str]:
    return {**fast_api.environ(), "TPUSERVE_QR_NAME": REF.name, "TPUSERVE_QR_POLL_SECONDS": "0"}

def test_cli_create_then_delete(fast_api, env) -> None:
    code, out, err = run_cli(["create"], {**env, "TPUSERVE_QR_BODY": json.dumps(body()),
                                          "TPUSERVE_QR_GENERATION": "gen-9"})
    assert code == 0, err
    assert out == (f"tpuserve: created {REF.name}: ACTIVE; ACTIVE can take a while: wait for it "
                   "with `tpuserve wait flex`\n")
    assert "tpuserve: queued resource tpuserve-flex: ACTIVE" in err
    [post] = fast_api.calls("POST")
    assert post.body == with_generation(body(), "gen-9")
    code, out, _ = run_cli(["create"], {**env, "TPUSERVE_QR_BODY": json.dumps(body()),
                                        "TPUSERVE_QR_GENERATION": "gen-9"})
    assert code == 0 and out.startswith("tpuserve: adopted")
    code, out, _ = run_cli(["describe"], env)
    assert code == 0 and json.loads(out)["state"]["state"] == "ACTIVE"
    assert run_cli(["delete"], env)[:2] == (0, f"tpuserve: deleted {REF.name}\n")
    assert run_cli(["delete"], env)[:2] == (0, f"tpuserve: already gone: {REF.name}\n")
    assert run_cli(["describe"], env)[0] == 1

def test_cli_body_file(fast_api, env, tmp_path) -> None:
    path = tmp_path / "body.json"
    path.write_text(json.dumps(body()))
    assert run_cli(["create", "--body-file", str(path)], env)[0] == 0
    assert fast_api.calls("POST")[0].body == body()

def test_cli_body_gzipped_as_the_stack_passes_it(fast_api, env) -> None:
    """The stack hands the body over as base64gzip(jsonencode(body)): a boot script of over
    100 KB fits no plain environment string (Linux: 128 KiB each)."""
    big = body(startup_script="#" * 150_000)
    encoded = base64.b64encode(gzip.compress(json.dumps(big).encode())).decode()
    assert len(encoded) < 100_000 < len(json.dumps(big))
    code, _, err = run_cli(["create"], {**env, "TPUSERVE_QR_BODY_GZ": encoded,
                                        "TPUSERVE_QR_BODY": "{not json"})  # GZ wins
    assert code == 0, err
    assert fast_api.calls("POST")[0].body == big


@pytest.mark.parametrize(("argv", "extra", "message"), [
    (["create"], {}, "body is missing: set TPUSERVE_QR_BODY_GZ, TPUSERVE_QR_BODY"),
    (["create"], {"TPUSERVE_QR_BODY_GZ": "bm90IGd6aXA="},
     "TPUSERVE_QR_BODY_GZ: not a gzipped, base64-coded body"),
    (["create"], {"TPUSERVE_QR_BODY_GZ": "%%%"},
     "TPUSERVE_QR_BODY_GZ: not a gzipped, base64-coded body"),
    (["create"], {"TPUSERVE_QR_BODY": "{not json"}, "TPUSERVE_QR_BODY: not valid JSON"),
    (["create"], {"TPUSERVE_QR_BODY": "[]"}, "TPUSERVE_QR_BODY: must be a JSON object"),
    (["create"], {"TPUSERVE_QR_BODY": '{"tpu": {}}'}, "nodeSpec must be a non-empty list"),
    (["create", "--body-file", "/nonexistent/b.json"], {}, "No such file"),
    (["create"], {"TPUSERVE_QR_BODY": json.dumps(body()), "TPUSERVE_QR_GENERATION": "A B"},
     "label value"),
    (["delete"], {"TPUSERVE_QR_NAME": ""}, "name is missing"),
    (["delete", "--name", "tpuserve-flex"], {}, "must look like projects/"),
    (["delete"], {"TPUSERVE_QR_POLL_SECONDS": "soon"}, "TPUSERVE_QR_POLL_SECONDS = 'soon'"),
    (["probe"], {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": "localhost:1"},
     "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU = 'localhost:1': must be an API root URL"),
])
def test_cli_bad_input_is_one_line_exit_2(env, argv, extra, message) -> None:
    code, out, err = run_cli(argv, {**env, **extra})
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and err.startswith("tpuserve: ")

@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
@pytest.mark.parametrize("command", ["create", "delete", "converge"])
def test_a_timeout_that_bounds_nothing_is_refused(env, capsys, command, value) -> None:
    """nan or inf would leave each call its own cap and the run no overall bound."""
    with pytest.raises(SystemExit) as exc:
        main([command, "--timeout", value], environ=env)
    assert exc.value.code == 2
    assert "argument --timeout" in capsys.readouterr().err


def test_cli_api_error_is_one_line_exit_1(fast_api, env) -> None:
    fast_api.fail_next(403, "PERMISSION_DENIED", "Permission 'tpu.queuedResources.create' "
                       "denied on 'projects/proj-test-1'", method="POST")
    code, _, err = run_cli(["create"], {**env, "TPUSERVE_QR_BODY": json.dumps(body())})
    assert code == 1 and "Traceback" not in err
    [line] = [ln for ln in err.splitlines() if "403" in ln]
    assert line.startswith(f"tpuserve: create queued resource {REF.name}: 403 PERMISSION_DENIED")
    assert "tpu.googleapis.com" in line

def test_cli_probe_speaks_the_external_data_source_protocol(fast_api, env) -> None:
    query = json.dumps({"name": REF.name})
    code, out, _ = run_cli(["probe"], env, query)
    missing = json.loads(out)
    assert code == 0 and missing["state"] == MISSING
    assert all(isinstance(v, str) for v in missing.values())  # the protocol: strings only
    fast_api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(), generation="gen-live")
    assert json.loads(run_cli(["probe"], env, query)[1]) == {"generation": "gen-live",
                                                             "state": "ACTIVE"}
    fast_api.set_state(QR_ID, "SUSPENDED")
    dead = json.loads(run_cli(["probe"], env, query)[1])
    assert dead["state"] == "SUSPENDED" and dead["generation"] != "gen-live"
    for bad in ("", "[]", '{"name": 3}', '{"name": "x"}'):
        code, out, err = run_cli(["probe"], env, bad or "nope")
        assert code == 2 and out == "" and err.startswith("tpuserve: probe")

def test_probe_of_a_live_qr_without_label_asks_for_a_new_one(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())  # made by hand: no label
    answer = probe(client, REF)
    assert answer["state"] == "ACTIVE"
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", answer["generation"])  # a fresh token


def test_a_generation_token_is_utc_time_and_four_hex_digits() -> None:
    token = new_generation(now=0)
    assert token.startswith("19700101-000000-") and len(token) == 20


def test_progress_is_a_spinner_on_a_terminal_and_lines_elsewhere() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        with rich_progress("queued resource tpuserve-flex", stream) as progress:
            for state in ("ACCEPTED", "ACCEPTED", "ACTIVE"):
                progress(state, 1.0)
    assert pipe.getvalue().splitlines() == [
        "tpuserve: queued resource tpuserve-flex: ACCEPTED (1 s)",
        "tpuserve: queued resource tpuserve-flex: ACTIVE (1 s)",
    ]
    assert "\x1b[" in tty.getvalue()  # rich drew on the terminal
    assert tty.getvalue().count("queued resource tpuserve-flex: ACTIVE") >= 1


@pytest.mark.parametrize(("other", "shown"), [
    (f"projects/{PROJECT}/locations/{ZONE}/queuedResources/someone-else",
     f"'projects/{PROJECT}/locations/{ZONE}/queuedResources/someone-else'"),
    (None, "missing"),
])
def test_probe_refuses_an_answer_that_is_another_qr(fast_api, env, other, shown) -> None:
    """A live QR, and a 200 that is another (dead) QR, or none: taken as this one's state it
    would plan a replacement of the live one (on the old code: a new generation)."""
    fast_api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(), generation="gen-live")
    answer = {"state": {"state": "SUSPENDED"}, **({"name": other} if other else {})}
    fast_api.answer_next(200, json.dumps(answer), method="GET", path_contains="queuedResources")
    code, out, err = run_cli(["probe"], env, json.dumps({"name": REF.name}))
    assert (code, out) == (1, "")
    assert err == (f"tpuserve: get queued resource {REF.name}: 200 OK: the answer is not queued "
                   f"resource {REF.name} (its name is {shown}): it proves nothing\n")


@pytest.mark.parametrize(("change", "said"), [
    ({"tpu": None}, "its tpu is null"),
    ({"tpu": {"nodeSpec": []}}, "its tpu.nodeSpec is empty"),
    ({"tpu": {"nodeSpec": None}}, "its tpu.nodeSpec is null"),
    ({"tpu": {"nodeSpec": [None]}}, "a tpu.nodeSpec entry is not a NodeSpec with a node object"),
    ({"state": "ACTIVE"}, "its state is a string, not a QueuedResourceState object"),
])
@pytest.mark.parametrize("command", ["probe", "converge"])
def test_a_qr_answer_that_is_not_a_tpu_queued_resource_proves_nothing(
        fast_api, env, change, said, command) -> None:
    """The QR's own name, but not its documented shape: one line, exit 1 (on the old code a
    traceback, or for an empty nodeSpec a live unlabelled QR: a new generation, so a plan
    that replaces the live QR)."""
    fast_api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(), generation="gen-live")
    answer = {"name": REF.name, "state": {"state": "ACTIVE"}, "tpu": body()["tpu"], **change}
    fast_api.answer_next(200, json.dumps(answer), method="GET", path_contains="queuedResources",
                         times=50)
    extra = {"TPUSERVE_QR_BODY": json.dumps(body())} if command == "converge" else {}
    code, out, err = run_cli([command], {**env, **extra}, json.dumps({"name": REF.name}))
    assert (code, out) == (1, "")
    assert err == (f"tpuserve: get queued resource {REF.name}: 200 OK: the answer is not a TPU "
                   f"queued resource ({said}): it proves nothing\n")
