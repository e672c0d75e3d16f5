"""[vllm] speculative_config: vLLM's `--speculative-config` JSON, checked key by key.

The methods: tpu-inference's SpeculativeDecodingManager (tpu_inference/runner/, upstream
vllm-project/tpu-inference) drafts with `ngram`, `eagle3` and `dflash`; only `ngram` needs no
draft checkpoint, so it is the one allowed here. Whether the pinned image supports it for the
stack's model is data (SUPPORT, each fact with its repository, tag or commit and file): the
backend has the code path, upstream tests it on one small model on v6e only, and the pinned
image (`vllm/vllm-tpu:nightly`) is a moving tag, not a digest, so its build cannot be tied to a
tpu-inference commit; none was ever booted here (docs/measurements.md section 4 lists n-gram as
untried). Support is therefore not proved for any model on the pin, and a speculative config is
refused unless vllm.allow_untested_speculative_config says the user knows (fail closed). Every
key and value is checked: the JSON reaches vLLM's argv (as one argv word, never through a
shell), and an unknown key is refused rather than passed on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

METHODS = ("ngram",)
# key -> (lowest, highest) of an integer key; "method" is the one string.
INT_KEYS: Mapping[str, tuple[int, int]] = {
    "num_speculative_tokens": (1, 16),
    "prompt_lookup_max": (1, 64),
    "prompt_lookup_min": (1, 64),
}
KEYS = ("method", *INT_KEYS)

class Support(NamedTuple):
    """What upstream shows for one method on the TPU backend, and where it says so."""

    method: str
    code_path: str  # where the backend builds the method's drafter
    tested_models: tuple[str, ...]  # the models upstream's CI runs it with
    tested_on: str  # the TPU generation of those runs
    source: str  # repository, tags/commit and files

    def words(self, model: str) -> str:
        tested = model in self.tested_models
        return (f"{self.method}: the TPU backend has the code path ({self.code_path}); upstream "
                f"tests it on {', '.join(self.tested_models)} on {self.tested_on}"
                f"{'' if tested else f', not on {model}'} ({self.source}); not proved for "
                "the pinned image")


SUPPORT: Mapping[str, Support] = {
    "ngram": Support(
        "ngram",
        "tpu_runner.py _init_speculative_decoding: NgramProposer for method ngram",
        ("Qwen/Qwen2.5-0.5B-Instruct",), "v6e (a soft_fail CI step)",
        "github.com/vllm-project/tpu-inference v0.26.0 c90cece0, v0.27.0 e1c03382 and main "
        "b8692ff0: tpu_inference/runner/tpu_runner.py, tests/e2e/test_speculative_decoding.py, "
        ".buildkite/features/Speculative_Decoding-_Ngram.yml"),
}


def unsupported(method: str, model: str) -> str:
    """Why METHOD is not proved on the pinned image for MODEL (every method, today)."""
    known = SUPPORT.get(method)
    return known.words(model) if known is not None else \
        f"{method}: no upstream record of the TPU backend supporting it"


UNTESTED = ("speculative decoding was never booted on the pinned image (vllm/vllm-tpu:nightly "
            "is a moving tag, so its methods cannot be checked at the pin; docs/measurements.md "
            "section 4: n-gram untried)")
_NAME = "vllm.speculative_config"


def parse(value: object) -> dict[str, Any] | None:
    """The table (or its JSON text) as a checked dict; None (or "", TOML's off) for none.
    ValueError (one line: the setting, the value, the rule) otherwise."""
    if value is None or value == "" or value == {}:
        return None
    shown = repr(value)[:120]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{_NAME} = {shown}: not JSON; give vLLM's object, e.g. "
                             '{"method": "ngram", "num_speculative_tokens": 4}') from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{_NAME} = {shown}: must be a table (vLLM's JSON object)")
    unknown = sorted(str(k) for k in value if k not in KEYS)
    if unknown:
        raise ValueError(f"{_NAME} = {shown}: unknown key(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(KEYS)}")
    if value.get("method") not in METHODS:
        raise ValueError(f"{_NAME} = {shown}: method must be one of {', '.join(METHODS)} (the "
                         "TPU backend's method without a draft checkpoint)")
    if "num_speculative_tokens" not in value:
        raise ValueError(f"{_NAME} = {shown}: num_speculative_tokens is required")
    for key, (lo, hi) in INT_KEYS.items():
        if key in value:
            x = value[key]
            if type(x) is not int or not lo <= x <= hi:
                raise ValueError(f"{_NAME} = {shown}: {key} must be an integer in {lo}..{hi}")
    low, high = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
    if low is not None and high is not None and low > high:
        raise ValueError(f"{_NAME} = {shown}: prompt_lookup_min {low} exceeds "
                         f"prompt_lookup_max {high}")
    return {k: value[k] for k in KEYS if k in value}


def require_allowed(value: dict[str, Any] | None, allowed: bool) -> dict[str, Any] | None:
    if value is not None and not allowed:
        raise ValueError(f"{_NAME} = {json.dumps(value)}: {UNTESTED}; set "
                         "vllm.allow_untested_speculative_config = true to try it")
    return value


def short(value: Mapping[str, Any] | None) -> str:
    """A candidate id's part: ngram4 (method and draft tokens), '' for none."""
    if not value:
        return ""
    return f"{value['method']}{value['num_speculative_tokens']}"
