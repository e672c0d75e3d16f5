"""[tune]: what `tpuserve tune STACK` may try and what it must respect.

Each set, when given, replaces the tuner's own set for that flag (list fewer values to restrict
it, more to extend it); unset, the tuner derives the set from the planner (tpuserve/tune/
candidates.py). Whatever is listed, a value the settings' validators or the planner refuse for
the stack is dropped with its reason, never tried. The constraint keys bound every measured
cell; the command's options of the same names win over them.
"""

# No `from __future__ import annotations` in a module of pydantic models: pydantic would
# evaluate every field's annotation from its string on each start (bench/cli).

from typing import Annotated, Any, Literal

from pydantic import Field

from tpuserve.settings.base import StrictModel

# A set of values to try: 1 to 16 of them (each one is a boot of the node).
_Set = Field(min_length=1, max_length=16)


class TuneSettings(StrictModel):
    """What `tpuserve tune` tries on the node and the constraints its choice must meet."""

    # vllm.max_num_batched_tokens values to try; unset: the powers of two from the model's
    # multimodal floor's bucket up to twice it.
    max_num_batched_tokens: Annotated[
        list[Annotated[int, Field(ge=16, le=1_048_576)]] | None, _Set] = None
    # vllm.max_num_seqs caps to try, "unset" for vLLM's own default; unset: ["unset", 128].
    max_num_seqs: Annotated[
        list[Annotated[int, Field(ge=1, le=4096)] | Literal["unset"]] | None, _Set] = None
    # vllm.max_model_len values to try; unset: the configured one doubling up to the longest
    # one request's KV holds and the model's max_position_embeddings allows (at most 4; just
    # the configured one and its double when the model's geometry does not state it).
    max_model_len: Annotated[
        list[Annotated[int, Field(ge=16, le=1_048_576)]] | None, _Set] = None
    # vllm.env.VLLM_TPU_BUCKET_PADDING_GAP values to try; unset: [0, 128].
    VLLM_TPU_BUCKET_PADDING_GAP: Annotated[
        list[Annotated[int, Field(ge=0, le=65536)]] | None, _Set] = None
    # vllm.env.NUM_PRECOMPILE_WORKERS values to try; unset: [1, 2, 4].
    NUM_PRECOMPILE_WORKERS: Annotated[
        list[Annotated[int, Field(ge=1, le=64)]] | None, _Set] = None
    # vllm.gpu_memory_utilization values to try; unset: 0.01 steps from the slice's ceiling up
    # to, not including, the lowest measured failure (0.92-0.94 on v5litepod-1, the two above
    # the ceiling tried with allow_untested_gpu_memory_utilization for that candidate only).
    gpu_memory_utilization: Annotated[
        list[Annotated[float, Field(gt=0.0, le=1.0)]] | None, _Set] = None
    # vllm.speculative_config tables to try, "off" for none; unset: "off" and n-gram
    # ({ method = "ngram", num_speculative_tokens = 4, prompt_lookup_max = 4 }), the latter
    # refused (and listed) unless the stack sets vllm.allow_untested_speculative_config: its
    # support on the pinned image is not proved. Each is checked as [vllm]'s is.
    speculative_config: Annotated[
        list[dict[str, Any] | Literal["off"]] | None, _Set] = None
    # The chosen config's p90 time to first token, in ms, in every measured cell.
    max_ttft_p90_ms: Annotated[float, Field(gt=0)] | None = None
    # The chosen config's median time per output token, in ms, in every measured cell.
    max_tpot_p50_ms: Annotated[float, Field(gt=0)] | None = None
    # The chosen config's per-stream output tok/s, in every measured cell.
    min_stream_tok_s: Annotated[float, Field(gt=0)] | None = None
