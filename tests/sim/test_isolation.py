"""The simulator's seed and parameters stay test-side: no product code, template or rendered
file can read them (the tuner must find an optimum by measuring, not by looking it up)."""

from __future__ import annotations

import re

from tpuserve.paths import REPO_ROOT

# What reading the simulator would take: its seed's variable, or an import of test code.
READS_THE_SIMULATOR = re.compile(r"FAKE_VLLM_SIM|^\s*(?:from|import)\s+tests\b", re.M)


def test_no_product_file_reads_the_simulator() -> None:
    files = [p for top in ("tpuserve", "templates") for p in (REPO_ROOT / top).rglob("*")
             if p.is_file() and p.suffix in (".py", ".j2", ".sh", "")]
    assert len(files) > 50  # the tree is there
    offenders = [str(p.relative_to(REPO_ROOT)) for p in files
                 if READS_THE_SIMULATOR.search(p.read_text(errors="replace"))]
    assert offenders == []


def test_the_pattern_catches_a_reader() -> None:
    assert READS_THE_SIMULATOR.search("import os\nfrom tests.sim import response_model\n")
    assert READS_THE_SIMULATOR.search('seed = os.environ["FAKE_VLLM_SIM"]')
    assert not READS_THE_SIMULATOR.search('"""verified against tests/sim"""')
