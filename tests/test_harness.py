"""Raw-data harness: grid expansion, immutable run folders, resume, partial runs, one-line errors."""
import json
import subprocess
import sys

import pandas as pd
import pytest

from specdec.data import config, rawdata
from specdec.data.models import pair_spec
from specdec.engines import harness
from specdec.errors import SpecdecError


@pytest.fixture
def raw(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path / "raw"))
    return tmp_path / "raw"


def cli(*args, env=None):
    import os
    proc = subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


def test_cells_collapse_k0_and_are_unique():
    cfg = config.load_study("batch", "fixture")
    cells = config.cells(cfg)
    ids = [config.cell_id(c) for c in cells]
    assert len(ids) == len(set(ids))
    assert sum(c["k"] == 0 for c in cells) == len({c["batch"] for c in cells})  # one baseline per batch size
    assert all(c["proposer"] == "none" for c in cells if c["k"] == 0)


def test_profile_override_trims_grid():
    full, cpu = config.load_study("batch"), config.load_study("batch", "cpu")
    assert len(config.cells(full)) > len(config.cells(cpu))
    assert max(c["batch"] for c in config.cells(cpu)) <= max(c["batch"] for c in config.cells(full))
    assert cpu["pair"] == full["pair"]


def test_config_hash_ignores_grid_only():
    cfg = config.load_study("batch", "fixture")
    grown = dict(cfg, grid=[*cfg["grid"], {"batch": [16], "k": [0, 2]}])
    assert config.config_hash(cfg) == config.config_hash(grown)
    assert config.config_hash(cfg) != config.config_hash(dict(cfg, seed=1))


def test_measure_writes_immutable_runs_and_resumes(raw):
    first = harness.measure("hardware", "fixture", limit=2, echo=lambda *_: None)
    assert first["ran"] == 2
    done, partial = rawdata.scan("fixture", "hardware")
    assert len(done) == 2 and not partial
    meta = json.loads((done[0] / "meta.json").read_text())
    for key in ("hardware", "versions", "git", "config", "config_sha256", "command", "cell"):
        assert key in meta
    stamp = (done[0] / "meta.json").stat().st_mtime_ns
    second = harness.measure("hardware", "fixture", limit=1, echo=lambda *_: None)
    assert second["ran"] == 1 and second["cells"] == first["cells"]
    assert (done[0] / "meta.json").stat().st_mtime_ns == stamp  # finished runs untouched
    assert len(rawdata.scan("fixture", "hardware")[0]) == 3


def test_partial_run_is_reported_and_set_aside(raw):
    harness.measure("hardware", "fixture", limit=1, echo=lambda *_: None)
    done = rawdata.scan("fixture", "hardware")[0][0]
    (done / "meta.json").unlink()  # simulate an interrupted run
    warnings = []
    with pytest.raises(SpecdecError, match="no complete raw runs"):
        rawdata.load("hardware", "fixture", "forwards", warn=warnings.append)
    assert warnings and "partial" in warnings[0]
    msgs = []
    harness.measure("hardware", "fixture", limit=1, echo=msgs.append)
    assert any("set aside" in m for m in msgs)
    assert any(p.name.startswith(done.name + ".partial-") for p in done.parent.iterdir())
    assert rawdata.is_complete(done)


def test_corrupt_table_is_skipped(raw):
    harness.measure("hardware", "fixture", limit=2, echo=lambda *_: None)
    a, b = rawdata.scan("fixture", "hardware")[0]
    (a / "forwards.parquet").write_bytes(b"not parquet")
    warnings = []
    df = rawdata.load("hardware", "fixture", "forwards", warn=warnings.append)
    assert set(df["run_id"]) == {b.name} and "corrupt" in warnings[0]


def test_write_run_refuses_overwrite(raw):
    harness.measure("hardware", "fixture", limit=1, echo=lambda *_: None)
    done = rawdata.scan("fixture", "hardware")[0][0]
    with pytest.raises(SpecdecError, match="refusing to overwrite"):
        rawdata.write_run(done, {"forwards": pd.DataFrame()}, {})


def test_static_run_records_every_request_and_step(raw):
    harness.measure("batch", "fixture", limit=3, echo=lambda *_: None)
    req = rawdata.load("batch", "fixture", "requests")
    steps = rawdata.load("batch", "fixture", "steps")
    cfg = config.load_study("batch", "fixture")
    assert (req["new_tokens"] == cfg["generation"]["max_new_tokens"]).all()
    assert (steps[["draft_s", "verify_s", "other_s"]] >= 0).all().all()
    assert (req["finish_s"] >= req["first_token_s"]).all()


@pytest.mark.parametrize("args,msg", [
    (["measure", "--study", "nope", "--gpu", "fixture"], "unknown study"),
    (["measure", "--study", "batch", "--gpu", "tpu9"], "unknown hardware profile"),
    (["measure", "--study", "batch", "--gpu", "h100"], "needs a CUDA GPU"),
])
def test_cli_bad_input_is_one_line_exit_2(args, msg):
    code, _, err = cli(*args)
    assert code == 2
    assert msg in err and len(err.strip().splitlines()) == 1


def _study_file(tmp_path, text):
    (tmp_path / "configs" / "hardware").mkdir(parents=True)
    (tmp_path / "lib").mkdir()
    (tmp_path / "configs" / "hardware" / "fixture.yaml").write_text("name: fixture\nkind: cpu\nmatch: {cuda: false}\n")
    (tmp_path / "configs" / "bad.yaml").write_text(text)
    return {"SPECDEC_ROOT": str(tmp_path)}


@pytest.mark.parametrize("text,msg", [
    ("grid: {batch: [1], k: [-1]}", "k must be"),
    ("grid: {batch: [0], k: [1]}", "batch sizes must be"),
    ("grid: {batch: [1], k: [1], proposer: [oracle]}", "unknown proposer"),
    ("grid: [batch: 1, k: [", "not valid YAML"),
    ("pair: tiny", "needs a mapping with a 'grid'"),
])
def test_bad_config_is_one_line_exit_2(tmp_path, text, msg):
    code, _, err = cli("measure", "--study", "bad", "--gpu", "fixture", env=_study_file(tmp_path, text))
    assert code == 2, err
    assert msg in err and len(err.strip().splitlines()) == 1


def test_unknown_pair_and_missing_model_package(monkeypatch, tmp_path):
    with pytest.raises(SpecdecError, match="unknown model pair"):
        pair_spec("gpt-5/gpt-4")
    from specdec.data import models
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SpecdecError, match="is not installed"):
        models.assemble_gguf(models.QWEN_CODER_15B)
