"""Real Terraform reads every string of the synthesized stacks back as the literal we meant.

Terraform interpolates `${...}` and `%{...}` in every string of a .tf.json file; a bash
script is full of them, and a config value could hold one. The stacks escape every string once
(stacks/literals.py). Here every string of the three synthesized stacks becomes an output of
one Terraform configuration, applied once with Terraform itself (no provider needed): each
must evaluate to its literal text. Strings holding genuine references keep them; those
references must be of the shapes cdktf and our stacks write, and the text around them is
checked like any other string.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stacks.local_exec import PYTHON
from tests.terraform_support import apply_outputs
from tpuserve.render.boot_script import render_startup

TERRAFORM = shutil.which("terraform")
# What a genuine reference looks like: an address with attributes and indexes, or the one
# function calls the flex and fleet provisioners make.
REFERENCE = re.compile(
    r"\$\{(?:[a-z_][a-z0-9_]*(?:\.[a-z0-9_]+|\[[0-9]+\])+"
    r"|base64gzip\(jsonencode\(self\.input\.body\)\)|base64gzip\(self\.input\.bundle\))\}"
)
PLACEHOLDER = "<reference>"


def strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, string) of every string leaf; cdktf's "//" metadata comments are not config."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            if k != "//":
                yield from strings(v, f"{path}/{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from strings(v, f"{path}/{i}")


def split_template(text: str) -> tuple[str, list[str]]:
    """(the text with each template sequence replaced by PLACEHOLDER, the sequences).
    Terraform's escapes `$${` and `%%{` are literal text, not sequences."""
    out, sequences, i = [], [], 0
    while i < len(text):
        if text.startswith(("$${", "%%{"), i):
            out.append(text[i:i + 3])
            i += 3
        elif text.startswith(("${", "%{"), i):
            end = text.index("}", i)
            sequences.append(text[i:end + 1])
            out.append(PLACEHOLDER)
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out), sequences


def literal(text: str) -> str:
    """What Terraform makes of escaped literal text."""
    return text.replace("$${", "${").replace("%%{", "%{")


def test_every_template_sequence_is_a_genuine_reference(synthesized) -> None:
    for stack, tf in synthesized.items():
        for path, text in strings(tf):
            _, sequences = split_template(text)
            for seq in sequences:
                assert REFERENCE.fullmatch(seq), f"{stack}{path}: {seq[:80]!r} is evaluated"


@pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed")
def test_terraform_evaluates_every_string_to_its_literal(
    synthesized, deployments, tmp_path: Path
) -> None:
    texts: dict[str, str] = {}  # each distinct string once (a 38 KB script costs ~1.7 s)
    for tf in synthesized.values():
        for _, text in strings(tf):
            texts.setdefault(split_template(text)[0], f"s{len(texts)}")
    assert len(texts) > 50  # every stack's names, labels, scripts, commands, outputs
    got = apply_outputs({name: text for text, name in texts.items()}, tmp_path)
    for text, name in texts.items():
        assert got[name] == literal(text), text[:200]

    # The literals we meant, known independently of the escaping.
    def evaluated(text: str) -> str:
        return got[texts[split_template(text)[0]]]

    for stack in ("spot", "ondemand"):
        vm = synthesized[stack]["resource"]["google_tpu_v2_vm"]["tpu_node"]
        assert evaluated(vm["metadata"]["startup-script"]) == render_startup(deployments[stack])
    qr = synthesized["flex"]["resource"]["terraform_data"]["queued_resource"]
    [node_spec] = qr["input"]["body"]["tpu"]["nodeSpec"]
    assert evaluated(node_spec["node"]["metadata"]["startup-script"]) == render_startup(
        deployments["flex"])
    probe = synthesized["flex"]["data"]["external"]["qr_probe"]
    # The shell, not Terraform, expands the interpreter variable.
    assert evaluated(probe["program"][2]) == f"exec {PYTHON} -m tpuserve.queued_resource probe"
    assert PYTHON.startswith("${TPUSERVE_PYTHON:-")
    assert evaluated(qr["provisioner"][0]["local-exec"]["command"]).startswith(PYTHON)
