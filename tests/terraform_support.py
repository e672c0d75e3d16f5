"""Real Terraform on built-in outputs: what Terraform makes of a string (escape-pass tests)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

TERRAFORM = shutil.which("terraform")


def apply_outputs(outputs: dict[str, str], workdir: Path) -> dict[str, str]:
    """Each value as a Terraform output, applied once: {name: what Terraform made of it}."""
    (workdir / "main.tf.json").write_text(json.dumps(
        {"output": {name: {"value": value} for name, value in outputs.items()}}))
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
    env.pop("TF_CLI_CONFIG_FILE", None)
    run = {"cwd": workdir, "env": env, "capture_output": True, "text": True, "check": True}
    subprocess.run([TERRAFORM, "init", "-input=false", "-no-color"], **run)
    subprocess.run([TERRAFORM, "apply", "-auto-approve", "-input=false", "-no-color"], **run)
    got = json.loads(subprocess.run([TERRAFORM, "output", "-json"], **run).stdout)
    return {name: v["value"] for name, v in got.items()}


class OfflineStack:
    """The built-in part of a synthesized stack, applied by the real terraform CLI offline.

    google-beta resources and the hashicorp/external provider cannot be downloaded here, so:
    the stack's `terraform_data` resources are kept exactly as synthesized (provisioners,
    commands, environment, triggers), their `depends_on` on anything else dropped; each
    `data.external` source is run the way hashicorp/external runs it (its own `program` in its
    own `working_dir`, its `query` as JSON on stdin, a JSON object of strings back) and its
    `result.KEY` references become variables. A program that fails fails the plan, as it does
    in Terraform: nothing is applied. The directory is the stack's real one
    (cdktf.out/stacks/NAME under `root`), so `${path.module}/../../..` is `root`.
    """

    def __init__(self, root: Path, name: str, env: dict[str, str]) -> None:
        self.dir = root / "cdktf.out" / "stacks" / name
        self.dir.mkdir(parents=True, exist_ok=True)
        cli_config = root / "terraformrc"
        cli_config.write_text("")
        self.env = {**env, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1", "TF_INPUT": "0",
                    "TF_CLI_CONFIG_FILE": str(cli_config)}
        self.doc: dict = {}
        self.initialized = False

    def use(self, doc: dict) -> None:
        self.doc = doc
        text = json.dumps({"terraform_data": doc["resource"].get("terraform_data", {})})
        for source in doc.get("data", {}).get("external", {}):
            text = re.sub(rf"\$\{{data\.external\.{source}\.result\.(\w+)\}}",
                          lambda m, s=source: f"${{var.{s}__{m[1]}}}", text)
        resources = json.loads(text)
        for res in resources["terraform_data"].values():
            res.pop("//", None)
            kept = [dep for dep in res.pop("depends_on", []) if dep.startswith("terraform_data.")]
            if kept:
                res["depends_on"] = kept
        variables = sorted(set(re.findall(r"\$\{var\.(\w+)\}", text)))
        config = {"resource": resources}
        if variables:
            config["variable"] = {v: {"type": "string"} for v in variables}
        (self.dir / "main.tf.json").write_text(json.dumps(config, indent=1))

    def read_data(self,
                  ) -> tuple[dict[str, dict[str, str]], subprocess.CompletedProcess[str] | None]:
        """Every data.external source's result, or the first failing program's run."""
        results: dict[str, dict[str, str]] = {}
        for name, source in self.doc.get("data", {}).get("external", {}).items():
            program = [arg.replace("$${", "${") for arg in source["program"]]
            cwd = source["working_dir"].replace("${path.module}", str(self.dir))
            done = subprocess.run(program, input=json.dumps(source["query"]), cwd=cwd,
                                  env=self.env, capture_output=True, text=True, timeout=120,
                                  check=False)
            if done.returncode != 0:
                return results, done
            results[name] = json.loads(done.stdout)
        return results, None

    def run(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        if not self.initialized:
            subprocess.run([TERRAFORM, "init", "-input=false", "-no-color"], cwd=self.dir,
                           env=self.env, capture_output=True, text=True, check=True)
            self.initialized = True
        done = subprocess.run([TERRAFORM, *args, "-no-color"], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=300, check=False)
        if ok:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def _vars(self, results: dict[str, dict[str, str]]) -> list[str]:
        config = json.loads((self.dir / "main.tf.json").read_text())
        out = []
        for var in config.get("variable", {}):
            source, key = var.split("__", 1)
            out.append(f"-var={var}={results[source][key]}")
        return out

    def apply(self, *, ok: bool = True) -> subprocess.CompletedProcess[str]:
        """plan + apply; a failing data source is returned as the (failed) run."""
        results, failed = self.read_data()
        if failed is not None:
            return failed
        return self.run("apply", "-auto-approve", *self._vars(results), ok=ok)

    def destroy(self, *, ok: bool = True) -> subprocess.CompletedProcess[str]:
        results, failed = self.read_data()
        if failed is not None:
            return failed
        return self.run("destroy", "-auto-approve", *self._vars(results), ok=ok)

    def state(self) -> list[str]:
        return self.run("state", "list").stdout.split()
