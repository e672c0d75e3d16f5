"""A fake OpenAI-compatible server (vLLM's shapes) on 127.0.0.1, fast enough to load-test a client.

Raw asyncio HTTP/1.1 (keep-alive, Content-Length bodies, chunked SSE) so one core streams
tens of thousands of tokens per second: `bench/client` uses it to prove the benchmark client
is never the bottleneck. Routes, as vLLM serves them behind the boot path's API-key proxy:

- GET /health (and HEAD): 200, never guarded.
- Everything else, as the proxy rules (templates/nginx.conf.j2): 401 without
  `Authorization: Bearer <api_key>` when `api_key` is set, unless the request is exactly
  GET/HEAD of the raw target /health (`open_paths` turns a guard off, to play vLLM without the
  proxy, whose --api-key guards only /v1). `leaky_health` plays the old proxy that matched the
  NORMALISED path: `/health?x`, `/metrics/../health`, `//health` then pass unauthenticated,
  to the routes vLLM would give them (its /metrics mount takes any path under /metrics).
- `tls`: an ssl.SSLContext to serve HTTPS with (the node's proxy terminates TLS).
- POST /v1/chat/completions: `stream` with SSE chunks, one token each, and with
  `stream_options.include_usage` a last chunk with empty `choices` and `usage`, then
  `data: [DONE]`; `tools` -> a `get_weather`-style tool call naming the first tool with JSON
  arguments `{"city": "Paris"}`; an `image_url` part must be a `data:image/png;base64,` URL
  holding a PNG; a prompt past `max_model_len - max_tokens` is refused with vLLM's 400.
- POST /tokenize: `{"model", "messages"}` or `{"model", "prompt"}` -> `{"count", "max_model_len",
  "tokens"}`. The fake's tokenizer: one token per whitespace-separated word, plus
  MESSAGE_OVERHEAD per message and TEMPLATE_OVERHEAD per prompt (a chat template's markers).

Failure modes for tests: `malformed` (a stream chunk that is not JSON, or a non-JSON body),
`close_after` (drop the connection mid-stream after N tokens), `omit_usage`, `no_tool_call`,
`no_tokenize` (404), `health_status`, `answer` (the chat reply text).

Run standalone: `python tests/fakes/openai_server.py --port 0 --itl-ms 2` prints its URL.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import posixpath
import re
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

MESSAGE_OVERHEAD = 4  # '<start_of_turn>user\n' ... '<end_of_turn>\n'
TEMPLATE_OVERHEAD = 3  # '<bos>' and the generation prompt
IMAGE_TOKENS = 256  # what one image costs in the fake's prompt count
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class FakeConfig:
    model: str = "google/gemma-4-E2B-it"
    max_model_len: int = 32768
    api_key: str | None = None
    open_paths: frozenset[str] = frozenset()  # paths served without the key even if api_key
    default_max_tokens: int = 16
    token_text: str = " tok"
    answer: str = "pong"  # non-streamed chat reply (an image request gets "The image is red.")
    ttft_s: float = 0.0  # delay before the first streamed token
    itl_s: float = 0.0  # delay between streamed tokens
    malformed: bool = False
    close_after: int | None = None  # stream: drop the connection after this many tokens
    omit_usage: bool = False
    no_tool_call: bool = False
    no_tokenize: bool = False
    health_status: int = 200
    leaky_health: bool = False  # the regression smoke's bypass probes must catch


@dataclass
class Recorded:
    method: str
    path: str
    authorized: bool
    body: dict[str, Any] | None


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class FakeOpenAIServer:
    """`with FakeOpenAIServer(FakeConfig(...)) as base_url:` serves on a background thread."""

    def __init__(self, config: FakeConfig | None = None, *, port: int = 0,
                 tls: ssl.SSLContext | None = None) -> None:
        self.config = config or FakeConfig()
        self.port = port
        self.tls = tls
        self.requests: list[Recorded] = []
        self.tokens_streamed = 0
        self.connections = 0  # TCP connections accepted (the load generator's warm-up shows)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._active: list[list[Any]] = []
        self._ticker: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        self._thread = threading.Thread(target=self._run, name="fake-openai", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("fake OpenAI server did not start")
        return self.base_url

    def stop(self) -> None:
        if self._loop and self._server and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        if self._thread:
            self._thread.join(10)

    async def _shutdown(self) -> None:
        """Close the listener and every open connection, then stop the loop."""
        assert self._server is not None and self._loop is not None
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop.stop()

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(self.serve())
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def serve(self) -> asyncio.Server:
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, backlog=512,
                                            ssl=self.tls)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _paced(self, w: asyncio.StreamWriter, token: bytes, n: int) -> None:
        """One token per stream per `itl_s` tick, written by one ticker for all streams: a
        timer per stream would make the fake, not the client, the bottleneck at 64 streams."""
        done = asyncio.get_running_loop().create_future()
        self._active.append([w, token, n, done])
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._tick())
        await done
        await w.drain()

    async def _tick(self) -> None:
        while self._active:
            await asyncio.sleep(self.config.itl_s)
            still = []
            for stream in self._active:
                w, token, left, done = stream
                if w.is_closing():  # the client went away: end its stream quietly
                    done.set_result(None)
                    continue
                w.write(token)
                self.tokens_streamed += 1
                stream[2] = left - 1
                if left > 1:
                    still.append(stream)
                else:
                    done.set_result(None)
            self._active = still

    # ------------------------------------------------------------------ HTTP
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    break
                keep = await self._dispatch(req, writer)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def _leaks(self, target: str) -> bool:
        """leaky_health: the old proxy left open whatever it normalised to /health."""
        if not self.config.leaky_health:
            return False
        path = posixpath.normpath(re.sub("/+", "/", unquote(target.split("?", 1)[0])))
        return path == "/health"

    def _authorized(self, req: _Request) -> bool:
        key = self.config.api_key
        return key is None or req.headers.get("authorization") == f"Bearer {key}"

    async def _dispatch(self, req: _Request, w: asyncio.StreamWriter) -> bool:
        body: dict[str, Any] | None = None
        if req.body:
            try:
                body = json.loads(req.body)
            except ValueError:
                body = None
        authorized = self._authorized(req)
        path = req.path.split("?", 1)[0]
        self.requests.append(Recorded(req.method, path, authorized, body))
        route = (req.method, path)
        exactly_health = req.method in ("GET", "HEAD") and req.path == "/health"
        if (self.config.api_key is not None and not authorized and not exactly_health
                and path not in self.config.open_paths and not self._leaks(req.path)):
            # The proxy's answer (vLLM's --api-key middleware answers 401 too).
            _json(w, 401, {"error": "Unauthorized"})
            return True
        if route in (("GET", "/health"), ("HEAD", "/health")):
            _respond(w, self.config.health_status, b"", "text/plain")
            return True
        if path.startswith("/metrics/"):  # vLLM's prometheus mount answers under it
            route = ("GET", "/metrics") if req.method == "GET" else route
        known = {
            ("GET", "/metrics"),
            ("GET", "/v1/models"),
            ("POST", "/tokenize"),
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/completions"),
        }
        if route not in known:
            _json(w, 404, {"detail": "Not Found"})
            return True
        if not authorized and path not in self.config.open_paths:
            # The shape vLLM's --api-key middleware answers with (the proxy answers 401 too).
            _json(w, 401, {"error": "Unauthorized"})
            return True
        if req.body and body is None:
            _json(w, 400, _error("request body is not JSON"))
            return True
        if route == ("GET", "/metrics"):
            _respond(w, 200, b"# HELP vllm:num_requests_running fake\n", "text/plain")
        elif route == ("GET", "/v1/models"):
            _json(w, 200, self._models())
        elif route == ("POST", "/tokenize"):
            self._tokenize(w, body or {})
        elif route == ("POST", "/v1/completions"):
            # SPEC 1: raw completions answer an empty string on -it models.
            _json(w, 200, {"object": "text_completion", "choices": [{"text": ""}]})
        else:
            return await self._chat(w, body or {})
        return True

    def _models(self) -> dict[str, Any]:
        card = {
            "id": self.config.model,
            "object": "model",
            "created": 0,
            "owned_by": "vllm",
            "root": self.config.model,
            "max_model_len": self.config.max_model_len,
        }
        return {"object": "list", "data": [card]}

    def _tokenize(self, w: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        if self.config.no_tokenize:
            _json(w, 404, {"detail": "Not Found"})
            return
        if "messages" in body:
            count = prompt_tokens(body["messages"])
        elif isinstance(body.get("prompt"), str):
            count = len(body["prompt"].split())
        else:
            _json(w, 400, _error("tokenize needs 'messages' or 'prompt'"))
            return
        out = {"count": count, "max_model_len": self.config.max_model_len, "tokens": [7] * count}
        _json(w, 200, out)

    async def _chat(self, w: asyncio.StreamWriter, body: dict[str, Any]) -> bool:
        cfg = self.config
        messages = body.get("messages")
        if body.get("model") != cfg.model:
            err = _error(f"The model `{body.get('model')}` does not exist.") | {"code": 404}
            _json(w, 404, err)
            return True
        if not isinstance(messages, list) or not messages:
            _json(w, 400, _error("messages must be a non-empty list"))
            return True
        try:
            n_prompt = prompt_tokens(messages)
        except ValueError as exc:
            _json(w, 400, _error(str(exc)))
            return True
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        max_tokens = max_tokens or cfg.default_max_tokens
        if n_prompt + max_tokens > cfg.max_model_len:
            msg = (
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"you requested {n_prompt + max_tokens} tokens ({n_prompt} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length."
            )
            _json(w, 400, _error(msg))
            return True
        tools = body.get("tools") or []
        if tools and body.get("tool_choice") != "none" and not cfg.no_tool_call:
            name = tools[0]["function"]["name"]
            return self._tool_call(w, body, name, n_prompt)
        if body.get("stream"):
            return await self._stream(w, body, n_prompt, max_tokens)
        if cfg.malformed:
            _respond(w, 200, b"<html>not json</html>", "application/json")
            return True
        has_image = any(_is_image(p) for m in messages for p in _parts(m))
        text = "The image is red." if has_image else cfg.answer
        message = {"role": "assistant", "content": text, "tool_calls": []}
        _json(w, 200, _completion(cfg.model, message, "stop", n_prompt, len(text.split())))
        return True

    def _tool_call(self, w: asyncio.StreamWriter, body: dict[str, Any], name: str, n: int) -> bool:
        args = "{not json" if self.config.malformed else json.dumps({"city": "Paris"})
        call = {"id": "chatcmpl-tool-1", "type": "function",
                "function": {"name": name, "arguments": args}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        _json(w, 200, _completion(self.config.model, message, "tool_calls", n, 12))
        return True

    async def _stream(
        self, w: asyncio.StreamWriter, body: dict[str, Any], n_prompt: int, max_tokens: int
    ) -> bool:
        cfg = self.config
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        w.write(head)
        created = int(time.time())
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": created,
                "model": cfg.model}
        role = base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]}
        w.write(_sse(role))
        token = _sse(base | {"choices": [{"index": 0, "delta": {"content": cfg.token_text},
                                          "logprobs": None, "finish_reason": None}]})
        if cfg.ttft_s:
            await asyncio.sleep(cfg.ttft_s)
        if cfg.itl_s and cfg.close_after is None and not cfg.malformed:
            await self._paced(w, token, max_tokens)
        else:
            for i in range(max_tokens):
                if cfg.close_after is not None and i >= cfg.close_after:
                    await w.drain()
                    w.transport.abort()  # mid-stream: no terminating chunk, no [DONE]
                    return False
                if cfg.malformed and i == 1:
                    w.write(_chunk(b'data: {"choices": [{"delta": \n\n'))
                else:
                    w.write(token)
                self.tokens_streamed += 1
                if i % 64 == 63:
                    await w.drain()
        finish = base | {"choices": [{"index": 0, "delta": {"content": ""}, "logprobs": None,
                                      "finish_reason": "length", "stop_reason": None}]}
        w.write(_sse(finish))
        if usage and not cfg.omit_usage:
            u = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + max_tokens,
                 "completion_tokens": max_tokens}
            w.write(_sse(base | {"choices": [], "usage": u}))
        w.write(_chunk(b"data: [DONE]\n\n"))
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True


# ---------------------------------------------------------------------- helpers


def _parts(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, list):
        return content
    return [] if content is None else [content]


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """The fake's tokenizer (see the module docstring). Raises ValueError on a bad image."""
    total = TEMPLATE_OVERHEAD
    for m in messages:
        total += MESSAGE_OVERHEAD
        for part in _parts(m):
            if isinstance(part, str):
                total += len(part.split())
            elif isinstance(part, dict) and part.get("type") == "text":
                total += len(str(part.get("text", "")).split())
            elif _is_image(part):
                _check_png_url(str((part.get("image_url") or {}).get("url", "")))
                total += IMAGE_TOKENS
            else:
                raise ValueError(f"unsupported content part {part!r:.80}")
    return total


def _check_png_url(url: str) -> None:
    prefix = "data:image/png;base64,"
    if not url.startswith(prefix):
        raise ValueError("image_url must be a data:image/png;base64 URL in this fake")
    data = base64.b64decode(url[len(prefix):], validate=True)
    if not data.startswith(PNG_SIGNATURE) or b"IHDR" not in data[:16] or b"IEND" not in data:
        raise ValueError("image_url does not hold a PNG")


def _completion(
    model: str, message: dict[str, Any], finish: str, n_prompt: int, n_out: int
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_out,
                  "completion_tokens": n_out},
    }


def _error(message: str) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": "BadRequestError", "param": None,
            "code": 400}


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(obj: dict[str, Any]) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            422: "Unprocessable Entity", 500: "Internal Server Error",
            503: "Service Unavailable"}


def _respond(w: asyncio.StreamWriter, status: int, payload: bytes, ctype: str) -> None:
    reason = _REASONS.get(status, "Status")
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    )
    w.write(head.encode() + payload)


def _json(w: asyncio.StreamWriter, status: int, obj: Any) -> None:
    _respond(w, status, json.dumps(obj).encode(), "application/json")


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    size = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(size) if size else b""
    return _Request(method, target, headers, body)


def main() -> None:
    p = argparse.ArgumentParser(description="fake OpenAI-compatible streaming server")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--itl-ms", type=float, default=0.0, help="delay between streamed tokens")
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--api-key", default=None)
    args = p.parse_args()
    cfg = dataclasses.replace(
        FakeConfig(), itl_s=args.itl_ms / 1000, ttft_s=args.ttft_ms / 1000, api_key=args.api_key
    )
    server = FakeOpenAIServer(cfg, port=args.port)

    async def run() -> None:
        await server.serve()
        print(server.base_url, flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    main()

