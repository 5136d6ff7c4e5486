"""Study "serving": vLLM's OpenAI-compatible server (continuous batching) under Poisson load, SD off and on.

A cell (mode serve) is one server configuration (k, proposer, batch = its max_num_seqs) at one request rate.
Under `timing.paired` an SD cell is measured against a no-SD server kept alive beside it: pair p sends the
same `serving.requests` prompts at the same Poisson arrival times (seed + p) first to one server, then to the
other, the order alternating from pair to pair (pairing.order); the machine's drift is then shared by both
arms of a pair. Servers run on 127.0.0.1 (server.py), one client drives them (loadgen.py); every server is
stopped when measure returns, fails or is interrupted (Ctrl-C, SIGTERM).

Raw run (data/raw/<profile>/serving/<cell-id>-vllm-<hash>/), meta.json written last:
  requests.parquet  one row per request: arm (cell | base), pair, window, rid, prompt_set, prompt_idx,
                    prompt_tokens, new_tokens, arrival_s / sent_s / first_token_s / finish_s (s from the
                    window's start), ttft_s, tpot_s, e2e_s, late_s (s), itl_s / chunk_s (lists, s),
                    chunk_tokens, output_ids (lists), error ("" when it completed)
  windows.parquet   one row per load window: arm, pair, window, rate, requests, completed, tokens,
                    duration_s (window start to its last token), tok_s, req_s, spec-decode counter
                    deltas of the loaded server (num_drafts, num_draft_tokens, num_accepted_tokens,
                    accepted_per_pos), generation_tokens, preemptions
  acceptance.json   the cell arm's spec-decode counters over its windows (vllm_runner.acceptance_summary)
  server-<arm>.log  each server's output up to the end of the cell
A failed request, a server that dies or stops answering, or a window past its deadline ends the run with one
line; its folder stays partial (no meta.json) and is set aside by the next measure.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
from types import SimpleNamespace

import pandas as pd

from .. import paths
from ..data import config as cfgmod
from ..data import hardware, models, rawdata
from ..data.spec import Study
from ..errors import SpecdecError
from . import loadgen, pairing, probe, vllm_runner
from .plan import plan
from .server import Server

GEN_TOKENS, PREEMPTIONS = "vllm:generation_tokens", "vllm:num_preemptions"


def server_kwargs(st: Study, cell: dict, resolve: bool = False) -> dict:
    """The server's engine arguments for a cell: vllm_runner.llm_kwargs with max_num_seqs = the cell's batch."""
    if cell.get("mode") != "serve":
        raise SpecdecError(f"the serving study runs serve cells only, not mode '{cell.get('mode')}'")
    return vllm_runner.llm_kwargs(st, cell, resolve=resolve)


def _paired(st: Study, cell: dict) -> bool:
    return bool(st.timing.paired) and cell["k"] > 0


def _counters(metrics: list[dict]) -> dict:
    """Spec-decode counters, generated tokens and preemptions of a /metrics snapshot (cumulative)."""
    objs = [SimpleNamespace(name=m["name"], value=m["value"], labels=m["labels"]) for m in metrics]
    out = vllm_runner.spec_counters(objs)

    def total(name):
        return sum(m["value"] for m in metrics if m["name"] in (name, name + "_total"))
    out.update(generation_tokens=total(GEN_TOKENS), preemptions=total(PREEMPTIONS))
    return out


def _delta(after: dict, before: dict) -> dict:
    out = vllm_runner.counters_delta(after, before)
    for key in ("generation_tokens", "preemptions"):
        out[key] = after[key] - before[key]
    return out


def _requests(st: Study, cell: dict, pair: int, plist: list[dict]) -> tuple[list[dict], list[float]]:
    """The prompts and send times (s) of pair `pair`: serving.requests prompts taken in turn from the prompt
    list, Poisson arrivals at the cell's rate seeded by seed + pair (the same for both arms)."""
    n = st.serving.requests
    chosen = [plist[(pair * n + i) % len(plist)] for i in range(n)]
    return chosen, loadgen.arrivals(n, float(cell["rate"]), st.seed + pair)


def _bodies(st: Study, cell: dict, model: str, chosen: list[dict], max_tokens: int | None = None) -> list[dict]:
    gen = st.generation
    return [loadgen.body(model, p["ids"], max_tokens or gen.max_new_tokens, cell["temperature"], gen.ignore_eos)
            for p in chosen]


def warm(server: Server, st: Study, cell: dict, plist: list[dict]) -> None:
    """serving.warmup_requests short requests, one at a time (untimed): first-request costs off the clock."""
    for i in range(st.serving.warmup_requests):
        rows = loadgen.run_window(server.url, _bodies(st, cell, server.kwargs["model"], [plist[i % len(plist)]],
                                                      max_tokens=4), [0.0], st.serving.request_timeout_s,
                                  st.serving.window_timeout_s)
        if rows[0]["error"]:
            raise SpecdecError(f"warm-up request to {server.url} failed: {rows[0]['error']} (log: {server.log})")


def _check_alive(server: Server, arm: str, when: str) -> None:
    """A one-line SpecdecError naming the server's last error and log if its process has exited."""
    if not server.alive():
        raise SpecdecError(f"vLLM server ({arm} arm) died {when}: {server.last_error()} (log: {server.log})")


def window(server: Server, arm: str, st: Study, cell: dict, pair: int, idx: int, plist: list[dict]):
    """One load window on one server: (request rows, window row). A dead server or a failed request is a
    one-line SpecdecError."""
    chosen, send_at = _requests(st, cell, pair, plist)
    _check_alive(server, arm, f"before window {idx}")
    before = _counters(server.metrics())
    rows = loadgen.run_window(server.url, _bodies(st, cell, server.kwargs["model"], chosen), send_at,
                              st.serving.request_timeout_s, st.serving.window_timeout_s)
    _check_alive(server, arm, f"during window {idx}")
    failed = [r["error"] for r in rows if r["error"]]
    if failed:
        raise SpecdecError(f"{len(failed)} of {len(rows)} requests of window {idx} ({arm} arm) failed, first: "
                           f"{failed[0]}")
    d = _delta(_counters(server.metrics()), before)
    out = []
    for rid, (p, r) in enumerate(zip(chosen, rows)):
        out.append({"arm": arm, "pair": pair, "window": idx, "rid": rid, "prompt_set": p["prompt_set"],
                    "prompt_idx": p["prompt_idx"], "prompt_tokens": len(p["ids"]), **r, **loadgen.derived(r)})
    tokens = sum(r["new_tokens"] for r in rows)
    duration = max(r["finish_s"] for r in rows)
    row = {"arm": arm, "pair": pair, "window": idx, "rate": float(cell["rate"]), "requests": len(rows),
           "completed": sum(1 for r in rows if not r["error"]), "tokens": tokens, "duration_s": duration,
           "tok_s": tokens / duration, "req_s": len(rows) / duration,
           **{key: d[key] for key in vllm_runner.COUNTERS.values()},
           "accepted_per_pos": d["num_accepted_tokens_per_pos"], "generation_tokens": d["generation_tokens"],
           "preemptions": d["preemptions"]}
    return out, row, d


def _add(a: dict, b: dict) -> dict:
    """Counter sums of two windows (per-position lists padded to the longer)."""
    pa, pb = list(a["num_accepted_tokens_per_pos"]), list(b["num_accepted_tokens_per_pos"])
    n = max(len(pa), len(pb))
    pa, pb = pa + [0] * (n - len(pa)), pb + [0] * (n - len(pb))
    return {**{k: a[k] + b[k] for k in vllm_runner.COUNTERS.values()},
            "num_accepted_tokens_per_pos": [x + y for x, y in zip(pa, pb)]}


def run_cell(arms: "Arms", st: Study, cell: dict, plist: list[dict]):
    """Every window of a cell: (request rows, window rows, acceptance summary of the cell arm)."""
    reqs, wins = [], []
    total = {**dict.fromkeys(vllm_runner.COUNTERS.values(), 0), "num_accepted_tokens_per_pos": []}
    idx = 0
    for pair in range(st.serving.pairs):
        for arm in (pairing.order(pair) if "base" in arms.kwargs else ("cell",)):
            rows, row, d = window(arms.server(arm), arm, st, cell, pair, idx, plist)
            reqs += rows
            wins.append(row)
            idx += 1
            if arm == "cell":
                total = _add(total, d)
    counters = {k: total[k] for k in list(vllm_runner.COUNTERS.values()) + ["num_accepted_tokens_per_pos"]}
    return reqs, wins, vllm_runner.acceptance_summary(counters)


class Arms:
    """The servers of one cell, by arm, started when a window needs them (Servers.get): side by side (the base
    kept alive beside the cell's server) or, with serving.side_by_side false, one at a time (the other is
    stopped first; pairs in A B B A order then switch servers twice per cell). `used` lists every server
    (arm, Server) the cell ran on, in order, for its logs and meta.json."""

    def __init__(self, servers: "Servers", st: Study, cell: dict, plist: list[dict], kwargs: dict, base: dict | None):
        self.servers, self.st, self.cell, self.plist = servers, st, cell, plist
        self.kwargs = {"cell": kwargs, **({"base": base} if base is not None else {})}
        self.used: list = []

    def server(self, arm: str) -> Server:
        other = [vllm_runner.engine_key(kw) for a, kw in self.kwargs.items() if a != arm]
        srv = self.servers.get(self.kwargs[arm], keep=tuple(other) if self.st.serving.side_by_side else ())
        if not getattr(srv, "warmed", False):
            warm(srv, self.st, self.cell, self.plist)
            srv.warmed = True
        if not self.used or self.used[-1][1] is not srv:
            self.used.append((arm, srv))
        return srv


class Servers:
    """The servers of one measure run, at most two alive: the no-SD base (kept while cells pair with it) and
    the current cell's. Keys are their engine arguments; logs go to build/serving-logs/<profile>/."""

    def __init__(self, st: Study, profile: str):
        self.st, self.alive = st, {}
        self.logs = paths.build_root() / "serving-logs" / profile

    def get(self, kwargs: dict, keep: tuple = ()) -> Server:
        key = vllm_runner.engine_key(kwargs)
        if key not in self.alive:
            for old in [k for k in self.alive if k not in keep]:
                self.alive.pop(old).stop()
            st = self.st
            name = ("base" if not kwargs.get("speculative_config") else
                    f"{kwargs['speculative_config']['method']}-k{kwargs['speculative_config']['num_speculative_tokens']}")
            log = self.logs / f"{time.strftime('%Y%m%d-%H%M%S')}-bs{kwargs['max_num_seqs']}-{name}.log"
            srv = Server(kwargs, log, vllm_runner.engine_env(st), st.serving.port)
            self.alive[key] = srv
            srv.start_s = srv.start(st.serving.start_timeout_s)
        return self.alive[key]

    def close(self) -> None:
        for srv in self.alive.values():
            srv.stop()
        self.alive.clear()


def _copy_logs(used: list, folder) -> None:
    """Each server's log (up to now) into the run folder: server-<arm>.log, numbered when an arm restarted."""
    folder.mkdir(parents=True, exist_ok=True)
    seen: dict = {}
    for arm, srv in used:
        if srv.log.exists():
            n = seen[arm] = seen.get(arm, 0) + 1
            shutil.copyfile(srv.log, folder / (f"server-{arm}.log" if n == 1 else f"server-{arm}-{n}.log"))


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt  # unwinds through measure's finally: every server is stopped


def measure(study: str, profile: str, limit: int | None = None, dry_run: bool = False, echo=print,
            only: str | None = None) -> dict:
    """Run every missing serve cell of a study on this machine. Returns counts: cells, ran, pending."""
    p = plan(study, profile, "vllm server", limit, dry_run, echo, only, prepare=server_kwargs,
             check=vllm_runner._require_vllm)
    if p.done:
        return p.counts
    cfg, st, pending, counts, machine, hw = p.cfg, p.st, p.pending, p.counts, p.machine, p.hw
    runs = [(cell, folder, server_kwargs(st, cell, resolve=True),
             server_kwargs(st, {**cell, "k": 0, "proposer": "none"}, resolve=True) if _paired(st, cell) else None)
            for cell, folder, _ in pending]
    for _, _, kw, _ in runs:
        vllm_runner.check_model_folders(kw)
    keys = [vllm_runner.engine_key(kw) for _, _, kw, _ in runs]
    order = sorted(range(len(runs)), key=lambda i: (keys.index(keys[i]), i))  # cells sharing a server together
    plist = vllm_runner._tokenized_prompts(st)
    versions = rawdata.versions()
    rawdata.git_state()  # read now, before the first cell: the code this process imported
    servers = Servers(st, profile)
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        for i in order:
            cell, folder, kwargs, base_kwargs = runs[i]
            arms = Arms(servers, st, cell, plist, kwargs, base_kwargs)
            echo(f"{cfgmod.cell_id(cell)}: {st.serving.pairs} pair(s) of {st.serving.requests} requests at "
                 f"{cell['rate']:g}/s")
            started, load0 = time.strftime("%Y-%m-%dT%H:%M:%S%z"), os.getloadavg()
            before = probe.read_gbs()
            try:
                reqs, wins, acceptance = run_cell(arms, st, cell, plist)
            finally:
                _copy_logs(arms.used, folder)
            after = probe.read_gbs()
            (folder / "acceptance.json").write_text(json.dumps(acceptance, indent=2, sort_keys=True))
            meta = rawdata.run_meta(
                study, folder, profile, cell, cfg, machine, "vllm", hardware.device_for(hw), started, load0,
                versions, acceptance=acceptance, probe={"before": before, "after": after},
                **models.weights_of(st.pair),
                serving={"engine_args": arms.kwargs, "side_by_side": st.serving.side_by_side,
                         "servers": [{"arm": arm, "log": srv.log.name, "start_s": srv.start_s, "port": srv.port}
                                     for arm, srv in arms.used],
                         "env": vllm_runner.engine_env(st), "client": "specdec.engines.loadgen (aiohttp, streamed)"})
            rawdata.write_run(folder, {"requests": pd.DataFrame(reqs), "windows": pd.DataFrame(wins)}, meta)
            counts["ran"] += 1
    finally:
        signal.signal(signal.SIGTERM, old)
        servers.close()
    counts["pending"] -= counts["ran"]
    return counts


def fraction_same(a: list, b: list) -> float:
    """Share of requests whose output tokens are equal in two arms' rows (same rid order); NaN if none."""
    pairs = [(x, y) for x, y in zip(a, b) if len(x) and len(y)]
    return sum(list(x) == list(y) for x, y in pairs) / len(pairs) if pairs else math.nan
