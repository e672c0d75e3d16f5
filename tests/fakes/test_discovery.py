"""The discovery-document validator itself: each rule refuses what it should and accepts the
documented shapes (TPU v2/v2alpha1, Storage v1, Secret Manager v1, Cloud Tasks v2, IAM v1,
Compute v1 as shipped by the pinned google-api-python-client)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from werkzeug import Request, Response
from werkzeug.test import Client

from tests.fakes.discovery import (
    Call,
    Discovery,
    DiscoveryRefusal,
    ResponseViolation,
    all_violations,
    deliberate,
    guarded,
)
from tests.fakes.metadata import dropped

NODE = "/v2/projects/p/locations/us-central1-a/nodes/n1"
NODES = "/v2/projects/p/locations/us-central1-a/nodes"


@pytest.fixture(scope="module")
def tpu() -> Discovery:
    return Discovery.load("tpu", "v2")


@pytest.fixture(scope="module")
def storage() -> Discovery:
    return Discovery.load("storage", "v1")


def refusal(doc: Discovery, method: str, path: str, query: dict[str, list[str]] | None = None,
            body: Any = None) -> DiscoveryRefusal:
    with pytest.raises(DiscoveryRefusal) as caught:
        doc.check_request(method, path, query or {}, body)
    return caught.value


def test_load_is_cached_per_process() -> None:
    assert Discovery.load("tpu", "v2") is Discovery.load("tpu", "v2")
    assert Discovery.load("tpu", "v2alpha1") is not Discovery.load("tpu", "v2")


# ------------------------------------------------------------------ method and path
def test_path_matches_reserved_expansion_and_names_the_parameter(tpu: Discovery) -> None:
    call = tpu.check_request("GET", NODE, {}, None)
    assert call == Call("tpu.projects.locations.nodes.get",
                        {"name": "projects/p/locations/us-central1-a/nodes/n1"})


def test_custom_verb_wins_over_the_plain_resource_path(tpu: Discovery) -> None:
    assert tpu.check_request("POST", NODE + ":stop", {}, {}).method_id == (
        "tpu.projects.locations.nodes.stop")
    assert tpu.check_request("GET", "/v2/projects/p/locations/us-central1-a/operations/o",
                             {}, None).method_id == "tpu.projects.locations.operations.get"


def test_list_and_create_share_a_path_by_http_method(tpu: Discovery) -> None:
    assert tpu.check_request("GET", NODES, {}, None).method_id.endswith("nodes.list")
    assert tpu.check_request("POST", NODES, {"nodeId": ["n1"]}, {}).method_id.endswith(
        "nodes.create")


@pytest.mark.parametrize("method,path", [
    ("GET", "/v2/projects/p/locations/us-central1-a/widgets/w"),   # no such collection
    ("GET", "/v3/projects/p/locations/us-central1-a/nodes/n1"),     # no such version
    ("GET", "/v2/projects/p/locations/us-central1-a/nodes/n1/x"),   # the pattern refuses it
    ("PUT", NODE),                                                  # wrong HTTP method
    ("POST", NODE),
])
def test_unknown_path_or_method_is_the_front_ends_404_page(tpu: Discovery, method: str,
                                                          path: str) -> None:
    refused = refusal(tpu, method, path)
    assert (refused.code, refused.status, refused.html_page) == (404, "NOT_FOUND", True)
    page = refused.response().get_data(as_text=True)
    assert "404." in page and "That\u2019s an error." in page and path in page


def test_storage_is_mounted_under_its_service_path_and_decodes_names(
        storage: Discovery) -> None:
    call = storage.check_request("GET", "/storage/v1/b/bkt/o/dir%2Fobj.tar.gz", {}, None)
    assert call == Call("storage.objects.get", {"bucket": "bkt", "object": "dir/obj.tar.gz"})
    assert refusal(storage, "GET", "/b/bkt/o/x").code == 404  # no servicePath


# ------------------------------------------------------------------ query parameters
def test_unknown_query_parameter_is_refused_the_way_google_words_it(tpu: Discovery) -> None:
    refused = refusal(tpu, "GET", NODE, {"view": ["FULL"]})
    assert (refused.code, refused.status) == (400, "INVALID_ARGUMENT")
    assert 'Unknown name "view": Cannot bind query parameter' in refused.message
    detail = refused.body()["error"]["details"][0]
    assert detail["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    assert detail["fieldViolations"][0]["description"] == refused.message


def test_standard_parameters_are_accepted_and_typed(tpu: Discovery) -> None:
    tpu.check_request("GET", NODE, {"alt": ["json"], "prettyPrint": ["false"],
                                    "$.xgafv": ["2"], "fields": ["name,state"]}, None)
    assert refusal(tpu, "GET", NODE, {"alt": ["xml"]}).code == 400           # enum
    assert refusal(tpu, "GET", NODE, {"prettyPrint": ["maybe"]}).code == 400  # boolean


def test_method_query_parameters_types_and_repetition(tpu: Discovery) -> None:
    tpu.check_request("GET", NODES, {"pageSize": ["50"], "pageToken": ["t"]}, None)
    assert "pageSize" in refusal(tpu, "GET", NODES, {"pageSize": ["many"]}).message
    assert refusal(tpu, "GET", NODES, {"pageSize": ["99999999999"]}).code == 400  # int32
    assert "Multiple values" in refusal(tpu, "GET", NODES, {"pageToken": ["a", "b"]}).message


def test_fieldmask_format(tpu: Discovery) -> None:
    for mask in ("labels", "labels,metadata", "networkConfig.enableExternalIps", ""):
        tpu.check_request("PATCH", NODE, {"updateMask": [mask]}, {})
    for mask in ("labels metadata", "labels,,metadata", ".labels", "la-bels"):
        assert refusal(tpu, "PATCH", NODE, {"updateMask": [mask]}, {}).code == 400


def test_required_query_parameter(storage: Discovery) -> None:
    storage.check_request("GET", "/storage/v1/b", {"project": ["p"]}, None)
    assert "Required parameter: project" in refusal(storage, "GET", "/storage/v1/b").message


def test_int64_query_parameter(storage: Discovery) -> None:
    path = "/storage/v1/b/bkt/o/x"
    storage.check_request("GET", path, {"ifGenerationMatch": ["0"]}, None)
    assert refusal(storage, "GET", path, {"ifGenerationMatch": ["zero"]}).code == 400


def test_query_pattern_is_checked_where_given() -> None:
    doc = Discovery.load("compute", "v1")
    path = "/compute/v1/projects/p/zones/us-central1-a/instances"
    doc.check_request("POST", path, {"requestId": ["r1"]}, {"name": "vm"})
    # Compute's project path parameter has a pattern: a project id cannot hold "!".
    assert refusal(doc, "GET", "/compute/v1/projects/p!/zones/us-central1-a").code == 404


# ------------------------------------------------------------------ request bodies
def test_documented_body_is_accepted(tpu: Discovery) -> None:
    body = {
        "acceleratorType": "v5litepod-8", "runtimeVersion": "v2-alpha-tpuv5-lite",
        "networkConfig": {"enableExternalIps": True, "queueCount": 4},
        "schedulingConfig": {"spot": True},
        "labels": {"managed-by": "tpuserve"}, "metadata": {"startup-script": "#!/bin/bash"},
        "tags": ["a", "b"], "dataDisks": [{"sourceDisk": "d", "mode": "READ_ONLY"}],
    }
    assert tpu.check_request("POST", NODES, {"nodeId": ["n1"]}, body).method_id.endswith(
        "nodes.create")


@pytest.mark.parametrize("body,needle", [
    ({"bogus": 1}, "Unknown name \"bogus\" at 'node': Cannot find field."),
    ({"networkConfig": {"bogus": 1}}, "Unknown name \"bogus\" at 'node.network_config'"),
    ({"accelerator_type": "v5litepod-8"}, 'Unknown name "accelerator_type"'),  # snake_case
    ({"acceleratorConfig": {"type": "V9"}}, "node.accelerator_config.type"),     # enum
    ({"state": "READY"}, "Field 'node.state' is output only"),                      # readOnly desc
    ({"networkEndpoints": [{"ipAddress": "1.2.3.4"}]}, "node.network_endpoints"),
    ({"labels": "managed-by=tpuserve"}, "'node.labels'"),                       # map type
    ({"labels": {"k": 1}}, "'node.labels[k]'"),                                  # map values
    ({"tags": "a"}, "'node.tags'"),                                             # array
    ({"networkConfig": {"enableExternalIps": "true"}}, "TYPE_BOOL"),            # boolean
    ({"networkConfig": {"queueCount": 1.5}}, "TYPE_INT32"),                     # integer
    ({"bootDiskConfig": {"diskSizeGb": "100"}}, 'Unknown name "diskSizeGb"'),   # v2alpha1's
    ({"dataDisks": [{"mode": "RW"}]}, "node.data_disks[0].mode"),               # nested enum
])
def test_body_rules_refuse(tpu: Discovery, body: dict[str, Any], needle: str) -> None:
    refused = refusal(tpu, "POST", NODES, {"nodeId": ["n1"]}, body)
    assert (refused.code, refused.status) == (400, "INVALID_ARGUMENT")
    assert needle in refused.message
    assert refused.body()["error"]["details"][0]["fieldViolations"]


def test_int64_accepts_a_decimal_string_or_an_integer_in_requests() -> None:
    doc = Discovery.load("tpu", "v2alpha1")
    path = "/v2alpha1/projects/p/locations/us-central1-a/nodes"
    for size in ("100", 100):
        doc.check_request("POST", path, {}, {"bootDiskConfig": {"diskSizeGb": size}})
    for size in ("100GB", 1.5, True, "99999999999999999999"):
        refused = refusal(doc, "POST", path, {}, {"bootDiskConfig": {"diskSizeGb": size}})
        assert "node.boot_disk_config.disk_size_gb" in refused.message


def test_duration_and_datetime_formats() -> None:
    doc = Discovery.load("tpu", "v2alpha1")
    path = "/v2alpha1/projects/p/locations/us-central1-a/queuedResources"
    ok = {"queueingPolicy": {"validUntilDuration": "3600s",
                             "validAfterTime": "2026-12-01T10:00:00.5Z"},
          "runDuration": {"maxRunDuration": "1.5s"}}
    doc.check_request("POST", path, {"queuedResourceId": ["q"]}, ok)
    for bad in ({"queueingPolicy": {"validUntilDuration": "1h"}},
                {"queueingPolicy": {"validUntilDuration": 3600}},
                {"queueingPolicy": {"validAfterTime": "2026-12-01 10:00"}},
                {"runDuration": {"terminationTime": "tomorrow"}}):
        assert refusal(doc, "POST", path, {}, bad).code == 400


def test_compute_output_only_is_written_in_brackets() -> None:
    doc = Discovery.load("compute", "v1")
    path = "/compute/v1/projects/p/zones/us-central1-a/instances"
    refused = refusal(doc, "POST", path, {}, {"name": "vm", "creationTimestamp": "x"})
    assert "instance.creation_timestamp" in refused.message and "output only" in refused.message


def test_read_only_flag_and_description_rules() -> None:
    doc = Discovery({
        "name": "toy", "version": "v1", "servicePath": "", "parameters": {},
        "schemas": {"Thing": {"id": "Thing", "type": "object", "properties": {
            "flagged": {"type": "string", "readOnly": True, "description": "Etag."},
            "described": {"type": "string", "description": "  output only: the time"},
            "free": {"type": "string", "description": "Outputs only if set."},
            "tagged": {"type": "string", "description": "Optional. Output only. A time."},
            "hyphen": {"type": "string", "description": "Output-only: a count."},
        }}},
        "resources": {"things": {"methods": {"insert": {
            "id": "toy.things.insert", "httpMethod": "POST", "path": "v1/things",
            "request": {"$ref": "Thing"}, "response": {"$ref": "Thing"}}}}},
    })
    doc.check_request("POST", "/v1/things", {}, {"free": "x"})
    for name in ("flagged", "described", "tagged", "hyphen"):
        assert "output only" in refusal(doc, "POST", "/v1/things", {}, {name: "x"}).message
        doc.check_response(Call("toy.things.insert", {}), {name: "x"})  # fine in an answer


def test_null_is_unset_in_a_request(tpu: Discovery) -> None:
    tpu.check_request("PATCH", NODE, {"updateMask": ["labels"]}, {"labels": None})


def test_method_without_request_schema_refuses_a_body(tpu: Discovery) -> None:
    assert "takes no request body" in refusal(tpu, "GET", NODE, {}, {"name": "x"}).message
    assert tpu.check_request("DELETE", NODE, {}, None).method_id.endswith("nodes.delete")


def test_unparseable_body_is_refused(tpu: Discovery) -> None:
    assert "Invalid JSON payload" in refusal(tpu, "POST", NODES, {}, b"{not json").message


# ------------------------------------------------------------------ media
def test_media_download_only_where_documented(storage: Discovery) -> None:
    call = storage.check_request("GET", "/storage/v1/b/bkt/o/x", {"alt": ["media"]}, None)
    assert call.alt == "media"
    assert "alt=media" in refusal(storage, "GET", "/storage/v1/b/bkt", {"alt": ["media"]}).message


def test_media_upload_protocols(storage: Discovery) -> None:
    up = "/upload/storage/v1/b/bkt/o"
    media = storage.check_request("POST", up, {"uploadType": ["media"], "name": ["x"]}, b"\0")
    assert (media.method_id, media.upload) == ("storage.objects.insert", "media")
    multi = storage.check_request("POST", up, {"uploadType": ["multipart"]}, {"name": "x"})
    assert multi.upload == "multipart"
    assert refusal(storage, "POST", up, {"uploadType": ["multipart"]}, {"bogus": 1}).code == 400
    opened = storage.check_request("POST", up, {"uploadType": ["resumable"], "name": ["x"]}, None)
    assert (opened.upload, opened.session) == ("resumable", False)
    later = storage.check_request("PUT", up, {"uploadType": ["resumable"], "upload_id": ["u"]},
                                  b"bytes")
    assert later.session
    assert "uploadType" in refusal(storage, "POST", up, {"name": ["x"]}, b"\0").message
    assert refusal(storage, "PUT", up, {"uploadType": ["resumable"]}, b"x").code == 404
    assert refusal(storage, "POST", "/storage/v1/b/bkt/o", {"upload_id": ["u"]}).code == 400


# ------------------------------------------------------------------ answers
def test_documented_answer_validates(tpu: Discovery) -> None:
    call = Call("tpu.projects.locations.nodes.get", {})
    tpu.check_response(call, {"name": "projects/p/locations/z/nodes/n", "state": "READY",
                              "id": "123", "createTime": "2026-12-01T10:00:00Z",
                              "networkEndpoints": [{"ipAddress": "10.0.0.2", "port": 8470}]})
    tpu.check_response(Call("tpu.projects.locations.nodes.delete", {}),
                       {"name": "o", "done": False, "metadata": {"@type": "x", "any": [1]}})


@pytest.mark.parametrize("body,needle", [
    ({"bogus": 1}, 'Unknown name "bogus"'),
    ({"state": "UP"}, "'state'"),
    ({"id": 123}, "a decimal string"),        # Google writes int64 as a string
    ({"networkEndpoints": [{"port": "8470"}]}, "a JSON number"),  # and int32 as a number
    ({"networkEndpoints": {"ipAddress": "x"}}, "networkEndpoints"),
    ({"description": None}, "null"),
    ([], "expected an object"),
])
def test_answer_violations(tpu: Discovery, body: Any, needle: str) -> None:
    with pytest.raises(ResponseViolation, match=r"tpu\.v2") as caught:
        tpu.check_response(Call("tpu.projects.locations.nodes.get", {}), body)
    assert needle in str(caught.value)


def test_method_without_response_schema_answers_nothing(storage: Discovery) -> None:
    call = Call("storage.objects.delete", {})
    storage.check_response(call, None)
    with pytest.raises(ResponseViolation):
        storage.check_response(call, {"name": "x"})


# ------------------------------------------------------------------ guarded
def _client(doc: Discovery, answer: Response | None = None) -> tuple[Client, list[Request]]:
    seen: list[Request] = []

    def handler(request: Request) -> Response:
        seen.append(request)
        if answer is not None:
            return answer
        return Response(json.dumps({"name": "projects/p/locations/z/nodes/n1"}), 200,
                        mimetype="application/json")

    return Client(Request.application(guarded(doc, handler))), seen


def test_guarded_passes_a_valid_request_to_the_handler(tpu: Discovery) -> None:
    client, seen = _client(tpu)
    answer = client.get(NODE)
    assert answer.status_code == 200 and len(seen) == 1


def test_guarded_refuses_with_google_error_json(tpu: Discovery) -> None:
    client, seen = _client(tpu)
    answer = client.post(NODES + "?nodeId=n1", json={"acceleratorType": "v5", "bogus": 1})
    assert answer.status_code == 400 and not seen
    error = answer.get_json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and error["code"] == 400
    assert error["details"][0]["fieldViolations"][0]["description"] == error["message"]
    page = client.get("/v2/nowhere")
    assert page.status_code == 404 and page.mimetype == "text/html" and not seen


def test_guarded_storage_errors_take_the_json_apis_shape(storage: Discovery) -> None:
    """Storage's JSON API is not One Platform: {"code", "message", "errors": [...]}."""
    client, _ = _client(storage)
    error = client.get("/storage/v1/b/bkt?bogus=1").get_json()["error"]
    assert error["code"] == 400 and 'Unknown name "bogus"' in error["message"]
    assert error["errors"] == [{"domain": "global", "reason": "invalid",
                                "message": error["message"]}]


def test_guarded_keeps_percent_encoding_of_the_raw_path(storage: Discovery) -> None:
    answer = Response(json.dumps({"name": "a/b", "bucket": "bkt"}), 200,
                      mimetype="application/json")
    client, seen = _client(storage, answer)
    assert client.get("/storage/v1/b/bkt/o/a%2Fb").status_code == 200 and seen


def test_guarded_turns_a_violating_answer_into_a_loud_500(tpu: Discovery) -> None:
    before = len(tpu.violations)
    bad = Response(json.dumps({"name": "n", "state": "UP"}), 200, mimetype="application/json")
    client, _ = _client(tpu, bad)
    answer = client.get(NODE)
    assert answer.status_code == 500
    assert "refused by the discovery document" in answer.get_json()["error"]["message"]
    assert len(tpu.violations) == before + 1 and tpu.violations[-1] in all_violations()
    del tpu.violations[before:]  # provoked here on purpose: the suite's check stays clean


@pytest.mark.parametrize("answer", [
    Response("<html>502</html>", 200, mimetype="text/html"),    # not JSON
    Response("", 200, mimetype="application/json"),            # an empty body
    Response(json.dumps({"bogus": 1}), 404, mimetype="application/json"),  # not 2xx
    deliberate(Response("null", 200, mimetype="application/json")),       # asked for
    dropped(),
])
def test_guarded_passes_faults_through(tpu: Discovery, answer: Response) -> None:
    client, _ = _client(tpu, answer)
    before = len(tpu.violations)
    client.get(NODE)
    assert len(tpu.violations) == before


def test_guarded_does_not_check_a_download(storage: Discovery) -> None:
    media = Response(b'{"not": "an Object"}', 200, mimetype="application/json")
    client, _ = _client(storage, media)
    assert client.get("/storage/v1/b/bkt/o/x?alt=media").status_code == 200


def test_guarded_reads_the_metadata_part_of_a_multipart_upload(storage: Discovery) -> None:
    answer = Response(json.dumps({"name": "x", "bucket": "bkt"}), 200,
                      mimetype="application/json")
    client, seen = _client(storage, answer)

    def multipart(meta: dict[str, Any]) -> bytes:
        return (b"--B\r\nContent-Type: application/json\r\n\r\n" + json.dumps(meta).encode()
                + b"\r\n--B\r\nContent-Type: application/gzip\r\n\r\n\x1f\x8b\r\n--B--\r\n")

    ctype = "multipart/related; boundary=B"
    url = "/upload/storage/v1/b/bkt/o?uploadType=multipart"
    assert client.post(url, data=multipart({"name": "x"}), content_type=ctype).status_code == 200
    refused = client.post(url, data=multipart({"name": "x", "bogus": 1}), content_type=ctype)
    assert refused.status_code == 400 and len(seen) == 1


def test_system_parameters_by_their_dollar_names(tpu: Discovery) -> None:
    call = tpu.check_request("GET", NODE, {"$alt": ["json;enum-encoding=int"]}, None)
    assert call.alt == "json"
    assert refusal(tpu, "GET", NODE, {"$alt": ["xml"]}).code == 400
    assert refusal(tpu, "GET", NODE, {"$bogus": ["1"]}).code == 400


def test_the_body_may_repeat_its_own_path_parameter(tpu: Discovery) -> None:
    """google-cloud-tpu's update_node puts node.name (bound to the URL) in the body too."""
    name = "projects/p/locations/us-central1-a/nodes/n1"
    tpu.check_request("PATCH", NODE, {"updateMask": ["metadata"]},
                      {"name": name, "metadata": {"k": "v"}})
    other = refusal(tpu, "PATCH", NODE, {"updateMask": ["metadata"]}, {"name": name + "x"})
    assert "output only" in other.message


def test_the_suites_check_sees_every_violation_since_its_mark(tpu: Discovery) -> None:
    """tests/conftest.py fails a test with violations_since(mark) non-empty: a violation in
    any document loaded before or during the test is seen, one cleared is not."""
    from tests.fakes.discovery import violation_mark, violations_since

    mark = violation_mark()
    toy = Discovery({"name": "late", "version": "v1", "parameters": {}, "schemas": {},
                     "resources": {}})  # loaded after the mark
    tpu.violations.append("tpu answer")
    toy.violations.append("late answer")
    try:
        assert violations_since(mark) == ["tpu answer", "late answer"]
    finally:
        tpu.violations.pop()
        toy.violations.pop()
    assert violations_since(mark) == []
