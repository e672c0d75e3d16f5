#!/usr/bin/env python3
"""The simulated vLLM container: what the fake docker runs for a vllm image when the `docker
run` caller's environment has FAKE_VLLM_SIM=<seed file> (tests/fakes/docker hands it the
container's spec: the real boot script's `vllm serve ARGS`, its -e variables, its mounts).

Boots on the timeline of response_model.boot (scaled by the seed file's `boot_scale`: wall
seconds per simulated second), printing the lines vLLM prints and the boot script watches
(SPEC 4: `Memory statistics`, `Init kv-cache`, `startup complete`), or dies with vLLM's error
line where the model says so. A cold boot fills the mounted compile cache with files named for
the program set; a boot that finds them loads them instead (warm). Then it serves on
--host/--port (127.0.0.1 only), as vLLM does without --api-key:

- GET/HEAD /health; GET /v1/models (the card with max_model_len); POST /tokenize (the fakes'
  tokenizer, tests/fakes/openai_server.py); GET /metrics (vLLM's Prometheus names);
- POST /v1/chat/completions, streamed (SSE, one token a chunk, usage last with
  stream_options.include_usage, then [DONE]) or not (a tool call naming the first tool with
  {"city": "Paris"}, "The image is red." for an image, else "pong": what smoke checks).
  Each request is paced by response_model.cell at the concurrency it finds (the most
  requests in flight between its arrival and its first token, so a burst arriving over
  some milliseconds counts whole): first token TTFT after arrival, then one token every
  TPOT, scaled by `serve_scale`, each x a 1%-cv noise factor; a request not told to
  ignore_eos stops at its answer's end. Tokens due together are written together (at most
  every 2 ms): the server is not the bottleneck at 64 streams.

Seed file (JSON): {"seed": int, "boot_scale": float, "serve_scale": float, "params": {...}}
(`params` overrides seeded fields by name, for a test that pins one).

Every boot is recorded, before its timeline starts, as one JSON line in the seed file's
record (`boot_record`: seed.boots.jsonl beside it): the config it read and the model's outcome,
so a test sees what the simulator was given to boot, not only what the tuner says it tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fakes import openai_server as oai  # noqa: E402 - after sys.path
from tests.sim import response_model as rm  # noqa: E402

MIN_WRITE_GAP_S = 0.002
CACHE_FILES = 6


def say(line: str) -> None:
    print(line, flush=True)


def load_seed(path: str) -> tuple[rm.Params, float, float]:
    doc = json.loads(Path(path).read_text())
    params = rm.Params.draw(int(doc["seed"]))
    overrides = doc.get("params") or {}
    if overrides:
        params = dataclasses.replace(params, **overrides)
    return params, float(doc.get("boot_scale", 0.001)), float(doc.get("serve_scale", 1.0))


def boot_record(seed_file: str | Path) -> Path:
    """Where the boots of SEED_FILE's simulator are recorded (tests read it: support.booted)."""
    seed = Path(seed_file)
    return seed.with_name(f"{seed.stem}.boots.jsonl")


def record_boot(seed_file: str, cfg: rm.Config, b: rm.Boot) -> None:
    line = json.dumps({"config": dataclasses.asdict(cfg), "warm": b.warm, "error": b.error},
                      sort_keys=True)
    with boot_record(seed_file).open("a", encoding="utf-8") as f:
        f.write(line + "\n")  # one write of one line: appends from two boots do not mix


def host_path(c: dict[str, Any], container_file: str) -> Path | None:
    for target, source in c["mounts"].items():
        if container_file == target:
            return Path(source)
        if container_file.startswith(target.rstrip("/") + "/"):
            return Path(source) / container_file[len(target.rstrip("/")) + 1:]
    return None


class Clock:
    """Simulated seconds since the container started, slept to in wall time x scale."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.t0 = time.monotonic()

    def at(self, sim_s: float) -> None:
        delay = self.t0 + sim_s * self.scale - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def check_token(c: dict[str, Any], env: dict[str, str], state: str) -> None:
    """vLLM reads the gated model's token from HF_TOKEN_PATH (as tests/fakes/docker's fake)."""
    token_file = host_path(c, env.get("HF_TOKEN_PATH", ""))
    ungated = c["fake"].get("FAKE_VLLM_UNGATED") == "1"
    ok = token_file is not None and token_file.is_file() and token_file.read_bytes().strip()
    if not ok and not ungated:
        say("ERROR [hub.py] 401 Client Error: Unauthorized. Access to model is restricted "
            "(gated repo): no token at HF_TOKEN_PATH")
        sys.exit(1)
    digest = hashlib.sha256(token_file.read_bytes()).hexdigest() if ok and token_file else "none"
    Path(state, "containers", f"{c['name']}.token-sha256").write_text(digest)


def run_boot(c: dict[str, Any], cfg: rm.Config, params: rm.Params, scale: float) -> None:
    """The boot's log lines on response_model.boot's timeline; exits 1 where it dies."""
    clock = Clock(scale)
    cache = host_path(c, "/root/.cache/vllm")
    programs = cache / "xla_cache" if cache else None
    names = [f"sim-{cfg.program_key()}-{i}.bin" for i in range(CACHE_FILES)]
    warm = programs is not None and all((programs / n).is_file() for n in names)
    b = rm.boot(cfg, params, warm=warm)
    record_boot(c["fake"]["FAKE_VLLM_SIM"], cfg, b)

    def die_at(t: float) -> None:
        clock.at(t)
        say(f"ERROR [core.py] {b.error}")
        sys.exit(1)

    if b.dies_s is not None and b.dies_s < 100:
        die_at(b.dies_s)
    clock.at(100)
    u = rm.utilization(cfg)
    cap = rm.HBM_VISIBLE * u / rm.GIB
    say(f"INFO [tpu_worker.py] Memory statistics | total_hbm_limit_gb=15.75GiB | "
        f"total_hbm_limit_cap_gb={cap:.2f}GiB | total_hbm_used_gb=8.97GiB | "
        f"total_hbm_avail_gb={cap - 8.97:.2f}GiB")
    if b.dies_s is not None and b.dies_s <= rm.PRE_S:
        die_at(b.dies_s)
    clock.at(rm.PRE_S)
    blocks, block = rm.kv_blocks(cfg), rm.block_size(cfg)
    say(f"INFO [kv_cache_manager.py] Init kv-cache | num_blocks={blocks} | block_size={block}")
    say(f"INFO [kv_cache_utils.py] GPU KV cache size: {blocks * block:,} tokens")
    say(f"INFO [kv_cache_utils.py] Maximum concurrency for {cfg.max_model_len:,} tokens per "
        f"request: {blocks * block / cfg.max_model_len:.2f}x")
    n = int(rm.programs(cfg))
    if warm:
        say(f"INFO [compilation.py] Loading {n} compiled programs from the cache")
    else:
        say(f"INFO [compilation.py] Compiling {n} XLA programs (no compile cache entries)")
    if b.dies_s is not None:
        clock.at(b.dies_s - 1)
        say("INFO [compilation.py] Loading jit_structured_decode_fn")
        die_at(b.dies_s)
    clock.at(rm.PRE_S + b.compile_s)
    if not warm and programs is not None:
        programs.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(names):
            (programs / name).write_bytes(os.urandom(1024 + 256 * i))
    say(f"INFO [compilation.py] Compilation finished in {b.compile_s:.1f} s (simulated)")
    clock.at(b.ready_s or 0)


class SimServer:
    """The OpenAI-compatible routes, each request paced by the response model."""

    def __init__(self, cfg: rm.Config, params: rm.Params, scale: float) -> None:
        self.cfg, self.params, self.scale = cfg, params, scale
        self.in_flight = 0
        self.generated = 0
        self.prompted = 0
        self.rng = random.Random(params.seed * 1_000_003 + 17)
        self._arrival = asyncio.Event()  # set (and replaced) at every chat request's arrival

    def noise(self) -> float:
        return max(0.5, self.rng.gauss(1.0, rm.NOISE_CV))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                req = await oai._read_request(reader)
                if req is None or not await self.dispatch(req, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def dispatch(self, req: Any, w: asyncio.StreamWriter) -> bool:
        path = req.path.split("?", 1)[0]
        route = (req.method, path)
        if route in (("GET", "/health"), ("HEAD", "/health")):
            oai._respond(w, 200, b"", "text/plain")
        elif req.method == "GET" and (path == "/metrics" or path.startswith("/metrics/")):
            oai._respond(w, 200, self.metrics().encode(), "text/plain; version=0.0.4")
        elif route == ("GET", "/v1/models"):
            card = {"id": self.cfg.model, "object": "model", "created": 0, "owned_by": "vllm",
                    "root": self.cfg.model, "max_model_len": self.cfg.max_model_len}
            oai._json(w, 200, {"object": "list", "data": [card]})
        elif route == ("POST", "/tokenize"):
            body = _body(req)
            if body is None or not isinstance(body.get("messages"), list):
                oai._json(w, 400, oai._error("tokenize needs 'messages'"))
            else:
                count = oai.prompt_tokens(body["messages"])
                oai._json(w, 200, {"count": count, "max_model_len": self.cfg.max_model_len,
                                   "tokens": [7] * count})
        elif route == ("POST", "/v1/chat/completions"):
            return await self.chat(w, _body(req))
        else:
            oai._json(w, 404, {"detail": "Not Found"})
        await w.drain()
        return True

    def metrics(self) -> str:
        m = f'model_name="{self.cfg.model}"'
        return (f"vllm:num_requests_running{{{m}}} {self.in_flight}\n"
                f"vllm:num_requests_waiting{{{m}}} 0\n"
                f"vllm:prompt_tokens_total{{{m}}} {self.prompted}\n"
                f"vllm:generation_tokens_total{{{m}}} {self.generated}\n"
                f'vllm:cache_config_info{{num_gpu_blocks="{rm.kv_blocks(self.cfg)}",'
                f'block_size="{rm.block_size(self.cfg)}"}} 1\n')

    async def chat(self, w: asyncio.StreamWriter, body: dict[str, Any] | None) -> bool:
        arrived = time.monotonic()
        if body is None or not isinstance(body.get("messages"), list) or not body["messages"]:
            oai._json(w, 400, oai._error("messages must be a non-empty list"))
            return True
        if body.get("model") != self.cfg.model:
            oai._json(w, 404, oai._error(f"The model `{body.get('model')}` does not exist."))
            return True
        try:
            n_prompt = oai.prompt_tokens(body["messages"])
        except ValueError as exc:
            oai._json(w, 400, oai._error(str(exc)))
            return True
        out = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if n_prompt + out > self.cfg.max_model_len:
            oai._json(w, 400, oai._error(
                f"This model's maximum context length is {self.cfg.max_model_len} tokens. "
                f"However, you requested {n_prompt + out} tokens ({n_prompt} in the messages, "
                f"{out} in the completion). Please reduce the length."))
            return True
        self.in_flight += 1
        self.prompted += n_prompt
        woken, self._arrival = self._arrival, asyncio.Event()
        woken.set()  # the requests waiting for their first token count this one
        try:
            first, tpot = await self.first_token(arrived, n_prompt, out)
            if body.get("stream"):
                return await self.stream(w, body, n_prompt, out, first, tpot)
            reply = self.answer(body, n_prompt)
            # It stops at its answer's end unless told to ignore the end of sequence.
            made = out if body.get("ignore_eos") else reply["usage"]["completion_tokens"]
            await asyncio.sleep(max(0.0, first + (made - 1) * tpot - time.monotonic()))
            self.generated += made
            oai._json(w, 200, reply)
            await w.drain()
            return True
        finally:
            self.in_flight -= 1

    async def first_token(self, arrived: float, n_prompt: int, out: int,
                          ) -> tuple[float, float]:
        """Wait until this request's first token is due; its TTFT follows the most requests
        in flight since it arrived (a burst that arrives over some milliseconds counts
        whole, as its prefills would share the chip), re-read at every arrival. Returns the
        first token's time and the request's TPOT (wall seconds)."""
        ttft_noise, tpot_noise = self.noise(), self.noise()
        peak = 0
        while True:
            peak = max(peak, self.in_flight)
            cell = rm.cell(self.cfg, self.params, n_prompt, peak, out)
            first = arrived + cell.ttft_ms / 1000 * ttft_noise * self.scale
            delay = first - time.monotonic()
            if delay <= 0:
                return first, cell.tpot_ms / 1000 * tpot_noise * self.scale
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrival.wait(), delay)

    def answer(self, body: dict[str, Any], n_prompt: int) -> dict[str, Any]:
        """A non-streamed reply, as tests/fakes/openai_server.py answers (what smoke checks):
        a tool call naming the first tool, an image described, else one word."""
        tools = body.get("tools") or []
        if tools and body.get("tool_choice") != "none":
            call = {"id": "chatcmpl-tool-1", "type": "function",
                    "function": {"name": tools[0]["function"]["name"],
                                 "arguments": json.dumps({"city": "Paris"})}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            return oai._completion(self.cfg.model, message, "tool_calls", n_prompt, 12)
        parts = [p for m in body["messages"] for p in oai._parts(m)]
        text = "The image is red." if any(oai._is_image(p) for p in parts) else "pong"
        message = {"role": "assistant", "content": text, "tool_calls": []}
        return oai._completion(self.cfg.model, message, "stop", n_prompt, len(text.split()))

    async def stream(self, w: asyncio.StreamWriter, body: dict[str, Any], n_prompt: int,
                     out: int, first: float, tpot: float) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")
        base = {"id": "chatcmpl-sim", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self.cfg.model}
        w.write(oai._sse(base | {"choices": [{"index": 0, "delta": {"role": "assistant",
                                                                     "content": ""},
                                               "logprobs": None, "finish_reason": None}]}))
        await w.drain()
        token = oai._sse(base | {"choices": [{"index": 0, "delta": {"content": " tok"},
                                              "logprobs": None, "finish_reason": None}]})
        sent = 0
        while sent < out:
            now = time.monotonic()
            due = out if now >= first + (out - 1) * tpot else (
                0 if now < first else int((now - first) / tpot) + 1)
            if due > sent:
                w.write(token * (due - sent))
                self.generated += due - sent
                sent = due
                await w.drain()
                if w.is_closing():
                    return False
            if sent < out:
                nxt = first + sent * tpot
                await asyncio.sleep(max(MIN_WRITE_GAP_S, nxt - time.monotonic()))
        w.write(oai._sse(base | {"choices": [{"index": 0, "delta": {"content": ""},
                                              "logprobs": None, "finish_reason": "length",
                                              "stop_reason": None}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + out,
                     "completion_tokens": out}
            w.write(oai._sse(base | {"choices": [], "usage": usage}))
        w.write(oai._chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await w.drain()
        return True


def _body(req: Any) -> dict[str, Any] | None:
    try:
        body = json.loads(req.body) if req.body else None
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def serve(server: SimServer, port: int) -> None:
    listener = await asyncio.start_server(server.handle, "127.0.0.1", port, backlog=512,
                                          reuse_address=True)
    async with listener:
        await listener.serve_forever()


def main(container_json: str) -> None:
    c = json.loads(Path(container_json).read_text())
    env = dict(e.split("=", 1) for e in c["env"])
    argv = c["cmd"]
    params, boot_scale, serve_scale = load_seed(c["fake"]["FAKE_VLLM_SIM"])
    cfg = rm.Config.parse(argv, env)
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 8000
    host = argv[argv.index("--host") + 1] if "--host" in argv else "0.0.0.0"
    say("INFO [api_server.py] vLLM API server version 0.26.1rc1.dev125+ga7a204cc6 (simulated)")
    say(f"INFO [api_server.py] non-default args: {' '.join(argv[2:])}")
    check_token(c, env, os.environ.get("FAKE_DOCKER_STATE", ""))
    run_boot(c, cfg, params, boot_scale)
    say("INFO:     Waiting for application startup.")
    say("INFO:     Application startup complete.")
    say(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
    asyncio.run(serve(SimServer(cfg, params, serve_scale), port))


if __name__ == "__main__":
    main(sys.argv[1])
