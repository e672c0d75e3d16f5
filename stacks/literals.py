"""The one Terraform escape pass: every string synthesized is a literal unless it is a reference.

Terraform evaluates `${...}` and `%{...}` in every string of a .tf.json file, and cdktf
writes strings as given: a config value or a rendered script holding `${file("~/.ssh/id_rsa")}`
would be evaluated on the machine running Terraform. So the stacks never escape anything
field by field; `TerraformLiterals`, an aspect every serving stack carries, escapes every
string of every Terraform element once, just before synthesis.

How a literal is told from a reference: at that point cdktf has not resolved its tokens yet.
Every genuine reference is a token (`${TfToken[TOKEN.n]}`): the ones cdktf makes itself
(`sa.email`, `fqn`) and the expressions our stacks write by hand, which go through `tf_ref`.
Everything else in a string is literal text, and is escaped (`${` -> `$${`, `%{` -> `%%{`).
"""

from __future__ import annotations

import builtins
import re
from typing import Any

import jsii

from .cdk import IAspect, IConstruct, IResolvable, IResolveContext, TerraformElement, Token

# cdktf's encoding of a string token (tokens/private/encoding.js: BEGIN_STRING_TOKEN_MARKER,
# VALID_KEY_CHARS, END_TOKEN_MARKER).
TOKEN = re.compile(r"(\$\{TfToken\[[a-zA-Z0-9:._-]+\]\})")
# The blocks of an element's JSON that hold its attributes (what add_override addresses).
_BLOCK_KINDS = ("resource", "data")


def escape_text(text: str) -> str:
    """Literal text as a Terraform template that evaluates to exactly `text`."""
    return text.replace("${", "$${").replace("%{", "%%{")


def escape_literals(value: Any) -> Any:
    """`value` with the literal parts of every string escaped; tokens are kept."""
    if isinstance(value, str):
        parts = TOKEN.split(value)  # literal, token, literal, token, ..., literal
        for i in range(0, len(parts), 2):
            literal = escape_text(parts[i])
            if literal.endswith("$") and i + 1 < len(parts):
                # "$" then "${ref}" would read as the escape "$${": the whole run of "$" before
                # the reference becomes one expression (a lone "$" kept would pair up again).
                run = len(literal) - len(literal.rstrip("$"))
                literal = literal[:-run] + '${"' + "$" * run + '"}'
            parts[i] = literal
        return "".join(parts)
    if isinstance(value, dict):
        return {k: escape_literals(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_literals(v) for v in value]
    return value


def changed_leaves(value: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """(path, escaped string) of every string leaf the pass changes. Keys are never escaped:
    one that would need it is refused (keys are our code's, never config's)."""
    if isinstance(value, str):
        escaped = escape_literals(value)
        return [] if escaped == value else [(path, escaped)]
    items: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(str(i), v) for i, v in enumerate(value)]
    out = []
    for key, item in items:
        if escape_literals(key) != key or ("." in key and changed_leaves(item)):
            raise ValueError(f"{'.'.join(path)}: key {key[:80]!r} cannot be escaped or overridden")
        out += changed_leaves(item, (*path, key))
    return out


@jsii.implements(IResolvable)
class _Expression:
    def __init__(self, expression: str) -> None:
        self._expression = expression

    @builtins.property
    def creation_stack(self) -> list[str]:
        return []

    def resolve(self, _context: IResolveContext) -> str:
        return "${" + self._expression + "}"

    def to_string(self) -> str:
        return "${" + self._expression + "}"


def tf_ref(expression: str) -> str:
    """A hand-written Terraform expression (`self.input.name`, `path.module`) as a token:
    the escape pass leaves it a reference. The only way to put `${...}` into a stack."""
    return Token.as_string(_Expression(expression))


def _attributes(fragment: dict[str, Any]) -> dict[str, Any]:
    """The attribute object of one element's JSON fragment, which add_override addresses."""
    for kind in _BLOCK_KINDS:
        if fragment.get(kind):
            [by_name] = fragment[kind].values()
            [attrs] = by_name.values()
            return attrs
    if "output" in fragment:
        [attrs] = fragment["output"].values()
        return attrs
    if "provider" in fragment:
        [blocks] = fragment["provider"].values()
        [attrs] = blocks
        return attrs
    if "backend" in fragment.get("terraform", {}):
        [attrs] = fragment["terraform"]["backend"].values()
        return attrs
    raise TypeError(f"no attributes found in {sorted(fragment)}")


def _attrs(node: TerraformElement) -> dict[str, Any]:
    return {k: v for k, v in _attributes(node.to_terraform()).items() if k != "//"}


@jsii.implements(IAspect)
class TerraformLiterals:
    """Escapes every string of every Terraform element in the stack, once, before synthesis.

    Each changed string is written back as an override of its own leaf: cdktf's deepMerge
    appends lists, so a whole attribute cannot be replaced, except one that only an override
    set (a list there is replaced by a leaf override). The pass checks its own result and
    refuses to synthesize a stack it could not escape ("//" is cdktf's metadata comment)."""

    def __init__(self) -> None:
        self._done: set[str] = set()

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, TerraformElement):
            return
        path = node.node.path
        if path in self._done:  # synthesizing twice must not escape twice
            return
        self._done.add(path)
        fragment = node.to_terraform()
        attrs = {k: v for k, v in _attributes(fragment).items() if k != "//"}
        for key, value in attrs.items():
            leaves = changed_leaves(value, (key,))
            if not leaves:
                continue
            expected = escape_literals(value)
            for leaf, escaped in leaves:
                node.add_override(".".join(leaf), escaped)
            if _attrs(node).get(key) != expected:
                node.add_override(key, expected)  # an attribute set by an override alone
            if _attrs(node).get(key) != expected:
                raise ValueError(f"{path}: attribute {key!r} could not be escaped for Terraform")
        outside = {k: v for k, v in fragment.items() if k not in (*_BLOCK_KINDS, "output")}
        outside.pop("provider", None)
        outside.get("terraform", {}).pop("backend", None)
        if changed_leaves(outside):
            raise ValueError(f"{path}: a template sequence outside the element's attributes, "
                             "where no override reaches")
