"""Config changes reach a running node in place: the watcher every boot leaves behind
long-polls the startup-script in metadata and runs a changed one (templates/boot/api.sh.j2
start_watcher, boot_helper.py watch)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from pathlib import Path

from tests.render.boot.support import NAMESPACE, Cloud, Node, wait_for
from tpuserve.render.boot_script import _env, render_startup, startup_context
from tpuserve.settings import Deployment

KEY = "startup-script"
VLLM = "vllm-gemma4"


def _with_vllm(d: Deployment, **values: object) -> Deployment:
    return d.model_copy(update={"vllm": d.vllm.model_copy(update=values)})


def _script(cloud: Cloud, d: Deployment) -> str:
    return render_startup(d, backend_port=cloud.backend_port)


def _config(cloud: Cloud, d: Deployment) -> str:
    return "argv_sha256=" + startup_context(d, backend_port=cloud.backend_port)["config_sha256"]


def _reconverge(cloud: Cloud, since: float = 0) -> list[str]:
    """The watcher's `reconverge` values written since SINCE, without their timestamps."""
    return [w.value.split(" ", 1)[1] for w in cloud.metadata.writes_in(NAMESPACE)
            if w.key == "reconverge" and w.at >= since]


def _booted(cloud: Cloud, node: Node) -> None:
    """Boot NODE from the script metadata holds, and wait for its watcher's first answer."""
    cloud.metadata.set_attribute(KEY, node.script.read_text())
    node.run()
    wait_for(lambda: _reconverge(cloud), "the watcher's first record")
    assert _reconverge(cloud) == [f"watching etag={cloud.metadata.etag(KEY)}"]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_changed_vllm_setting_replaces_the_server_in_place_once(cloud: Cloud) -> None:
    node = cloud.node()
    _booted(cloud, node)
    old = node.deployment
    assert node.attrs()["config"] == _config(cloud, old)
    assert "4096" in node.container(VLLM)["cmd"]
    watcher = node.watcher_pids()
    assert len(watcher) == 1

    new = _with_vllm(old, max_num_batched_tokens=8192)
    new_script = _script(cloud, new)
    changed_at = time.time()
    cloud.metadata.set_attribute(KEY, new_script)
    wait_for(lambda: any(v.startswith(("applied", "failed")) for v in _reconverge(cloud)),
             "the new script's boot", timeout=60)
    done_at = time.time()

    sha = _sha(new_script)
    assert _reconverge(cloud, changed_at) == [
        f"changed sha256={sha} etag={cloud.metadata.etag(KEY)}", f"applied sha256={sha}"]
    attrs = node.attrs()
    assert attrs["state"] == "ready" and attrs["container"] == "started"
    assert attrs["config"] == _config(cloud, new) != _config(cloud, old)
    # The new argv runs; the old container was removed first; the proxy was kept.
    cmd = node.container(VLLM)["cmd"]
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "8192"
    runs = node.docker_commands("run", changed_at)
    assert [argv[argv.index("--name") + 1] for argv in runs] == [VLLM]
    removed = node.docker_commands("rm", changed_at)
    assert removed == [["rm", "-f", VLLM]]
    rm_at = max(c["at"] for c in node.docker_calls() if c["argv"][:1] == ["rm"])
    run_at = max(c["at"] for c in node.docker_calls() if c["argv"][:1] == ["run"])
    assert changed_at < rm_at < run_at
    # The script ran is the one metadata holds, kept for inspection; one watcher, the same one.
    ran = node.root / "var/lib/tpuserve/reconverge/startup-script.sh"
    assert ran.read_text() == new_script
    assert node.watcher_pids() == watcher

    # Measured on the fakes (TPUSERVE_TIME_SCALE=0.001): the change to the new server healthy.
    health_at = max(w.at for w in cloud.metadata.writes_in(NAMESPACE) if w.key == "health")
    calls = [c for c in node.docker_calls() if changed_at <= c["at"] <= done_at]
    print(f"\nreconverge on the fakes: metadata change -> health ok {health_at - changed_at:.2f} s,"
          f" -> applied {done_at - changed_at:.2f} s; docker calls {len(calls)}: "
          + ", ".join(sorted({" ".join(c["argv"][:2]) for c in calls})))

    # The same content written again (a new ETag): nothing restarts, nothing is recorded.
    touched_at = time.time()
    cloud.metadata.touch_attribute(KEY)
    etag = cloud.metadata.etag(KEY)
    wait_for(lambda: any(f"last_etag={etag}&" in q for _, q, _ in
                         cloud.metadata.attribute_polls(KEY)), "a poll with the new ETag")
    assert node.docker_calls()[-1]["at"] < touched_at
    assert _reconverge(cloud, touched_at) == []

    # The boot script run again by hand (the runner at a reboot would too): still one watcher.
    node.script.write_text(new_script)
    rerun_at = time.time()
    node.run()
    assert node.watcher_pids() == watcher
    assert node.docker_commands("run", rerun_at) == [] and node.attrs()["container"] == "reused"
    assert _reconverge(cloud, rerun_at) == []


def test_a_failing_new_script_is_recorded_and_a_fixed_one_still_applies(cloud: Cloud) -> None:
    node = cloud.node()
    _booted(cloud, node)
    serving = node.container(VLLM)
    # A config whose image cannot be pulled: the new script fails before touching containers.
    broken = _script(cloud, node.deployment.model_copy(update={
        "vllm": node.deployment.vllm.model_copy(update={"image": "vllm/vllm-tpu:missing"})}))
    (node.docker_state / "pull_failures").write_text("100000")
    broken_at = time.time()
    cloud.metadata.set_attribute(KEY, broken)
    wait_for(lambda: any(v.startswith("failed") for v in _reconverge(cloud, broken_at)),
             "the broken script's end", timeout=60)
    words = _reconverge(cloud, broken_at)
    # Run again (a registry outage may end), at most 3 times within the readiness budget.
    assert words[0] == f"changed sha256={_sha(broken)} etag={cloud.metadata.etag(KEY)}"
    assert all(w.startswith(f"retrying sha256={_sha(broken)} attempt=") for w in words[1:-1])
    assert 1 <= len(words[1:-1]) <= 3
    assert words[-1].startswith(f"failed sha256={_sha(broken)} could not pull "
                                "vllm/vllm-tpu:missing")
    assert node.attrs()["state"] == "failed could not pull vllm/vllm-tpu:missing"
    # The old server was left serving (a failed pull replaces nothing).
    assert node.container(VLLM)["pid"] == serving["pid"]
    assert node.docker_commands("run", broken_at) == []
    assert len(node.watcher_pids()) == 1

    # The user fixes the config: the watcher, still watching, applies it.
    (node.docker_state / "pull_failures").write_text("0")
    fixed = _script(cloud, _with_vllm(node.deployment, max_model_len=16384))
    fixed_at = time.time()
    cloud.metadata.set_attribute(KEY, fixed)
    wait_for(lambda: len(_reconverge(cloud, fixed_at)) == 2, "the fixed script's end",
             timeout=60)
    assert _reconverge(cloud, fixed_at)[1] == f"applied sha256={_sha(fixed)}"
    assert node.attrs()["state"] == "ready"
    cmd = node.container(VLLM)["cmd"]
    assert cmd[cmd.index("--max-model-len") + 1] == "16384"


def test_a_failed_first_boot_leaves_a_watcher_and_refuses_an_oversized_script(
    cloud: Cloud,
) -> None:
    node = cloud.node()
    cloud.metadata.set_attribute(KEY, node.script.read_text())
    (node.docker_state / "pull_failures").write_text("100000")
    node.env["TPUSERVE_TIME_SCALE"] = "0.0002"  # the failing pull's budget, faster
    node.run(expect_rc=1)
    assert node.attrs()["state"].startswith("failed could not pull")
    wait_for(lambda: _reconverge(cloud), "the watcher's first record")
    assert len(node.watcher_pids()) == 1
    boot_result = (node.root / "run/tpuserve/boot.result").read_text()
    assert re.fullmatch(r"[0-9a-f]{64} failed could not pull vllm/vllm-tpu:nightly\n",
                        boot_result)

    # Over 256 KiB: not run, recorded once; the watcher waits for the next change.
    huge_at = time.time()
    cloud.metadata.set_attribute(KEY, "#!/bin/bash\n" + "#" * (256 * 1024) + "\nexit 0\n")
    wait_for(lambda: _reconverge(cloud, huge_at), "the refusal")
    time.sleep(0.5)
    assert _reconverge(cloud, huge_at) == [
        "failed sha256=none metadata: startup-script over 262144 bytes: not run"]
    # The answer's ETag is taken: the next poll holds (timeout_sec=1) rather than fetch again.
    # (The fake records a request when it ends.)
    etag = cloud.metadata.etag(KEY)

    def polls() -> list[str]:
        return [q for at, q, _ in cloud.metadata.attribute_polls(KEY) if at >= huge_at]

    wait_for(lambda: any(f"last_etag={etag}&" in q for q in polls()), "a poll that held")
    assert len(polls()) <= 3, polls()
    assert not (node.root / "var/lib/tpuserve/reconverge").exists()

    # A script that is not a boot script at all: its exit status is the reason.
    odd_at = time.time()
    cloud.metadata.set_attribute(KEY, "#!/bin/bash\nexit 3\n")
    wait_for(lambda: any(v.startswith("failed") for v in _reconverge(cloud, odd_at)),
             "the odd script's end")
    odd = "#!/bin/bash\nexit 3\n"
    assert _reconverge(cloud, odd_at)[-1].startswith(f"failed sha256={_sha(odd)} exit 3")

    # The fix: pulls work again and the script is the config's (a setting changed).
    (node.docker_state / "pull_failures").write_text("0")
    fixed = _script(cloud, _with_vllm(node.deployment, max_model_len=16384))
    fixed_at = time.time()
    cloud.metadata.set_attribute(KEY, fixed)
    wait_for(lambda: any(v.startswith(("applied", "failed"))
                         for v in _reconverge(cloud, fixed_at)), "the fix", timeout=60)
    assert _reconverge(cloud, fixed_at)[-1] == f"applied sha256={_sha(fixed)}"
    assert node.attrs()["state"] == "ready"
    assert node.attrs()["config"] == _config(cloud, _with_vllm(node.deployment,
                                                               max_model_len=16384))
    assert len(node.watcher_pids()) == 1


def test_on_a_node_with_systemd_the_watcher_is_a_unit_of_its_own(tmp_path: Path) -> None:
    """start_watcher alone (the lib part), as on a real node: no TPUSERVE_ROOT, systemd
    present. systemctl and systemd-run are stubs that print their argv."""
    systemd_dir = tmp_path / "systemd"
    systemd_dir.mkdir()
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("systemctl", "systemd-run"):
        (stubs / tool).write_text(
            f'#!/bin/sh\nprintf "{tool}"; printf " %s" "$@"; echo\n'
            f'[ "$1 $2" != "is-active --quiet" ] || exit "${{ACTIVE:-3}}"\n')
        (stubs / tool).chmod(0o755)
    lib = "".join(_env.get_template(f"boot/{part}.sh.j2").render() for part in ("lib", "api"))
    program = (f"{lib}\nROOT=''\nSYSTEMD_DIR={systemd_dir}\nSTATE_DIR=/var/lib/tpuserve\n"
               "HELPER=$STATE_DIR/boot_helper.py RECORDER=$STATE_DIR/record_reconverge.sh\n"
               "STACK=spot PHASE=test\nstart_watcher\n")
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "GCE_METADATA_HOST": "169.254.169.254",
           "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": "https://storage.example/",
           "UNRELATED": "x"}

    def run(**extra: str) -> list[str]:
        proc = subprocess.run(["bash", "-c", program], env={**env, **extra}, text=True,
                              capture_output=True, check=True)
        return [line for line in proc.stdout.splitlines() if not re.match(r"\d{4}-", line)]

    python3 = subprocess.run(["bash", "-c", "command -v python3"], env=env, text=True,
                             capture_output=True, check=True).stdout.strip()
    assert run() == [
        "systemctl is-active --quiet tpuserve-watch.service",
        ("systemd-run --quiet --unit=tpuserve-watch --collect -p Restart=on-failure "
         "-p RestartSec=30 --setenv=CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE="
         "https://storage.example/ --setenv=GCE_METADATA_HOST=169.254.169.254 "
         f"{python3} /var/lib/tpuserve/boot_helper.py watch --meta-host 169.254.169.254 "
         "--run-dir /run/tpuserve --state-dir /var/lib/tpuserve "
         "--recorder /var/lib/tpuserve/record_reconverge.sh --scale-us 1000000 "
         "--ga-url http://169.254.169.254/computeMetadata/v1/instance/guest-attributes/ "
         "--owed-dir /run/tpuserve/ga-owed")]
    # A unit that runs already: nothing started.
    assert run(ACTIVE="0") == ["systemctl is-active --quiet tpuserve-watch.service"]
