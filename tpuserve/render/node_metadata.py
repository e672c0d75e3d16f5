"""The TPU node's metadata, shared by the VM stacks and the flex queued-resource body.

Kept free of imports but the contracts: the Terraform provisioners import it on every call.
"""

from __future__ import annotations

from collections.abc import Callable

# The guest attributes the boot script writes: a contract with the CLI's reader.
from tpuserve.contracts import GUEST_ATTRIBUTE_KEYS as GUEST_ATTRIBUTE_KEYS


def node_metadata(
    startup_script: str, *, escape: Callable[[str], str] = lambda s: s
) -> dict[str, str]:
    """The node's metadata: the boot script; guest attributes switched on (off by default on
    Compute Engine) so the boot phases can be read through the TPU API; and SSH through OS
    Login only: IAM decides who may log in (roles/compute.osLogin or osAdminLogin), and
    project-wide SSH keys in metadata do not open the node."""
    return {
        "startup-script": escape(startup_script),
        "enable-guest-attributes": "TRUE",
        "enable-oslogin": "TRUE",
        "block-project-ssh-keys": "TRUE",
    }
