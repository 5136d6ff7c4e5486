"""A bounded load generator for vLLM's OpenAI-compatible server: Poisson arrivals, streamed completions.

Each request goes to /v1/completions with token ids as its prompt (the server runs without a tokenizer),
streams its tokens back and is timed per chunk. A window sends a fixed list of requests at fixed arrival
times and ends when all have finished, or at its deadline (requests still open are cancelled and reported).
Every loop is bounded in count (the list) and time (per-request timeout, window deadline).

Times are seconds from the start of the window (arrival_s, sent_s, first_token_s, finish_s) or from the
request's send (chunk_s). One chunk may carry several tokens (speculative decoding emits the accepted ones
together), so inter-token latency is measured between chunks (as vLLM's own benchmark does).
"""
from __future__ import annotations

import asyncio
import json
import math
import time

import numpy as np


def arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Send times (s) of `n` requests with Poisson arrivals at `rate` per second, the first at 0."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=max(n - 1, 0))
    return [0.0] + np.cumsum(gaps).tolist()


def body(model: str, ids: list[int], max_tokens: int, temperature: float, ignore_eos: bool) -> dict:
    """The /v1/completions request of one prompt (token ids in, token ids back, streamed)."""
    return {"model": model, "prompt": list(ids), "max_tokens": int(max_tokens), "temperature": float(temperature),
            "ignore_eos": bool(ignore_eos), "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}


async def _one(session, url: str, req: dict, send_at: float, t0: float, timeout_s: float) -> dict:
    import aiohttp

    await asyncio.sleep(max(0.0, t0 + send_at - time.perf_counter()))
    sent = time.perf_counter()
    row = {"arrival_s": send_at, "sent_s": sent - t0, "first_token_s": math.nan, "finish_s": math.nan,
           "new_tokens": 0, "chunk_s": [], "chunk_tokens": [], "output_ids": [], "error": ""}
    try:
        async with session.post(url + "/v1/completions", json=req,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                row["error"] = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return row
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                choices = json.loads(data).get("choices") or []
                ids = list(choices[0].get("token_ids") or []) if choices else []
                if ids:
                    now = time.perf_counter()
                    row["chunk_s"].append(now - sent)
                    row["chunk_tokens"].append(len(ids))
                    row["output_ids"] += ids
    except asyncio.TimeoutError:
        row["error"] = f"timeout after {timeout_s:g} s (serving.request_timeout_s)"
    except aiohttp.ClientError as e:
        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    end = time.perf_counter()
    row["new_tokens"] = len(row["output_ids"])
    if row["chunk_s"]:
        row["first_token_s"] = row["sent_s"] + row["chunk_s"][0]
    row["finish_s"] = end - t0
    return row


async def _window(url: str, reqs: list[dict], send_at: list[float], timeout_s: float, deadline_s: float):
    import aiohttp

    conn = aiohttp.TCPConnector(limit=0)  # no client-side cap: the server's max_num_seqs is the only one
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(_one(session, url, r, s, t0, timeout_s)) for r, s in zip(reqs, send_at)]
        done, open_ = await asyncio.wait(tasks, timeout=deadline_s)
        for t in open_:
            t.cancel()
        rows = []
        for i, t in enumerate(tasks):
            if t in done and not t.cancelled() and t.exception() is None:
                rows.append(t.result())
            else:
                rows.append({"arrival_s": send_at[i], "sent_s": math.nan, "first_token_s": math.nan,
                             "finish_s": math.nan, "new_tokens": 0, "chunk_s": [], "chunk_tokens": [],
                             "output_ids": [], "error": (f"window deadline of {deadline_s:g} s passed "
                                                         f"(serving.window_timeout_s)" if t in open_
                                                         else f"client error: {t.exception()!r}"[:200])})
        if open_:
            await asyncio.gather(*open_, return_exceptions=True)
        return rows


def run_window(url: str, reqs: list[dict], send_at: list[float], timeout_s: float, deadline_s: float) -> list[dict]:
    """Send `reqs` (request bodies) at `send_at` (s from now) to the server at `url`; one row per request
    (module docstring). Requests that fail carry a non-empty `error`."""
    return asyncio.run(_window(url, reqs, send_at, timeout_s, deadline_s))


def derived(row: dict) -> dict:
    """Per-request latencies (s): ttft_s (send -> first token), e2e_s (send -> last token), tpot_s (time per
    output token after the first), itl_s (gaps between chunks), late_s (send later than scheduled)."""
    chunks = list(row["chunk_s"])
    n = row["new_tokens"]
    ttft = chunks[0] if chunks else math.nan
    e2e = chunks[-1] if chunks else math.nan
    return {"ttft_s": ttft, "e2e_s": e2e, "tpot_s": (e2e - ttft) / (n - 1) if n > 1 else math.nan,
            "itl_s": np.diff(chunks).tolist(), "late_s": row["sent_s"] - row["arrival_s"]}
