"""`python -m tpuserve.billing_guard arm|disarm`: the TPU VM stacks' billing-guard provisioners.

The name is written into deployed stacks' Terraform (and the README), so it stays. This is the
process: the target from the stack's TPUSERVE_GUARD_* variables (tpuserve.contracts), one
deadline for the whole run, the output and the exit codes; the Cloud Tasks calls are in
tpuserve.gcp.billing_guard.

One run of `arm` or `disarm` ends within DEADLINE_S (300 s): every call beneath it (the node's
read, the task list's pages, each create and delete), its retries and each try's last byte
included, is bounded by it (the edge's `deadline_within`); Terraform's local-exec has no
timeout of its own. A call cut by it is one line naming the bound, exit 1. Bad input: exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Mapping
from typing import IO

from tpuserve import contracts, entry_point
from tpuserve.contracts import GUARD_NODE_ENV as ENV_NODE
from tpuserve.contracts import GUARD_QUEUE_ENV as ENV_QUEUE
from tpuserve.contracts import GUARD_SECONDS_ENV as ENV_SECONDS
from tpuserve.contracts import GUARD_SERVICE_ACCOUNT_ENV as ENV_SERVICE_ACCOUNT
from tpuserve.contracts import GUARD_TPU_ENDPOINT_ENV as ENV_TPU_ENDPOINT
from tpuserve.gcp.api import GoogleApi
from tpuserve.gcp.billing_guard import CloudTasks, GuardError, GuardTarget, arm, disarm
from tpuserve.gcp.endpoints import TPU_API, guard_task_root
from tpuserve.gcp.errors import ApiError

# One arm or disarm run's bound, every call and retry beneath it included (the edge caps one try
# at 30 s and one call's retries at 120 s).
DEADLINE_S = 300.0


def target_from_env(environ: Mapping[str, str], *, endpoint: bool = True) -> GuardTarget:
    """The target the stack's provisioner describes in TPUSERVE_GUARD_*. The task's endpoint
    comes from ENV_TPU_ENDPOINT only (unset: production), never from an endpoint override;
    `endpoint=False` (disarm, which builds no task) does not read it."""
    missing = [v for v in (ENV_NODE, ENV_QUEUE, ENV_SERVICE_ACCOUNT, ENV_SECONDS)
               if not environ.get(v)]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}: the stack's provisioner sets them")
    raw = environ[ENV_SECONDS]
    if not raw.isdigit():
        raise ValueError(f"{ENV_SECONDS} = {raw!r}: whole seconds")
    root = guard_task_root(ENV_TPU_ENDPOINT,
                           (environ.get(ENV_TPU_ENDPOINT) or None) if endpoint else None)
    return GuardTarget(environ[ENV_NODE], environ[ENV_QUEUE], environ[ENV_SERVICE_ACCOUNT],
                       int(raw), root)


def main(argv: list[str] | None = None, *, environ: Mapping[str, str] | None = None,
         stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    env = os.environ if environ is None else environ
    out, err = stdout or sys.stdout, stderr or sys.stderr
    parser = argparse.ArgumentParser(
        prog=contracts.BILLING_GUARD.prog,
        description="Arm or disarm a TPU node's billing guard (a Cloud Tasks task); used by "
                    f"the spot and on-demand stacks. Inputs: ${ENV_NODE}, ${ENV_QUEUE}, "
                    f"${ENV_SERVICE_ACCOUNT}, ${ENV_SECONDS}, ${ENV_TPU_ENDPOINT} (optional).",
    )
    parser.add_argument("command", choices=contracts.BILLING_GUARD.commands)
    args = parser.parse_args(argv)
    hint = (f"billing guard {args.command} ends every call within {DEADLINE_S:g} s in all (its "
            "overall deadline): run it again once the API answers")

    def body() -> int:
        target = target_from_env(env, endpoint=args.command == "arm")
        tasks = CloudTasks(environ=env)
        with contextlib.ExitStack() as bounds:
            bounds.enter_context(tasks.deadline_within(DEADLINE_S, hint=hint))
            if args.command == "arm":
                tpu = GoogleApi("tpu", TPU_API, environ=env)
                bounds.enter_context(tpu.deadline_within(DEADLINE_S, hint=hint))
                print(f"tpuserve: {target.node_id}: "
                      f"{arm(target, tasks=tasks, tpu=tpu).describe()}", file=out)
            else:
                removed = disarm(target, tasks=tasks)
                print(f"tpuserve: {target.node_id}: billing guard disarmed ({len(removed)} "
                      "task(s) deleted)", file=out)
        return 0

    return entry_point.run(body, err, usage=(ValueError,), failed=(ApiError, GuardError),
                           prefix=f"billing guard {args.command}: ", interrupt=False)


if __name__ == "__main__":
    sys.exit(main())
