"""The plan-review workflow's trust boundaries, read from the workflow file.

actionlint and zizmor lint it in `./dev scan`; these assert what they cannot know: which job
runs whose code, and that the one job holding a credential runs only the base branch's.
"""

from __future__ import annotations

import re

import pytest

from tpuserve.paths import REPO_ROOT

FLOW = (REPO_ROOT / ".github" / "workflows" / "plan-review.yml").read_text()
BASE_REF = "ref: ${{ github.event.pull_request.base.sha }}"


def jobs() -> dict[str, str]:
    body = FLOW.split("\njobs:\n", 1)[1]
    parts = re.split(r"^  ([\w-]+):\n", body, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def checkouts(job: str) -> list[str]:
    """The `with:` text of each actions/checkout step."""
    steps = re.split(r"^      - ", job, flags=re.MULTILINE)
    return [s for s in steps if s.startswith("uses: actions/checkout@")]


def test_only_the_plan_job_holds_a_credential() -> None:
    holders = [name for name, job in jobs().items() if "id-token: write" in job]
    assert holders == ["plan"]
    assert "GCP_PLAN_SERVICE_ACCOUNT" not in "".join(
        job for name, job in jobs().items() if name != "plan")


def test_the_credentialed_job_checks_out_only_the_base() -> None:
    plan = jobs()["plan"]
    [checkout] = checkouts(plan)
    assert BASE_REF in checkout
    assert "github.event.pull_request.head.repo.full_name == github.repository" in plan
    # The PR's JSON passes the base's gate before the token exists, and only gated stacks
    # are planned.
    gate = plan.index("python -m tpuserve.plan_gate base-synth pr-synth gated plan-diff")
    assert gate < plan.index("google-github-actions/auth@")
    assert 'for dir in gated/stacks/*/; do' in plan
    with_token = plan.split("google-github-actions/auth@", 1)[1]
    for runs_code in ("main.py", "./dev", "npx", "cdktf"):  # nothing is synthesized any more
        assert runs_code not in with_token.replace("cdktf.out/stacks/NAME", ""), runs_code


@pytest.mark.parametrize("name", ["review", "comment"])
def test_jobs_that_write_the_review_run_no_pr_code(name: str) -> None:
    job = jobs()[name]
    for checkout in checkouts(job):
        assert BASE_REF in checkout or "path: pr " in checkout, checkout
    if name == "review":
        # The base's reviewer, the PR's tree as data, the PR's synthesis from its own job.
        assert '.venv/bin/tpuserve review "$BASE_SHA" HEAD --repo pr --head-synth pr-synth' \
            in job
        assert "pr/dev" not in job and "pr/main.py" not in job
    else:
        assert checkouts(job) == []


def test_the_pr_code_job_holds_nothing() -> None:
    synth = jobs()["synth"]
    assert re.search(r"permissions:\n      contents: read\n    env:", synth)
    assert "secrets." not in synth and "github.token" not in synth
