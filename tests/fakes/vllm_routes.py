"""A small upstream that routes the way vLLM's OpenAI server does, for the real-nginx tests.

vLLM serves a Starlette (FastAPI) app under uvicorn: routes on the percent-DECODED path that
uvicorn passes (no dot-segment resolution), `/v1/...`, `/tokenize`, `/docs`, `/health`, and
`Mount("/metrics", prometheus_client.make_asgi_app())`, which answers any path under /metrics.
`Recorder` wraps it and keeps, for every request that reaches it, the raw target it saw.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route

MODEL = "google/gemma-4-E2B-it"


async def _health(_: Request) -> Response:
    return Response(status_code=200)


async def _models(_: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "max_model_len": 32768}]})


async def _chat(_: Request) -> Response:
    return JSONResponse({"choices": [{"message": {"role": "assistant", "content": "pong"}}]})


async def _tokenize(_: Request) -> Response:
    return JSONResponse({"count": 3})


async def _docs(_: Request) -> Response:
    return PlainTextResponse("<html>docs</html>")


async def _metrics(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """prometheus_client's ASGI app answers every path it is mounted under."""
    await PlainTextResponse("vllm:num_requests_running 0\n")(scope, receive, send)


def vllm_like_app() -> Starlette:
    return Starlette(routes=[
        Route("/health", _health, methods=["GET"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/v1/chat/completions", _chat, methods=["POST"]),
        Route("/tokenize", _tokenize, methods=["POST"]),
        Route("/docs", _docs, methods=["GET"]),
        Route("/openapi.json", _docs, methods=["GET"]),
        Mount("/metrics", app=_metrics),
    ])


@dataclass(frozen=True)
class Seen:
    probe: str  # the client's X-Probe header
    method: str
    target: str  # raw path plus ?query, as the upstream received it
    authorization: str  # the Authorization header that reached it ("" when none)


class Recorder:
    """ASGI middleware: records every HTTP request that reaches the app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[Seen] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                       for k, v in scope["headers"]}
            target = scope["raw_path"].decode("latin-1")
            if scope["query_string"]:
                target += "?" + scope["query_string"].decode("latin-1")
            self.seen.append(Seen(headers.get("x-probe", ""), scope["method"], target,
                                  headers.get("authorization", "")))
        await self.app(scope, receive, send)

    def for_probe(self, probe: str) -> list[Seen]:
        return [s for s in self.seen if s.probe == probe]


class Upstream:
    """uvicorn serving Recorder(vllm_like_app()) on 127.0.0.1:`port` in a thread."""

    def __init__(self) -> None:
        self.recorder = Recorder(vllm_like_app())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(self.recorder, host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> Upstream:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the upstream did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
