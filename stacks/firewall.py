"""A serving stack's firewall rules: its own, on the base's network, for its own network tag.

SSH from Google's IAP range plus access.ssh_source_ranges; the API port closed unless
access.api_source_ranges opens it. They go with the stack (a destroyed stack leaves no rule
open) and are named for the deployment and stack (`<deployment>-<stack>-allow-ssh`).
"""

from __future__ import annotations

from tpuserve.facts import IAP_RANGE
from tpuserve.settings import Deployment

from .cdk import Construct, GoogleComputeFirewall, GoogleComputeFirewallAllow


class Firewall(Construct):
    def __init__(self, scope: Construct, id_: str, *, deployment: Deployment) -> None:
        super().__init__(scope, id_)
        d = deployment
        ssh = GoogleComputeFirewall(
            self, "firewall_ssh",
            name=f"{d.node_name}-allow-ssh",
            network=d.network_name,
            direction="INGRESS",
            allow=[GoogleComputeFirewallAllow(protocol="tcp", ports=["22"])],
            source_ranges=[IAP_RANGE, *d.access.ssh_source_ranges],
            target_tags=[d.network_tag],
            description="SSH from Google's IAP range plus access.ssh_source_ranges",
        )
        ssh.override_logical_id("firewall_ssh")
        if d.access.api_source_ranges:  # closed unless a setting opens it
            api = GoogleComputeFirewall(
                self, "firewall_api",
                name=f"{d.node_name}-allow-api",
                network=d.network_name,
                direction="INGRESS",
                allow=[GoogleComputeFirewallAllow(protocol="tcp", ports=[str(d.vllm.port)])],
                source_ranges=list(d.access.api_source_ranges),
                target_tags=[d.network_tag],
                description="The OpenAI-compatible API from access.api_source_ranges",
            )
            api.override_logical_id("firewall_api")
