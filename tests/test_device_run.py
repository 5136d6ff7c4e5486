"""The one-call device run (issue 15), on this CPU with tiny shapes: the h200 sections of configs/hardware.yaml
and configs/batch.yaml, with the pair swapped for synthetic:tiny and the grids shrunk, run through the same
command (`specdec device-run`); the archive it packs is unpacked into another tree and read back."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile

import pandas as pd
import pytest
import yaml

from specdec import paths
from specdec.data import traces
from specdec.data.spec import Study

PROFILE = "ci-device"
SHRINK = {"batch": lambda v: [b for b in v if b <= 2] or v[:1], "context": lambda v: [16],
          "k": lambda v: [k for k in v if k in (0, 3)]}


def _ci_section(section: dict) -> dict:
    out = dict(section, pair="synthetic:tiny", dtype="float32")
    out["grid"] = [{key: SHRINK.get(key, lambda v: v)(vals) for key, vals in g.items()} for g in section["grid"]]
    if "prompts" in out:
        out["prompts"] = dict(out["prompts"], max_prompt_tokens=24)
    if "generation" in out:
        out["generation"] = dict(out["generation"], max_new_tokens=10)
    return out


def _tree(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(paths.configs(), root / "configs")
    shutil.copytree(paths.root() / "data" / "traces", root / "data" / "traces")
    (root / "lib" / "specdec").mkdir(parents=True)
    (root / "configs" / "hardware" / f"{PROFILE}.yaml").write_text(yaml.safe_dump(
        {"name": PROFILE, "kind": "cpu", "match": {"cuda": False}, "description": "CI: the device run on a CPU",
         "peak_tflops": None, "mem_bw_tbs": None, "source": "test"}))
    for study in ("hardware", "batch"):
        path = root / "configs" / f"{study}.yaml"
        cfg = yaml.safe_load(path.read_text())
        cfg["profiles"][PROFILE] = _ci_section(cfg["profiles"]["h200"])
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return root


def _specdec(root, *args, raw=None):
    env = dict(os.environ, SPECDEC_ROOT=str(root), SPECDEC_COMMIT="0" * 40, SPECDEC_BUILD=str(root / "build"))
    if raw:
        env["SPECDEC_RAW"] = str(raw)
    return subprocess.run([sys.executable, "-m", "specdec", *args], env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def device_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("device")
    root = _tree(tmp)
    out = tmp / "out"
    res = _specdec(root, "device-run", "--gpu", PROFILE, "--out", str(out), "--budget-s", "600")
    assert res.returncode == 0, res.stderr[-3000:]
    return root, out, res


def test_the_run_packs_every_cell_of_both_studies(device_run):
    root, out, _ = device_run
    report = json.loads((out / f"{PROFILE}-device-run.json").read_text())
    assert {s: r["pending"] for s, r in report["studies"].items()} == {"hardware": 0, "batch": 0}
    with tarfile.open(out / f"{PROFILE}-runs.tar.gz") as tar:
        metas = [m.name for m in tar.getmembers() if m.name.endswith("meta.json")]
    assert len(metas) == report["runs"] == sum(r["ran"] for r in report["studies"].values())
    assert all(m.startswith(f"{PROFILE}/") for m in metas)
    assert len(os.listdir(out)) <= 8  # the device tool brings back at most 8 files


def test_unpacked_runs_have_the_raw_schema_and_say_what_they_are(device_run, tmp_path):
    root, out, _ = device_run
    raw = tmp_path / "raw"
    res = _specdec(root, "device-unpack", str(out / f"{PROFILE}-runs.tar.gz"), raw=raw)
    assert res.returncode == 0, res.stderr
    runs = {p.parent.name: (p.parent, json.loads(p.read_text())) for p in raw.glob(f"{PROFILE}/*/*/meta.json")}
    fwd = [m for n, (_, m) in runs.items() if n.startswith(("fwd-", "off-"))]
    gen = [m for n, (_, m) in runs.items() if n.startswith("bs")]
    assert fwd and gen
    for m in fwd + gen:
        assert m["weights"] == "synthetic" and m["git"]["commit"] == "0" * 40
    for folder, m in runs.values():
        if m["cell"]["mode"] == "offload":
            f = pd.read_parquet(folder / "forwards.parquet")
            assert set(f["model"]) == {"target-offload"} and (f["seconds"] > 0).all()
        elif m["cell"]["mode"] == "forward":
            f = pd.read_parquet(folder / "forwards.parquet")
            assert set(f["model"]) == {"target", "draft"}
            assert set(f.columns) >= {"repeat", "batch", "query", "context", "tokens", "seconds"}
        else:
            assert m["acceptance_trace"] == f"llama3.1-8b-h100/{m['cell']['trace']}"
            assert m["shapes"] == ["llama-tiny-shape", "llama-tiny-head"]
            b = pd.read_parquet(folder / "batches.parquet")
            assert len(b) >= 5 and (b["decode_s"] > 0).all()
    # the tables step reads them (the same normalisation as every other profile)
    res = _specdec(root, "tables", "--gpu", PROFILE, raw=raw)
    assert res.returncode == 0, res.stderr


def test_replayed_cells_accept_what_the_trace_says(device_run, tmp_path):
    root, out, _ = device_run
    raw = tmp_path / "raw"
    assert _specdec(root, "device-unpack", str(out / f"{PROFILE}-runs.tar.gz"), raw=raw).returncode == 0
    checked = 0
    for meta in raw.glob(f"{PROFILE}/batch/bs*-k3-*/meta.json"):
        m = json.loads(meta.read_text())
        steps = pd.read_parquet(meta.parent / "steps.parquet")
        reqs = pd.read_parquet(meta.parent / "requests.parquet")
        which = "ngram" if m["cell"]["proposer"] == "ngram" else "eagle"
        by_id = {r.id: r.acc_len for r in traces.load("llama3.1-8b-h100", m["cell"]["trace"], which).requests}
        plist = [p for p in __import__("specdec.engines.harness", fromlist=["x"]).trace_prompts(
            Study.from_dict(m["config"]), 512, m["cell"]["trace"])]
        for (rep, bi), g in steps.groupby(["repeat", "batch_idx"]):
            rq = reqs[(reqs["repeat"] == rep) & (reqs["batch_idx"] == bi)].sort_values("rid")
            for i, (_, r) in enumerate(rq.iterrows()):
                acc = by_id[plist[int(r["prompt_idx"])]["trace_id"]]
                want = [e - 1 for e in traces.steps(acc, 3)[1]]
                got = [a[i] for a, act in zip(g["accepted"], g["active"]) if act[i]]
                assert got == want[:len(got)] and sum(x + 1 for x in got) >= m["config"]["generation"]["max_new_tokens"] - 1
                checked += 1
    assert checked >= 6


def test_unpacking_twice_adds_nothing_and_a_conflict_is_refused(device_run, tmp_path):
    root, out, _ = device_run
    raw, archive = tmp_path / "raw", str(out / f"{PROFILE}-runs.tar.gz")
    first = _specdec(root, "device-unpack", archive, raw=raw)
    again = _specdec(root, "device-unpack", archive, raw=raw)
    assert first.returncode == again.returncode == 0 and again.stdout.strip().endswith("0 new run(s)")
    meta = next(raw.glob(f"{PROFILE}/hardware/*/meta.json"))
    meta.write_text(meta.read_text().replace('"synthetic"', '"edited"'))
    res = _specdec(root, "device-unpack", archive, raw=raw)
    assert res.returncode == 2 and "differs" in res.stderr and len(res.stderr.strip().splitlines()) == 1
