"""The flex stack's provisioners' TPU side: the plan-time probe (their progress lines:
tpuserve/progress_lines.py).

`python -m tpuserve.queued_resource` (tpuserve/queued_resource.py: its commands, inputs, output
and exit codes) calls these, and the converge step in tpuserve.gcp.qr_converge.
"""

from __future__ import annotations

import secrets
import time

from tpuserve.gcp.tpu.client import TpuClient
from tpuserve.gcp.tpu.queued_resources import (
    ALIVE_STATES,
    KNOWN_STATES,
    MISSING,
    QueuedResourceRef,
    UnknownState,
)

# ----------------------------------------------------------------------------- probe


def new_generation(now: float | None = None) -> str:
    """A fresh token (UTC time + 4 hex digits), valid as a label value."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(2)}"


def probe(client: TpuClient, ref: QueuedResourceRef) -> dict[str, str]:
    """The replacement token the flex stack puts in triggers_replace.

    A live QR answers with the generation label it was created with, so the plan is a no-op;
    a missing, SUSPENDED, FAILED or DELETING one answers with a new token, so Terraform plans
    a replacement exactly when the QR is dead. A state this client does not know
    (STATE_UNSPECIFIED) is not a reason to replace: the QR keeps its token, reported as
    unknown; without a token to keep, the probe fails (UnknownState) rather than guess.
    """
    qr = client.get_queued_resource(ref)
    state = qr.state if qr else MISSING
    if qr is not None and state not in KNOWN_STATES:
        if not qr.generation:
            raise UnknownState(qr)
        return {"generation": qr.generation, "state": f"UNKNOWN ({state})"}
    if qr is not None and state in ALIVE_STATES and qr.generation:
        return {"generation": qr.generation, "state": state}
    return {"generation": new_generation(), "state": state}
