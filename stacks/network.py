"""The deployment's network: a VPC and one subnet of its own, or the network the user brings.

On the `default` network the pre-made `default-allow-ssh` rule (tcp:22 from 0.0.0.0/0) applies
to a node with an external IP, whatever tpuserve's own rule says. A network created here has no
rules but tpuserve's, so "SSH from IAP only" means what it says (issue 10 section 3).

Named for the deployment (`gcp.deployment`), not for one stack: this construct is one of the
long-lived pieces a shared base will hold, and it moves there whole (its Terraform addresses
are fixed with override_logical_id). Until then, two stacks of one deployment in one project
would both create it: give the second its own `gcp.deployment` (README).
"""

from __future__ import annotations

from tpuserve.settings import Deployment

from .cdk import (
    Construct,
    GoogleComputeNetwork,
    GoogleComputeSubnetwork,
    GoogleComputeSubnetworkLogConfig,
)


class Network(Construct):
    """`name` and `subnetwork` are what a node's network_config takes; `resources` is what a
    node must wait for (empty when the user brings the network)."""

    def __init__(self, scope: Construct, id_: str, *, deployment: Deployment) -> None:
        super().__init__(scope, id_)
        d = deployment
        self.name: str = d.network_name
        self.subnetwork: str | None = None
        self.resources: list[object] = []
        if not d.creates_network:
            return
        network = GoogleComputeNetwork(
            self, "network",
            name=d.network_name,
            auto_create_subnetworks=False,  # one subnet, in the zone's region, below
            routing_mode="REGIONAL",
            description=f"tpuserve deployment {d.gcp.deployment}: only tpuserve's rules apply",
        )
        network.override_logical_id("network")
        subnet_name = d.subnet_name
        assert subnet_name is not None  # creates_network
        subnet = GoogleComputeSubnetwork(
            self, "subnetwork",
            name=subnet_name,
            network=network.id,
            region=d.gcp.region,
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
        # References (not the literal names): the firewall and the node wait for them.
        self.name = network.name
        self.subnetwork = subnet.name
        self.resources = [network, subnet]
