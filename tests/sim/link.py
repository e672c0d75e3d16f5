"""What a TPU VM is to its two APIs, for the boot tests' fakes: the node's metadata in the
fake TPU API is what the VM's fake metadata server serves (so a nodes.patch of the
startup-script reaches the watcher, as on a real node), and the guest attributes the boot
script writes to the metadata server are what the TPU API's getGuestAttributes answers (so a
client reads a candidate's boot phases the way `tpuserve status` does). The fakes stay apart;
a thread copies both ways every 10 ms while the link is open.
"""

from __future__ import annotations

import threading
from types import TracebackType

from tests.render.boot.support import NAMESPACE, Cloud, Node

EVERY_S = 0.01


class NodeLink:
    def __init__(self, cloud: Cloud, node: Node) -> None:
        self.cloud = cloud
        d = node.deployment
        self.name = f"projects/{d.gcp.project}/locations/{d.gcp.zone}/nodes/{d.node_name}"
        self._script: str | None = None
        self.scripts: list[str] = []  # every startup-script the node was given, in order
        self._copied: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-link", daemon=True)
        script = node.script.read_text()
        cloud.tpu.set_node_metadata(self.name, {"startup-script": script})
        cloud.tpu.set_node_ip(self.name, "127.0.0.1")  # where the node's proxy listens here

    def __enter__(self) -> NodeLink:
        self.sync()
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(EVERY_S):
            self.sync()

    def sync(self) -> None:
        metadata = self.cloud.tpu.nodes[self.name].spec.get("metadata") or {}
        script = metadata.get("startup-script")
        if script is not None and script != self._script:
            self.cloud.metadata.set_attribute("startup-script", script)
            self._script = script
            self.scripts.append(script)
        for key, value in self.cloud.metadata.namespace(NAMESPACE).items():
            if self._copied.get(key) != value:
                self.cloud.tpu.set_guest_attribute(self.name, key, value, namespace=NAMESPACE)
                self._copied[key] = value
