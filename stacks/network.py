"""The deployment's network: a VPC and one subnet of its own, or the network the user brings.

On the `default` network the pre-made `default-allow-ssh` rule (tcp:22 from 0.0.0.0/0) applies
to a node with an external IP, whatever tpuserve's own rule says. A network created here has no
rules but tpuserve's, so "SSH from IAP only" means what it says.

Named for the deployment (`gcp.deployment`), not for one stack, and held by the base stack
(stacks/base.py): every serving stack of the deployment puts its node on it by name. Its
Terraform addresses (network, subnetwork) are the ones the serving stacks had before the base
existed, so `terraform state mv` moves it (docs/upgrading.md).
"""

from __future__ import annotations

from tpuserve.settings.base_stack import Base

from .cdk import (
    Construct,
    GoogleComputeFirewall,
    GoogleComputeFirewallDeny,
    GoogleComputeNetwork,
    GoogleComputeSubnetwork,
    GoogleComputeSubnetworkLogConfig,
)


class Network(Construct):
    """The base's network and subnet (`resources`; none when the user brings the network)."""

    def __init__(self, scope: Construct, id_: str, *, base: Base) -> None:
        super().__init__(scope, id_)
        d = base
        self.resources: list[object] = []
        if not d.creates_network:
            return
        network = GoogleComputeNetwork(
            self, "network",
            name=d.network_name,
            auto_create_subnetworks=False,  # one subnet, in the zone's region, below
            routing_mode="REGIONAL",
            description=f"tpuserve deployment {d.deployment}: only tpuserve's rules apply",
        )
        network.override_logical_id("network")
        subnet_name = d.subnet_name
        assert subnet_name is not None  # creates_network
        subnet = GoogleComputeSubnetwork(
            self, "subnetwork",
            name=subnet_name,
            network=network.id,
            region=d.region,
            ip_cidr_range=d.gcp.subnet_cidr,
            # The node reaches Secret Manager and Cloud Storage by Google's private path too.
            private_ip_google_access=True,
            # Sampled flow logs: who talked to the node, at a small fraction of the volume.
            log_config=GoogleComputeSubnetworkLogConfig(
                aggregation_interval="INTERVAL_10_MIN", flow_sampling=0.5,
                metadata="INCLUDE_ALL_METADATA",
            ),
        )
        subnet.override_logical_id("subnetwork")
        # Ingress is denied by Google's implied rule already; this one says so in the network
        # itself, at the lowest priority a rule can have, so every serving stack's allow rule
        # (priority 1000, its own tag) is the only way in, and a deleted allow rule closes.
        deny = GoogleComputeFirewall(
            self, "firewall_deny_ingress",
            name=f"{d.network_name}-deny-ingress",
            network=network.name,
            direction="INGRESS",
            priority=65534,
            deny=[GoogleComputeFirewallDeny(protocol="all")],
            source_ranges=["0.0.0.0/0"],
            description="Baseline: no ingress but what a serving stack's own rules allow",
        )
        deny.override_logical_id("firewall_deny_ingress")
        self.resources = [network, subnet, deny]
