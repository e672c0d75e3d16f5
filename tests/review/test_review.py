"""`review BASE [HEAD]` on real commits of a fixture repository, plus its pure parts.

The fixture is a copy of this project in a new git repository: commit BASE, then commit HEAD
with a config change that (a) opens the API port (a firewall_api resource appears), (b) halves
max_model_len (flag, block size, capacity and compile-cache key change), (c) drops the
ondemand stack and (d) sets a tpu-inference variable, plus (e) a change to stacks/ code that
only HEAD's own code can produce. Synthesis is the cost (~4 s a tree): one review of the two
commits serves every assertion, and the working-tree review (working tree == HEAD) reuses
both syntheses by content digest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tpuserve.cli import review as review_cli
from tpuserve.paths import REPO_ROOT
from tpuserve.review.compare import argv_options, build_review, diff_documents
from tpuserve.review.config_facts import config_environ, config_facts
from tpuserve.review.markdown import MARKER, render_markdown
from tpuserve.review.model import Review, StackReview
from tpuserve.review.redact import REDACTED, redact
from tpuserve.review.revision_facts import ConfigFacts, RevisionFacts, Synthesis
from tpuserve.review.run import review
from tpuserve.review.synthesis import synth_env
from tpuserve.settings.flag_rules import FLAG_RULES, rule_for

COPIED = ("main.py", "cdktf.json", "stacks", "tpuserve", "templates", "config")
CANARY = "hf_canaryTOKENvalue01234567"  # token-shaped, too short to pass for a real one


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com",
         "-c", "commit.gpgsign=false", *args],
        cwd=repo, env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fixture-repo")
    for name in COPIED:
        src = REPO_ROOT / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / name)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    base = git(root, "rev-parse", "HEAD")
    cfg = root / "config" / "default.toml"
    # default.toml states no model default: (a), (b) and (d) set values it leaves to the models.
    edit(cfg, "[vllm]\n", "[vllm]\nmax_model_len = 16384\n")  # (b)
    text = cfg.read_text()  # (c) drop [stacks.ondemand]
    start = text.index("[stacks.ondemand]")
    cfg.write_text(text[:start] + text[text.index("[stacks.flex]"):]
                   + '\n[access]\napi_source_ranges = ["203.0.113.0/24"]\n'  # (a)
                   + "\n[vllm.env]\nNUM_PRECOMPILE_WORKERS = 4\n")  # (d)
    edit(root / "stacks" / "firewall.py", 'description="SSH from Google',  # (e)
         'description="Plain SSH from Google')
    git(root, "commit", "-q", "-am", "head")
    return {"root": root, "base": base, "head": git(root, "rev-parse", "HEAD")}


@pytest.fixture(scope="module")
def commits(repo: dict[str, Any]) -> tuple[Review, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", CANARY)  # in our environment; must reach neither child nor text
        mp.delenv("TPUSERVE_CONFIG", raising=False)
        r = review(repo["base"], repo["head"], project_dir=repo["root"])
    return r, render_markdown(r)


@pytest.fixture(scope="module")
def working_tree(repo: dict[str, Any], commits: Any) -> tuple[Review, str]:
    """BASE against the working tree, which holds HEAD: both syntheses come from the memo."""
    r = review(repo["base"], None, project_dir=repo["root"])
    return r, render_markdown(r)


# --------------------------------------------------------------------------- two commits


def test_summary_names_every_stack(commits: tuple[Review, str]) -> None:
    r, md = commits
    assert md.startswith(MARKER)
    assert {s.name: s.status for s in r.stacks} == {
        # The base changes too: its dashboard and budget cover the stacks configured.
        "base": "changed", "spot": "changed", "flex": "changed", "ondemand": "removed",
        "fleet": "changed"}


def test_added_resource_by_address(commits: tuple[Review, str]) -> None:
    r, md = commits
    for stack in ("spot", "flex"):
        added = [c.address for c in r.stack(stack).resources if c.action == "added"]
        assert added == ["google_compute_firewall.firewall_api"]
    assert "➕ `google_compute_firewall.firewall_api` (added)" in md  # noqa: RUF001
    assert "**Terraform**: 1 to add, 2 to change, 0 to destroy" in md


def test_the_boot_script_is_summarized_not_dumped(commits: tuple[Review, str]) -> None:
    r, md = commits
    [node] = [c for c in r.stack("spot").resources if c.address == "google_tpu_v2_vm.tpu_node"]
    assert node.action == "changed" and not node.replaces
    assert [a.path for a in node.attributes] == ["metadata.startup-script"]
    assert "`metadata.startup-script`: the boot script changed" in md
    assert "set -euo pipefail" not in md


def test_changed_flag_with_its_measured_rule(commits: tuple[Review, str]) -> None:
    r, md = commits
    [flag] = r.stack("spot").argv
    assert (flag.name, flag.old, flag.new) == ("--max-model-len", "32768", "16384")
    assert flag.rule == rule_for("--max-model-len").rule
    assert ("| `--max-model-len` (`vllm.max_model_len`) | `32768` | `16384` | the backend keeps "
            "512 blocks per request") in md


def test_capacity_delta_from_the_planner(commits: tuple[Review, str]) -> None:
    r, md = commits
    deltas = {d.key: d for d in r.stack("spot").capacity}
    assert (deltas["block_size"].old, deltas["block_size"].new) == (64, 32)  # SPEC 4
    assert deltas["num_blocks"].new == 2 * deltas["num_blocks"].old
    assert "kv_tokens" not in deltas  # SPEC 4: halving max-model-len costs no KV capacity
    assert "| block size | 64 | 32 | -32 (-50.0%) |" in md


def test_compile_cache_key_line(commits: tuple[Review, str]) -> None:
    r, md = commits
    old, new = r.stack("spot").cache_key or ("", "")
    assert old != new
    # spot, flex and fleet (the same settings, the same key change)
    assert md.count("~857 s instead of ~497 s on the next boot, SPEC 4") == 3
    assert "**cold compile**: the compile-cache key changes" in md


def test_what_each_change_does_to_the_running_server(commits: tuple[Review, str]) -> None:
    """(b) changes the compile-cache key: the VM node restarts in place, cold; so does the flex
    node (its metadata is patched; the queued resource and its capacity stay: only its stored
    input changes); (c) removes the ondemand server."""
    r, md = commits
    effects = {(s.name, c.address): c.effect for s in r.stacks for c in s.resources}
    node = effects["spot", "google_tpu_v2_vm.tpu_node"]
    assert node is not None and (node.kind, node.compile) == ("restart_in_place", "cold")
    qr = effects["flex", "terraform_data.queued_resource"]
    assert qr is not None and qr.kind == "none"
    meta = effects["flex", "terraform_data.node_metadata"]
    assert meta is not None and (meta.kind, meta.compile) == ("restart_in_place", "cold")
    gone = effects["ondemand", "google_tpu_v2_vm.tpu_node"]
    assert gone is not None and gone.kind == "server_removed"
    firewall = effects["spot", "google_compute_firewall.firewall_api"]
    assert firewall is not None and firewall.kind == "none"
    assert all(e is not None for e in effects.values())
    assert {s.name: s.server_effect.kind for s in r.stacks if s.server_effect} == {
        "spot": "restart_in_place", "flex": "restart_in_place",
        "ondemand": "server_removed", "base": "none", "fleet": "rolling_restart"}
    rollout = next(o for o in r.stack("fleet").kubernetes_objects
                   if (o.kind, o.name) == ("Deployment", "vllm"))
    assert rollout.effect is not None
    assert (rollout.effect.kind, rollout.effect.compile) == ("rolling_restart", "cold")
    assert ("| `spot` | changed | +1 ~2 -0 | 1 flag(s), 1 var(s) | cold next boot | changed | "
            "restarts in place, cold compile |") in md
    assert "queued resource replaced" not in md
    assert ("  - running server: **restarts in place, cold compile**: the running node's "
            "metadata is patched in place") in md
    assert "  - running server: **server removed**: the TPU node is deleted" in md


def test_removed_stack(commits: tuple[Review, str]) -> None:
    r, md = commits
    gone = r.stack("ondemand")
    # Its compute only: the node, its firewall rule and the billing guard's arming (the
    # network, identities, secrets and buckets are the base's, which stays).
    assert gone.counts() == {"added": 0, "changed": 0, "removed": 3}
    assert "google_tpu_v2_vm.tpu_node" in {c.address for c in gone.resources}
    assert "### `ondemand`: stack removed" in md and "cdktf destroy ondemand" in md


def test_no_secret_reaches_the_review(commits: tuple[Review, str], tmp_path: Path) -> None:
    _, md = commits
    assert CANARY not in md
    env = synth_env(tmp_path, tmp_path / "out", None,
                    {"PATH": "/bin", "HF_TOKEN": CANARY, "TPUSERVE_CONFIG": "/x.toml",
                     "GOOGLE_APPLICATION_CREDENTIALS": "/key.json", "TPUSERVE_PROJECT": "p"})
    assert CANARY not in env.values() and "GOOGLE_APPLICATION_CREDENTIALS" not in env
    assert "TPUSERVE_CONFIG" not in env and env["TPUSERVE_PROJECT"] == "p"
    assert env["PYTHONPATH"] == str(tmp_path) and env["CDKTF_OUTDIR"] == str(tmp_path / "out")
    # The config side sees the user's --config only, never an ambient TPUSERVE_CONFIG.
    ambient = {"TPUSERVE_CONFIG": "/ambient.toml", "TPUSERVE_ZONE": "us-west4-a"}
    assert config_environ(None, ambient) == {"TPUSERVE_ZONE": "us-west4-a"}
    mine = tmp_path / "mine.toml"
    assert config_environ(mine, ambient)["TPUSERVE_CONFIG"] == str(mine)


def test_cli_writes_json_and_markdown(repo: dict[str, Any], commits: Any, tmp_path: Path) -> None:
    """Both trees were synthesized by the fixture: the CLI reuses them (same digests)."""
    app = typer.Typer()
    review_cli.register(app)
    app.command("noop", hidden=True)(lambda: None)
    runner = CliRunner()
    args = ["review", repo["base"][:10], repo["head"], "--repo", str(repo["root"])]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    stacks = {s["name"]: s for s in doc["stacks"]}
    assert stacks["ondemand"]["status"] == "removed"
    assert stacks["spot"]["compile_cache_key"]["cold_start_s"] == 857
    [node] = [c for c in stacks["spot"]["resources"] if c["address"] == "google_tpu_v2_vm.tpu_node"]
    assert node["server_effect"]["kind"] == "restart_in_place"
    assert node["server_effect"]["compile"] == "cold"
    assert stacks["ondemand"]["server_effect"]["kind"] == "server_removed"
    out = tmp_path / "review.md"
    diff = tmp_path / "spot.diff"
    diff.write_text(f"Plan: 1 to add\nHF_TOKEN={CANARY}\n")
    result = runner.invoke(app, [*args, "-o", str(out), "--attach", f"cdktf diff spot={diff}"])
    assert result.exit_code == 0, result.stderr
    md = out.read_text()
    assert "<details><summary>cdktf diff spot</summary>" in md and "Plan: 1 to add" in md
    assert CANARY not in md and f"HF_TOKEN={REDACTED}" in md
    # Nothing is left behind in the repository.
    assert git(repo["root"], "worktree", "list").count("\n") == 0


def test_cli_rejects_an_unknown_revision(repo: dict[str, Any]) -> None:
    app = typer.Typer()
    review_cli.register(app)
    app.command("noop", hidden=True)(lambda: None)
    result = CliRunner().invoke(app, ["review", "no-such-ref", "--repo", str(repo["root"])])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert "'no-such-ref' is not a commit" in line


# --------------------------------------------------------------------------- working tree


def test_each_commit_is_synthesized_with_its_own_code(commits: tuple[Review, str]) -> None:
    r, md = commits
    [ssh] = [c for c in r.stack("spot").resources if c.address.endswith("firewall_ssh")]
    [attr] = ssh.attributes
    assert (attr.path, attr.old[:3], attr.new[:9]) == ("description", "SSH", "Plain SSH")
    assert '`description`: `"SSH from Google' in md


def test_changed_env_var_with_its_measured_rule(commits: tuple[Review, str]) -> None:
    r, md = commits
    [var] = r.stack("flex").env
    assert (var.name, var.old, var.new) == ("NUM_PRECOMPILE_WORKERS", None, "4")
    assert "| `NUM_PRECOMPILE_WORKERS` (`vllm.env.NUM_PRECOMPILE_WORKERS`) | (absent) | `4` |" in md
    assert "compilation is 685 of the 857 s" in md


def test_review_against_the_working_tree(
    working_tree: tuple[Review, str], commits: tuple[Review, str]
) -> None:
    wt, wt_md = working_tree
    r, md = commits
    assert wt.head == "working tree"
    assert wt.stacks == r.stacks
    assert "→ `working tree`" in wt_md
    assert wt_md.split("\n", 5)[5] == md.split("\n", 5)[5]  # identical below the title


# --------------------------------------------------------------------------- pure parts


def test_an_old_config_that_fails_todays_rules_is_reported(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "default.toml").write_text(
        (REPO_ROOT / "config" / "default.toml").read_text().replace(
            "[vllm]\n", "[vllm]\ngpu_memory_utilization = 0.95\n"))
    old = config_facts(tmp_path)
    assert old.stacks == {} and "gpu_memory_utilization = 0.95" in old.problems[0]
    new = config_facts(REPO_ROOT)
    empty = Synthesis({})
    r = build_review(RevisionFacts("old", None, empty, old),
                     RevisionFacts("new", None, empty, new))
    md = render_markdown(r)
    assert "**The base config fails today's validation**" in md
    assert "gpu_memory_utilization = 0.95" in md
    assert {s.status for s in r.stacks} == {"added"}  # no synth either side: config decides


def test_an_env_change_leaves_capacity_unchanged_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "default.toml").write_text(
        (REPO_ROOT / "config" / "default.toml").read_text()
        + "\n[vllm.env]\nNUM_PRECOMPILE_WORKERS = 8\n")
    docs = Synthesis({name: {"resource": {}} for name in ("spot", "ondemand", "flex", "fleet")})
    same = RevisionFacts("a", None, docs, config_facts(REPO_ROOT))
    r = build_review(same, RevisionFacts("b", None, docs, config_facts(tmp_path)))
    spot = r.stack("spot")
    assert spot.capacity == () and spot.cache_key is not None
    md = render_markdown(r)
    assert "**Capacity and cost unchanged**: 321,536 KV tokens (5,024 blocks of 64)" in md
    assert {s.status for s in build_review(same, same).stacks} == {"unchanged"}


def test_a_synth_failure_is_reported_not_raised() -> None:
    facts = ConfigFacts({"spot": config_facts(REPO_ROOT).stacks["spot"]})
    r = build_review(RevisionFacts("a", None, Synthesis({}, "Traceback: boom"), facts),
                     RevisionFacts("b", None, Synthesis({"spot": {}}), facts))
    md = render_markdown(r)
    assert "**Synth of base failed** (its own code):" in md and "boom" in md
    spot = r.stack("spot")  # the config says the stack exists on both sides
    assert (spot.status, spot.resources_known) == ("changed", False)
    assert "**Terraform**: not compared" in md


def test_diff_documents_addresses_and_attribute_paths() -> None:
    old = {"resource": {"google_compute_firewall": {"ssh": {
        "//": {"metadata": {"path": "x"}}, "source_ranges": ["a"],
        "allow": [{"protocol": "tcp", "ports": ["22"]}]}}},
        "data": {"google_project": {"p": {}}}, "output": {"ip": {"value": "1"}}}
    new = {"resource": {"google_compute_firewall": {"ssh": {
        "//": {"metadata": {"path": "y"}}, "source_ranges": ["a", "b"],
        "allow": [{"protocol": "tcp", "ports": ["2222"]}]}},
        "terraform_data": {"qr": {"triggers_replace": {"sha": "1"}}}},
        "output": {"ip": {"value": "1"}, "url": {"value": "u"}}}
    changes = {c.address: c for c in diff_documents(old, new)}
    assert set(changes) == {"google_compute_firewall.ssh", "terraform_data.qr",
                            "data.google_project.p", "output.url"}
    assert [(a.path, a.old, a.new) for a in changes["google_compute_firewall.ssh"].attributes] == [
        ("allow[0].ports", ["22"], ["2222"]), ("source_ranges", ["a"], ["a", "b"])]
    assert changes["data.google_project.p"].kind == "data"
    assert changes["output.url"].kind == "output"
    md = render_markdown(Review("a", "b", (StackReview("s", "changed", tuple(changes.values())),)))
    assert '`source_ranges`: `["a"]` → `["a", "b"]`' in md
    assert "1 to add, 1 to change, 0 to destroy" in md  # outputs and data are not counted


def test_argv_options() -> None:
    argv = ["vllm", "serve", "google/gemma-4-E2B-it", "--max-model-len", "32768",
            "--enable-prefix-caching", "--limit-mm-per-prompt", '{"image":4}', "--port=8001"]
    assert argv_options(argv) == {
        "model": "google/gemma-4-E2B-it", "--max-model-len": "32768",
        "--enable-prefix-caching": "on", "--limit-mm-per-prompt": '{"image":4}',
        "--port": "8001"}


def test_every_flag_and_variable_has_a_measured_rule(deployments: dict[str, Any]) -> None:
    from tpuserve.render.boot_script import vllm_command
    from tpuserve.render.vllm_args import container_env
    from tpuserve.settings.vllm import TpuInferenceEnv

    d = deployments["spot"]
    everything = d.vllm.model_copy(update={"max_num_seqs": 128, "kv_cache_memory_bytes": 1})
    names = set(argv_options(vllm_command(d.model_copy(update={"vllm": everything}))))
    names |= set(argv_options(vllm_command(d)))  # --gpu-memory-utilization
    names |= set(container_env(d.vllm)) | set(TpuInferenceEnv.model_fields)
    assert names - set(FLAG_RULES) == set()
    assert all(len(r.rule) <= 200 and ("SPEC" in r.rule or "README" in r.rule)
               for r in FLAG_RULES.values())


def test_redact_masks_tokens_but_not_names() -> None:
    pem = "PRIVATE" + " KEY-----"  # built here so no key-shaped text is tracked in git
    text = (f"HF_TOKEN={CANARY} key=sk-abcdefghijklmnopqrstu ya29.a0AfH6SMBxyzxyzxyz "
            '"password": "hunter2hunter2" HF_TOKEN_PATH=/run/secrets/hf_token '
            "google_secret_manager_secret.hf_token_secret "
            f"-----BEGIN {pem}\nMIIE\n-----END {pem}")
    out = redact(text)
    for secret in (CANARY, "sk-abcdef", "ya29.", "hunter2", "MIIE"):
        assert secret not in out
    assert "HF_TOKEN_PATH=/run/secrets/hf_token" in out
    assert "google_secret_manager_secret.hf_token_secret" in out


def test_workflows_pin_actions_and_grant_least_privilege() -> None:
    """actionlint and zizmor run in `./dev scan`; this guards the same rules in the suite."""
    flows = {p.name: p.read_text() for p in (REPO_ROOT / ".github" / "workflows").glob("*.yml")}
    assert {"ci.yml", "plan-review.yml"} <= set(flows)
    for name, body in flows.items():
        for ref, comment in re.findall(r"uses: (\S+)(.*)", body):
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), (name, ref)
            assert re.match(r" # v\d", comment), (name, ref)
        assert body.count("persist-credentials: false") == body.count("actions/checkout@")
        assert "\npermissions: {}\n" in body, name
        on = re.search(r"^on:\n((?:[ #].*\n|\n)+)", body, re.MULTILINE)
        assert on and "pull_request_target" not in on.group(1), name
    review_flow = flows["plan-review.yml"]
    assert review_flow.count("id-token: write") == 1
    assert review_flow.count("pull-requests: write") == 1
    assert MARKER in review_flow and "tpuserve review" in review_flow
    assert "./dev test" in flows["ci.yml"] and "./dev scan" in flows["ci.yml"]


def test_attachments_are_cut_to_fit_one_comment() -> None:
    big = [("cdktf diff spot", "x" * 50_000), ("cdktf diff flex", "y" * 50_000)]
    md = render_markdown(Review("a", "b", (), attachments=tuple(big)), limit=20_000)
    assert len(md) <= 20_000
    assert md.count("(cut to fit a GitHub comment)") == 2  # both shown, each cut
