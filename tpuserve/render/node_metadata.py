"""The TPU node's metadata, shared by the VM stacks and the flex queued-resource body.

Kept free of imports: the Terraform provisioners import it on every call.
"""

from __future__ import annotations

from collections.abc import Callable

# The guest attributes the boot script writes (namespace facts.GUEST_ATTRIBUTE_NAMESPACE), in
# the order a boot first writes them; their values: the script's header. The one list: the
# renderer and its tests, and the CLI's reader (ops/boot_phases.py), take it from here.
# `reconverge` is the watcher's (the script re-run in place when metadata changes), not a boot's.
GUEST_ATTRIBUTE_KEYS: tuple[str, ...] = (
    "boot", "state", "secret", "tls", "image", "cache", "container", "config", "bypass_check",
    "metrics", "memory", "kv_cache", "startup_complete", "health", "cache_publish",
    "reconverge",
)


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
