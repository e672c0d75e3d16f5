"""`tpuserve status`'s read of one stack, whatever its kind (tpuserve.ops.status_kinds)."""

from __future__ import annotations

import httpx

from tpuserve.settings import Deployment

from .fleet_status import FleetStatus, fleet_status
from .stack_status import StackStatus, TpuSource, stack_status
from .status_kinds import status_kind

Status = StackStatus | FleetStatus


def reads_tpu(d: Deployment) -> bool:
    """Its status asks the TPU API (the VM kinds; the fleet asks its cluster)."""
    return not status_kind(d).reads_cluster


def status_for(d: Deployment, *, tpu: TpuSource | None, http: httpx.Client,
               strict: bool) -> Status:
    """STRICT (the stack was named on the command line): the fleet's unreadable cluster is the
    command's error; otherwise it is that stack's problem. TPU: needed when reads_tpu(d)."""
    if status_kind(d).reads_cluster:
        return fleet_status(d, http=http, strict=strict)
    if tpu is None:
        raise ValueError(f"{d.name}: its status reads the TPU API: no client given")
    return stack_status(d, tpu=tpu, http=http)
