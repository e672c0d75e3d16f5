"""The Terraform escape pass itself (stacks/literals.py): literal text escaped, tokens kept.

tests/stacks/test_terraform_strings.py proves the result with real Terraform on the synthesized
stacks; tests/settings/test_hostile_values.py with hostile values.
"""

from __future__ import annotations

import shutil

import pytest

from stacks.literals import TOKEN, changed_leaves, escape_literals, escape_text, tf_ref


def test_literal_text_is_escaped_and_tokens_are_kept() -> None:
    token = "${TfToken[TOKEN.7]}"
    assert escape_text("${HOME} %{ if x }") == "$${HOME} %%{ if x }"
    assert escape_literals(f"a ${{b}} {token} %{{c}}") == f"a $${{b}} {token} %%{{c}}"
    assert escape_literals(f"a${token}") == f'a${{"$"}}{token}'  # "$" + ref is not "$${"
    assert escape_literals({"k": [f"${{x}}{token}", 1, True, None]}) == {
        "k": [f"$${{x}}{token}", 1, True, None]}
    assert escape_literals("plain") == "plain"


def test_changed_leaves_address_each_string_by_its_path() -> None:
    value = {"metadata": {"startup-script": "${X}", "other": "y"}, "list": ["a", "%{b}"]}
    assert changed_leaves(value) == [
        (("metadata", "startup-script"), "$${X}"), (("list", "1"), "%%{b}")]
    with pytest.raises(ValueError, match="cannot be escaped"):
        changed_leaves({"${key}": "v"})
    with pytest.raises(ValueError, match="cannot be escaped"):
        changed_leaves({"a.b": "${v}"})  # an override path cannot hold a dot


def test_tf_ref_is_a_token() -> None:
    ref = tf_ref("self.input.name")
    assert TOKEN.fullmatch(ref)
    assert escape_literals(ref + "/x") == ref + "/x"


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform is not installed")
def test_a_run_of_dollars_before_a_reference_stays_literal(tmp_path) -> None:
    """Terraform itself reads the escaped text: any number of "$" just before a reference."""
    from tests.terraform_support import apply_outputs

    token = "${TfToken[TOKEN.7]}"
    cases = {f"d{n}": "a" + "$" * n for n in (1, 2, 3, 4)}
    got = apply_outputs({name: escape_literals(text + token).replace(token, "${path.module}")
                         for name, text in cases.items()}, tmp_path)
    assert got == {name: text + "." for name, text in cases.items()}
