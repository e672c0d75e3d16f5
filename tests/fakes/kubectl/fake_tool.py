"""A fake `gcloud` and `kubectl` for the fleet stack's provisioners (tests/stacks/).

Each call appends one JSON line to $FAKE_KUBE_LOG/calls.jsonl: the tool, its argv, its stdin
and the KUBECONFIG it was given. `gcloud container clusters get-credentials NAME` writes a
kubeconfig naming NAME to $KUBECONFIG, as gcloud does (or $FAKE_KUBECONFIG_TEXT: one pointing
at tests/fakes/kubernetes.py); `kubectl` refuses to run without one
(as it would reach no cluster), and fails with $FAKE_KUBECTL_FAIL (one message) when set;
$FAKE_KUBECTL_SLEEP_S holds every kubectl call that long first.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(tool: str, argv: list[str]) -> int:
    log = os.environ["FAKE_KUBE_LOG"]
    kubeconfig = os.environ.get("KUBECONFIG", "")
    stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    found = ""
    if kubeconfig and os.path.exists(kubeconfig):
        with open(kubeconfig) as fh:
            found = fh.read()
    with open(os.path.join(log, "calls.jsonl"), "a") as fh:
        fh.write(json.dumps({"tool": tool, "argv": argv, "stdin": stdin,
                             "kubeconfig": kubeconfig, "kubeconfig_text": found}) + "\n")
    if tool == "gcloud":
        if argv[:3] != ["container", "clusters", "get-credentials"] or not kubeconfig:
            print(f"ERROR: fake gcloud: unexpected call {argv}", file=sys.stderr)
            return 2
        with open(kubeconfig, "w") as fh:  # $FAKE_KUBECONFIG_TEXT: one reaching a fake API
            fh.write(os.environ.get("FAKE_KUBECONFIG_TEXT")
                     or f"current-context: gke_{argv[3]}\n")
        print(f"Fetching cluster endpoint and auth data.\nkubeconfig entry generated for "
              f"{argv[3]}.", file=sys.stderr)
        return 0
    if os.environ.get("FAKE_KUBECTL_SLEEP_S"):  # a kubectl that does not answer
        time.sleep(float(os.environ["FAKE_KUBECTL_SLEEP_S"]))
    if not found:
        print("error: no kubeconfig: the connection to the server localhost:8080 was refused",
              file=sys.stderr)
        return 1
    if os.environ.get("FAKE_KUBECTL_FAIL"):
        print("Warning: something\nerror: " + os.environ["FAKE_KUBECTL_FAIL"], file=sys.stderr)
        return 1
    verb = {"apply": "serverside-applied", "delete": "deleted", "wait": "condition met"}
    print(f"fake kubectl: {verb.get(argv[0], argv[0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(os.path.basename(sys.argv[1]), sys.argv[2:]))
