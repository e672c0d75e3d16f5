"""`tpuserve tune flex` on the simulated server: a flex node of the boot tests' fakes booting the
real script with the simulator as its vLLM, its TPU-API metadata and guest attributes linked
(tests/sim/link.py), and the CLI run as a process of its own, as a user runs it: TPUSERVE_CONFIG
naming a config with a [tune] table, the fake TPU API through the gcloud variables, the API key
in the environment. Only the test reads the seed (the expected optimum); the CLI never does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.render.boot.support import NAMESPACE, Cloud, Node, open_cloud, wait_for
from tests.sim import response_model as rm
from tests.sim import tune_cli
from tests.sim.link import NodeLink
from tests.sim.support import candidate, config_of, write_seed
from tpuserve.paths import REPO_ROOT
from tpuserve.render.boot_script import render_startup
from tpuserve.settings import Deployment, load
from tpuserve.settings.loader import load_raw
from tpuserve.tune.candidates import space
from tpuserve.tune.tpu_node import overlaid

# Wall seconds per node second. The tuner reads a boot back in node seconds (wall / scale), so
# the fakes' own ~4 s per boot on this machine reads as 4 / SCALE node seconds: at 0.002 a
# boot read ~3,000 s and ten of them passed $5; at 0.005 one reads ~1,700 s (857 simulated)
# and a candidate's boot takes ~9 s wall. The readiness budget is 12 s wall.
SCALE = 0.005
# Served 10x faster than real time: the KV wall's 3 s TTFTs take 0.3 s (ratios are kept).
SERVE_SCALE = 0.1
# The restricted search (4 candidates, 3 boots by the plan, more where one fails): memory
# utilization moves the KV wall this workload sits past (0.93 and 0.94 live or die by the
# seed), 8192 batched tokens' effect is seeded; the rest fixed.
GRID = [(b, u) for b in (4096, 8192) for u in (0.93, 0.94)]
TUNE = """
[tune]
max_num_batched_tokens = [4096, 8192]
gpu_memory_utilization = [0.93, 0.94]
max_num_seqs = ["unset"]
max_model_len = [32768]
VLLM_TPU_BUCKET_PADDING_GAP = [0]
NUM_PRECOMPILE_WORKERS = [1]
"""
# Past SPEC 6's KV wall (48 x 8,208 tokens against 321,344 at 0.92): where the flags matter.
CONTEXT, CLIENTS, OUTPUT = 8192, 48, 16
WORKLOAD_ARGS = ("--contexts", str(CONTEXT), "--clients", str(CLIENTS),
                 "--output-tokens", str(OUTPUT), "--repetitions", "1")


@dataclass
class SimFlex:
    cloud: Cloud
    node: Node
    link: NodeLink
    d: Deployment
    config: Path
    seed: int
    base: Path
    # None: vLLM's backend on the product's fixed port; a port: this node's own, which the
    # CLI (through tests/sim/tune_cli.py) or an in-process driver (bench/tune_sim_overhead)
    # renders too, so two simulated nodes on one machine never share one.
    backend_port: int | None = None

    def render(self, d: Deployment) -> str:
        return _render(d, self.backend_port)

    @property
    def state_path(self) -> Path:
        return self.base / "tune-state.json"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TPUSERVE_", "CLOUDSDK_", "OPENAI_"))}
        return {**env, "PYTHONPATH": str(REPO_ROOT), "TPUSERVE_CONFIG": str(self.config),
                **self.cloud.tpu.environ(), "OPENAI_API_KEY": self.cloud.api_key,
                "TPUSERVE_TIME_SCALE": str(SCALE),
                **({} if self.backend_port is None else
                   {tune_cli.PORT_ENV: str(self.backend_port)})}

    def argv(self, *extra: str) -> list[str]:
        # The product's CLI; with the node's own backend port through tests/sim/tune_cli.py.
        cli = "tpuserve" if self.backend_port is None else "tests.sim.tune_cli"
        return [sys.executable, "-m", cli, "tune", "flex", "--yes", *WORKLOAD_ARGS,
                "--out", str(self.base / "out"), "--write", str(self.base / "overlay.toml"),
                "--state", str(self.state_path), "--json", *extra]

    def tune(self, *extra: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*extra), env=self.env(), capture_output=True,
                              text=True, timeout=timeout, check=False, cwd=self.base)

    def start(self, *extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*extra), env=self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=self.base)

    # -- what the tuner's configs are, as the CLI renders them
    def raw(self) -> dict[str, Any]:
        return load_raw(environ={"TPUSERVE_CONFIG": str(self.config)})

    def scripts(self) -> dict[str, str]:
        """Candidate id -> the boot script its overlay renders; "terraform" -> the stack's."""
        raw = self.raw()
        out = {c.id: self.render(overlaid(raw, "flex", c.overlay()))
               for c in space(self.d, raw).candidates}
        return {**out, "terraform": self.render(self.d)}

    def node_script(self) -> str:
        return self.cloud.tpu.nodes[self.link.name].spec["metadata"]["startup-script"]

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())


def _render(d: Deployment, backend_port: int | None) -> str:
    return render_startup(d) if backend_port is None else \
        render_startup(d, backend_port=backend_port)


def expected(d: Deployment, seed: int, max_ttft_ms: float | None = None,
             ) -> tuple[tuple[int, float] | None, dict[tuple[int, float], rm.Cell | None]]:
    """The simulator's optimum over TUNE's grid for the workload: (batched tokens, memory
    utilization) of the highest tok/s (lowest $/M: one cell) among those that boot (and meet
    MAX_TTFT_MS, in served milliseconds), and every candidate's cell (None: dies at boot)."""
    p = rm.Params.draw(seed)
    cells: dict[tuple[int, float], rm.Cell | None] = {}
    for b, u in GRID:
        cfg = config_of(candidate(d, max_num_batched_tokens=b, gpu_memory_utilization=u,
                                  allow_untested_gpu_memory_utilization=True))
        boot = rm.boot(cfg, p, warm=False)
        ok = boot.error is None and (boot.ready_s or 0) < 2400
        cells[(b, u)] = rm.cell(cfg, p, CONTEXT, CLIENTS, OUTPUT) if ok else None
    fine = {k: c for k, c in cells.items() if c is not None and (
        max_ttft_ms is None or c.ttft_ms * SERVE_SCALE <= max_ttft_ms)}
    best = max(fine, key=lambda k: fine[k].tok_s) if fine else None
    return best, cells


@contextmanager
def sim_flex(base: Path, seed: int, tune: str = TUNE, *, own_backend_port: bool = True,
             ) -> Iterator[SimFlex]:
    """A deployed, booted flex node running the simulator of SEED, its watcher watching; TUNE
    is the config's [tune] table. OWN_BACKEND_PORT: see SimFlex.backend_port (the fixed port
    is shared by every simulated node on the machine: a second one running at the same time
    answers the first one's proxy, or takes its port)."""
    with open_cloud(base) as cloud:
        config = base / "user.toml"
        config.write_text(f"[vllm]\nport = {cloud.public_port}\n{tune}")
        d = load(environ={"TPUSERVE_CONFIG": str(config)}).deployments["flex"]
        cloud.tpu.seed_queued_resource(d.gcp.project, d.gcp.zone, d.node_name)
        write_seed(base / "seed.json", seed, boot_scale=SCALE, serve_scale=SERVE_SCALE)
        port = cloud.backend_port if own_backend_port else None
        with _booted(cloud, d, base, port) as (node, link):
            yield SimFlex(cloud, node, link, d, config, seed, base, port)


@contextmanager
def _booted(cloud: Cloud, d: Deployment, base: Path, backend_port: int | None,
            ) -> Iterator[tuple[Node, NodeLink]]:
    """A new VM of the stack's node (an empty disk) booting Terraform's script, linked."""
    node = cloud.node(d, FAKE_VLLM_SIM=str(base / "seed.json"), TPUSERVE_TIME_SCALE=str(SCALE))
    # The script Terraform deployed is what the CLI renders from the same config.
    node.script.write_text(_render(d, backend_port))
    with NodeLink(cloud, node) as link:
        node.run(timeout=120)
        wait_for(lambda: "watching" in cloud.metadata.namespace(NAMESPACE).get(
            "reconverge", ""), "the watcher's first word", timeout=60)
        yield node, link


def end_flex_run(s: SimFlex) -> None:
    """The flex run's end: the queued resource suspended (the TPU API removes its node: the
    node's nodes.get answers NOT_FOUND), then the VM's processes die."""
    s.link.__exit__(None, None, None)  # nothing left to copy
    s.cloud.tpu.set_state(s.d.node_name, "SUSPENDED")
    s.node.stop()


@contextmanager
def next_flex_node(s: SimFlex) -> Iterator[SimFlex]:
    """The queued resource re-provisioned (Terraform re-creates it): a new node, its disk
    empty, boots Terraform's script from scratch; the cache bucket kept what was published."""
    s.cloud.tpu.remove_queued_resource(s.d.node_name)
    s.cloud.tpu.seed_queued_resource(s.d.gcp.project, s.d.gcp.zone, s.d.node_name)
    with _booted(s.cloud, s.d, s.base, s.backend_port) as (node, link):
        yield SimFlex(s.cloud, node, link, s.d, s.config, s.seed, s.base, s.backend_port)
