"""The yardstick: a minimal hand-written aiohttp streaming client, ~50 lines.

What a careful engineer writes in ten minutes to time streamed chat completions: one session,
N concurrent POSTs, `iter_any()`, split on blank lines, json.loads each event, TTFT at the
first chunk with content, tokens from the usage chunk. No warm-up, no error handling beyond
what a crash reports. `bench/client --compare` runs it beside tpuserve's load generator.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp


async def one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, int]:
    """(TTFT in seconds, completion tokens) of one streamed request."""
    start = time.perf_counter()
    ttft = -1.0
    tokens = 0
    buf = b""
    async with session.post(url, data=body,
                            headers={"Content-Type": "application/json"}) as resp:
        async for data in resp.content.iter_any():
            now = time.perf_counter()
            buf += data
            *events, buf = buf.split(b"\n\n")
            for event in events:
                payload = event.removeprefix(b"data: ")
                if payload == b"[DONE]":
                    continue
                obj = json.loads(payload)
                choices = obj.get("choices")
                if choices and ttft < 0 and choices[0]["delta"].get("content"):
                    ttft = now - start
                if obj.get("usage"):
                    tokens = obj["usage"]["completion_tokens"]
    return ttft, tokens


async def run(url: str, body: bytes, streams: int, rounds: int = 1) -> list[tuple[float, int]]:
    """`streams` workers, each sending `rounds` requests back to back."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> list[tuple[float, int]]:
            return [await one(session, url, body) for _ in range(rounds)]

        results = await asyncio.gather(*(worker() for _ in range(streams)))
    return [r for rs in results for r in rs]
