"""`tpuserve review` runs both revisions' main.py: neither may see the user's credentials.

A revision whose main.py hunts for credentials (dumps its environment, reads the ADC file
where google-auth looks for it, walks HOME, reads every file an environment variable names)
is reviewed with credentials planted everywhere a developer machine or a runner keeps them.
The same program run with the caller's environment finds every one of them (so the test can
fail); run by `review` it finds none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tests.review.test_review import git
from tpuserve.cli import review as review_cli
from tpuserve.review.run import review
from tpuserve.review.synthesis import synth_env

CANARY = "canaryCREDENTIAL7c1e"

HUNTER = '''
"""A hostile revision: collect every credential reachable from the environment."""
import json, os, pathlib, sys
from google.auth import _cloud_sdk

found = {"env": dict(os.environ), "files": {}, "home": []}
def grab(path):
    p = pathlib.Path(path)
    if p.is_file() and p.stat().st_size < 1 << 20:  # not the node binary
        found["files"][str(p)] = p.read_text(errors="replace")
grab(_cloud_sdk.get_application_default_credentials_path())  # where ADC is looked up
grab(os.path.expanduser("~/.config/gcloud/application_default_credentials.json"))
grab(os.path.expanduser("~/.config/gcloud/credentials.db"))
for value in os.environ.values():  # any variable that names a file
    for part in value.split(os.pathsep):
        if part.startswith("/"):
            grab(part)
for root, _, files in os.walk(os.path.expanduser("~")):
    for name in files:
        found["home"].append(os.path.join(root, name))
        grab(os.path.join(root, name))
pathlib.Path(REPORT).write_text(json.dumps(found))
sys.exit(1)  # no stacks: the review reports a failed synth, which is fine here
'''


@pytest.fixture
def planted(tmp_path: Path) -> dict[str, str]:
    """An environment with credentials everywhere: HOME, ADC, gcloud, tokens, agent socket."""
    home = tmp_path / "home"
    gcloud = home / ".config" / "gcloud"
    gcloud.mkdir(parents=True)
    adc = {"type": "authorized_user", "refresh_token": f"1//{CANARY}-adc"}
    (gcloud / "application_default_credentials.json").write_text(json.dumps(adc))
    (gcloud / "credentials.db").write_text(f"{CANARY}-gcloud-db")
    (home / ".netrc").write_text(f"machine example.com password {CANARY}-netrc")
    key = tmp_path / "sa-key.json"
    key.write_text(json.dumps({"type": "service_account", "private_key": f"{CANARY}-key"}))
    sdk = tmp_path / "cloudsdk"
    sdk.mkdir()
    (sdk / "application_default_credentials.json").write_text(f"{CANARY}-cloudsdk")
    return {
        "HOME": str(home),
        "GOOGLE_APPLICATION_CREDENTIALS": str(key),
        "CLOUDSDK_CONFIG": str(sdk),
        "CLOUDSDK_AUTH_ACCESS_TOKEN": f"ya29.{CANARY}",
        "GITHUB_TOKEN": f"ghs_{CANARY}",
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN": f"{CANARY}-oidc",
        "AWS_SECRET_ACCESS_KEY": f"{CANARY}-aws",
        "HF_TOKEN": f"hf_{CANARY}",
        "SSH_AUTH_SOCK": str(tmp_path / f"{CANARY}-agent.sock"),
        "TPUSERVE_PROJECT": "review-project",
    }


def hunter_repo(root: Path, report: Path) -> tuple[str, str]:
    root.mkdir()
    (root / "main.py").write_text(f"REPORT = {str(report)!r}\n{HUNTER}")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    base = git(root, "rev-parse", "HEAD")
    (root / "main.py").write_text(f"REPORT = {str(report) + '.head'!r}\n{HUNTER}")
    git(root, "commit", "-q", "-am", "head")
    return base, git(root, "rev-parse", "HEAD")


def leaks(report: Path) -> list[str]:
    found: dict[str, Any] = json.loads(report.read_text())
    text = json.dumps(found)
    return [text[max(i - 60, 0): i + 40] for i in _all(text, CANARY)]


def _all(text: str, needle: str) -> list[int]:
    out, i = [], text.find(needle)
    while i >= 0:
        out.append(i)
        i = text.find(needle, i + 1)
    return out


def test_the_hunter_finds_everything_in_the_callers_environment(
    tmp_path: Path, planted: dict[str, str]
) -> None:
    """The control: without the sandbox the same program collects every planted secret."""
    report = tmp_path / "report.json"
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "main.py").write_text(f"REPORT = {str(report)!r}\n{HUNTER}")
    subprocess.run([sys.executable, "main.py"], cwd=tmp_path / "tree",
                   env={**os.environ, **planted}, check=False, capture_output=True)
    found = json.loads(report.read_text())
    text = json.dumps(found)
    for marker in ("-adc", "-gcloud-db", "-netrc", "-key", "-cloudsdk", "-oidc", "-aws",
                   "-agent.sock"):
        assert CANARY + marker in text, marker


def test_review_runs_both_revisions_without_credentials(
    tmp_path: Path, planted: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "report.json"
    base, head = hunter_repo(tmp_path / "repo", report)
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", f"{tmp_path / 'google-cloud-sdk' / 'bin'}:{os.environ['PATH']}")
    result = review(base, head, project_dir=tmp_path / "repo")
    assert result.base_synth_error and result.head_synth_error  # both ran (and exited 1)
    for path in (report, Path(str(report) + ".head")):
        assert leaks(path) == [], path
        found = json.loads(path.read_text())
        env = found["env"]
        assert env["HOME"] != planted["HOME"] and Path(env["HOME"]).name.endswith("-home")
        assert found["home"] == []  # a fresh, empty HOME
        assert env["TPUSERVE_PROJECT"] == "review-project"  # config variables do pass
        assert "google-cloud-sdk" not in env["PATH"]
        assert set(env) <= {
            "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TPUSERVE_PROJECT", "TPUSERVE_ZONE",
            "TPUSERVE_CDK_IMPORT", "JSII_RUNTIME", "JSII_RUNTIME_PACKAGE_CACHE",
            "JSII_RUNTIME_PACKAGE_CACHE_ROOT", "JSII_NODE", "PATH", "HOME", "TMPDIR",
            "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
            "PYTHONNOUSERSITE", "CDKTF_OUTDIR", "CHECKPOINT_DISABLE",
        }, sorted(env)
    # The throwaway HOME and the worktrees are gone afterwards.
    assert not Path(json.loads(report.read_text())["env"]["HOME"]).exists()


def test_synth_path_holds_only_the_programs_synth_runs(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "terraform").write_text("#!/bin/sh\n")
    (bindir / "terraform").chmod(0o755)
    env = synth_env(tmp_path, tmp_path / "out", None,
                    {"PATH": f"{bindir}:/opt/elsewhere", "HOME": "/home/u",
                     "JSII_NODE": "/opt/node/bin/node"})
    # /opt/elsewhere (say, a cloud SDK's bin) is dropped.
    assert env["PATH"].split(":") == ["/opt/node/bin", str(bindir), "/usr/bin", "/bin"]
    assert env["HOME"] == str(tmp_path / "out-home")
    assert env["JSII_RUNTIME_PACKAGE_CACHE_ROOT"] == "/home/u/.cache/aws/jsii/package-cache"


def test_head_synth_is_read_not_run(tmp_path: Path) -> None:
    """The PR workflow hands HEAD's synthesis in: HEAD's main.py does not run at all."""
    report = tmp_path / "report.json"
    base, head = hunter_repo(tmp_path / "repo", report)
    given = tmp_path / "pr-synth" / "stacks"
    (given / "spot").mkdir(parents=True)
    doc = {"resource": {"terraform_data": {"x": {"input": "from the synth job"}}}}
    (given / "spot" / "cdk.tf.json").write_text(json.dumps(doc))
    (given / "linked").symlink_to(given / "spot")  # links are not followed
    result = review(base, head, project_dir=tmp_path / "repo",
                    head_synthesis=tmp_path / "pr-synth")
    assert report.exists() and not Path(str(report) + ".head").exists()
    assert result.head_synth_error is None and result.base_synth_error
    assert [s.name for s in result.stacks] == ["spot"]
    [added] = result.stack("spot").resources
    assert (added.address, added.action) == ("terraform_data.x", "added")
    # The same through the command line.
    app = typer.Typer()
    review_cli.register(app)
    app.command("noop", hidden=True)(lambda: None)
    out = CliRunner().invoke(app, ["review", base, head, "--repo", str(tmp_path / "repo"),
                                   "--head-synth", str(tmp_path / "pr-synth"), "--json"])
    assert out.exit_code == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["head_synth_error"] is None
    assert [r["address"] for r in doc["stacks"][0]["resources"]] == ["terraform_data.x"]
