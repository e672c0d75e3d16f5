"""[vllm] speculative_config: vLLM's JSON checked key by key, refused without the allowance
(never booted on the pinned image), rendered as one argv word; unset renders nothing."""

from __future__ import annotations

import json
import shlex

import pytest

from tpuserve.render.vllm_args import serve_argv
from tpuserve.settings import ConfigError
from tpuserve.settings.loader import deep_merge, from_raw, load_raw
from tpuserve.settings.vllm import VllmSettings

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


def _flex(vllm: dict[str, object]) -> VllmSettings:
    raw = deep_merge(load_raw(environ={}), {"stacks": {"flex": {"vllm": vllm}}})
    return from_raw(raw).deployments["flex"].vllm


def test_unset_renders_nothing() -> None:
    assert not any("speculative" in a for a in serve_argv(_flex({})))


def test_ngram_renders_as_one_argv_word() -> None:
    v = _flex({"allow_untested_speculative_config": True, "speculative_config": NGRAM})
    argv = serve_argv(v)
    i = argv.index("--speculative-config")
    assert json.loads(argv[i + 1]) == NGRAM
    # The boot script joins the argv with shlex: the JSON comes back as one word.
    assert shlex.split(shlex.join(argv))[i + 1] == argv[i + 1]


def test_the_json_text_form_is_taken() -> None:
    v = _flex({"allow_untested_speculative_config": True,
               "speculative_config": json.dumps(NGRAM)})
    assert v.speculative_config == NGRAM


def _problem(vllm: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as err:
        _flex(vllm)
    (line,) = [p for p in err.value.problems if "speculative_config" in p]
    assert "\n" not in line and "Traceback" not in line
    return line


def test_without_the_allowance_it_is_refused_in_one_line() -> None:
    line = _problem({"speculative_config": NGRAM})
    assert "vllm.speculative_config" in line and "allow_untested_speculative_config" in line
    assert "never booted" in line


@pytest.mark.parametrize(("value", "fragment"), [
    ({"method": "eagle3", "num_speculative_tokens": 2}, "method must be one of ngram"),
    ({"method": "ngram"}, "num_speculative_tokens is required"),
    ({**NGRAM, "model": "/etc/passwd"}, "unknown key(s) model"),
    ({**NGRAM, "num_speculative_tokens": 100}, "1..16"),
    ({**NGRAM, "num_speculative_tokens": True}, "integer"),
    ({**NGRAM, "prompt_lookup_min": 8}, "exceeds"),
    ("{not json", "not JSON"),
    ("'; rm -rf / #", "not JSON"),
    ([1, 2], "must be a table"),
])
def test_bad_tables_are_refused(value: object, fragment: str) -> None:
    line = _problem({"allow_untested_speculative_config": True, "speculative_config": value})
    assert fragment in line, line
