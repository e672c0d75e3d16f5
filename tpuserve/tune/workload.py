"""What the tuner measures: context x clients cells, or a request trace (JSON Lines of
{"prompt_tokens": int, "output_tokens": int}, refused line by line with one clear error)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tpuserve.ops_error import EXIT_USAGE, OpsError

TRACE_KEYS = ("prompt_tokens", "output_tokens")
MAX_TRACE_LINES = 100_000
_SHAPE = '{"prompt_tokens": int, "output_tokens": int}'


@dataclass(frozen=True)
class Workload:
    contexts: tuple[int, ...] = ()
    clients: tuple[int, ...] = ()
    output_tokens: int = 256
    trace: tuple[tuple[int, int], ...] = ()  # (prompt tokens, output tokens) per request
    trace_path: str | None = None

    @property
    def cells(self) -> int:
        if self.trace:  # one cell per clients level the trace is replayed at
            return max(len(self.clients), 1)
        return len(self.contexts) * len(self.clients)

    def describe(self) -> str:
        if self.trace:
            at = f" x clients {','.join(map(str, self.clients))}" if self.clients else ""
            return f"trace {self.trace_path} ({len(self.trace)} requests){at}"
        return (f"contexts {','.join(map(str, self.contexts))} x clients "
                f"{','.join(map(str, self.clients))}, {self.output_tokens} output tokens")

    def to_json(self) -> dict[str, object]:
        return {"contexts": list(self.contexts), "clients": list(self.clients),
                "output_tokens": self.output_tokens, "trace": [list(t) for t in self.trace]}


def read_trace(path: Path, max_model_len: int) -> tuple[tuple[int, int], ...]:
    """The trace's requests; OpsError (exit 2) naming the file, the line and the rule for the
    first line that is not {"prompt_tokens": int, "output_tokens": int} within max_model_len."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OpsError(f"--trace {path}: cannot be read ({exc})", exit_code=EXIT_USAGE) from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"--trace {path} line {n}"
        try:
            doc = json.loads(line)
        except ValueError:
            raise OpsError(f"{where}: not JSON; each line is {_SHAPE}",
                           exit_code=EXIT_USAGE) from None
        if not isinstance(doc, dict) or set(doc) != set(TRACE_KEYS):
            raise OpsError(f"{where}: must be exactly {_SHAPE}", exit_code=EXIT_USAGE)
        p, o = doc["prompt_tokens"], doc["output_tokens"]
        if any(type(x) is not int for x in (p, o)) or p < 1 or o < 1:
            raise OpsError(f"{where}: prompt_tokens and output_tokens must be integers >= 1",
                           exit_code=EXIT_USAGE)
        if p + o > max_model_len:
            raise OpsError(f"{where}: {p} + {o} tokens exceed vllm.max_model_len = "
                           f"{max_model_len}", exit_code=EXIT_USAGE)
        out.append((p, o))
        if len(out) > MAX_TRACE_LINES:
            raise OpsError(f"{where}: more than {MAX_TRACE_LINES} requests",
                           exit_code=EXIT_USAGE)
    if not out:
        raise OpsError(f"--trace {path}: no requests; each line is {_SHAPE}",
                       exit_code=EXIT_USAGE)
    return tuple(out)
