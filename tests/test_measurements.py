"""docs/measurements.md is the SPEC the code cites: every "SPEC n" (and "SPEC n.m", "SPEC n-m",
"SPEC n/m") in a tracked file names a section of it, and nothing tracked points outside the
repository for it: neither at the shared notes nor at tracker issues a clone cannot read."""

from __future__ import annotations

import re
import subprocess

import pytest

from tpuserve.paths import REPO_ROOT

MEASUREMENTS = REPO_ROOT / "docs" / "measurements.md"
# "SPEC n", "SPEC n.m", "SPEC n-m", "SPEC n/m", "SPEC section n" (n a number).
CITATION = re.compile(r"\bSPEC (?:sections? )?(\d+(?:\.\d+)?)(?:([-/])(\d+))?")
HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\. ", re.M)
ANCHOR = re.compile(r'<a id="(\d+(?:\.\d+)?)">')


def sections(text: str) -> set[str]:
    """The section numbers a document defines: '## n. Title', '### n.m. Title', or an anchor."""
    return set(HEADING.findall(text)) | set(ANCHOR.findall(text))


def cited(text: str) -> set[str]:
    """Every section number a text cites as SPEC, ranges expanded."""
    out: set[str] = set()
    for first, sep, last in CITATION.findall(text):
        if sep == "-":
            out |= {str(n) for n in range(int(first), int(last) + 1)}
        else:
            out |= {first, last} - {""}
    return out


def tracked_texts() -> dict[str, str]:
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    out = {}
    for name in filter(None, names):
        path = REPO_ROOT / name
        if not path.is_file() or path.stat().st_size > 1_000_000:
            continue
        try:
            out[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return out


def test_citation_parsing() -> None:
    spec = "SPEC"  # spelled apart, so this file cites nothing itself
    assert cited(f"{spec} 4: x; ({spec} 5-7) {spec} 4/5, {spec} section 6 and {spec} 2.1") == {
        "2.1", "4", "5", "6", "7"}
    assert sections("## 1. A\n### 4.2. B\n<a id=\"9\"></a>\n## x. no") == {"1", "4.2", "9"}


def test_every_spec_citation_resolves_to_a_section_of_docs_measurements() -> None:
    have = sections(MEASUREMENTS.read_text())
    missing = {f"{name}: SPEC {n}" for name, text in tracked_texts().items()
               for n in cited(text) if n not in have}
    assert not missing, sorted(missing)
    assert {"1", "2", "3", "4", "5", "6", "7"} <= have


def test_the_measurements_are_titled_as_the_spec() -> None:
    assert MEASUREMENTS.read_text().startswith("# SPEC: ")


def test_nothing_tracked_points_outside_the_repository() -> None:
    outside = re.compile(r"\.\./" + "shared|/" + "shared/")
    hits = sorted(name for name, text in tracked_texts().items() if outside.search(text))
    assert not hits, hits


# "issue n" (spelled apart, so this file cites nothing itself): the tracker a clone cannot read.
ISSUE = re.compile(r"\b[Ii]" + r"ssue \d+")
# Files allowed to cite the tracker (none); a listed file that is gone or cites nothing fails
# the test, so the list cannot go stale.
STILL_CITING: frozenset[str] = frozenset()


def test_nothing_tracked_cites_a_tracker_issue() -> None:
    texts = tracked_texts()
    hits = sorted(name for name, text in texts.items()
                  if ISSUE.search(text) and name not in STILL_CITING)
    assert not hits, hits
    stale = sorted(name for name in STILL_CITING if not ISSUE.search(texts.get(name, "")))
    assert not stale, f"no longer citing an issue: remove from STILL_CITING: {stale}"
