"""Staged torch settings (`torch_next`, `measure --next`): re-measure under new engine settings without losing
the current cells until the new ones are promoted."""
import shutil

import pytest

from specdec import cli, paths
from specdec.data import config, rawdata
from specdec.data.spec import Study
from specdec.engines import harness
from specdec.errors import SpecdecError

STAGED = "    torch_next: {attention: gqa, verify: ragged}\n"


def _root(tmp_path, monkeypatch, text: str):
    """A root whose configs are the shipped ones with batch.yaml replaced by `text`; raw runs under tmp."""
    shutil.copytree(paths.configs(), tmp_path / "configs")
    (tmp_path / "configs" / "batch.yaml").write_text(text)
    monkeypatch.setenv("SPECDEC_ROOT", str(tmp_path))
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path / "raw"))
    rawdata._HASHES.clear()


def _staged_text() -> str:
    text = (paths.configs() / "batch.yaml").read_text()
    anchor = "    pair: tiny-vllm"
    assert text.count(anchor) == 1
    return text.replace(anchor, STAGED + anchor)


def test_staging_changes_no_hash_and_the_staged_view_is_the_promoted_config():
    # the shipped cpu config with a setting staged on top (kv: grow is set by no study; the shipped config may
    # stage nothing between promotions)
    cfg = dict(config.load_study("batch", "cpu"), torch_next={"kv": "grow"})
    assert cfg["torch"] and cfg["torch"].get("kv", "concat") != "grow"
    bare = {k: v for k, v in cfg.items() if k != "torch_next"}
    for engine in ("torch", "vllm"):
        assert config.config_hash(cfg, engine) == config.config_hash(bare, engine)
    promoted = dict(bare, torch={**cfg["torch"], **cfg["torch_next"]})
    view = config.next_view(cfg)
    assert "torch_next" not in view and view["torch"] == promoted["torch"]
    assert config.config_hash(view) == config.config_hash(promoted) != config.config_hash(cfg)
    assert config.config_hash(view, "vllm") == config.config_hash(cfg, "vllm")  # vLLM runs are unaffected
    st = Study.from_dict(cfg)
    assert st.torch_next == Study.from_dict(view).torch and st.torch_next != st.torch


def test_staged_timing_is_merged_into_timing_and_changes_the_torch_hash():
    # a profile only the torch engine measures can stage paired timing with its engine settings (as cpu-bf16's
    # were staged before their promotion): its config as it was, unpaired, with default torch settings
    cfg = config.load_study("batch", "cpu-bf16")
    cfg = {k: v for k, v in cfg.items() if k != "torch"}
    cfg = dict(cfg, timing={k: v for k, v in cfg["timing"].items() if k != "paired"},
               torch_next={"finished": "retire", "timing": {"paired": True}})
    assert not cfg["timing"].get("paired")
    view = config.next_view(cfg)
    assert view["timing"] == {**cfg["timing"], "paired": True} and view["torch"]["finished"] == "retire"
    assert "timing" not in view["torch"]
    only_timing = config.next_view(dict(cfg, torch_next={"timing": {"paired": True}}))
    assert only_timing["torch"] == {} and only_timing["timing"]["paired"] is True
    assert config.config_hash(only_timing) != config.config_hash(cfg)
    st = Study.from_dict(cfg)  # the timing key is no torch setting, and it is no unknown key either
    assert st.torch_next.finished == "retire" and not st.timing.paired
    assert Study.from_dict(view).timing.paired
    with pytest.raises(SpecdecError, match="torch_next.timing must be a mapping"):
        config.next_view(dict(cfg, torch_next={"timing": "paired"}))
    with pytest.raises(SpecdecError, match="changes nothing"):
        config.next_view(dict(cfg, torch_next={"timing": {"repeats": cfg["timing"]["repeats"]}}))


@pytest.mark.parametrize("staged, msg", [
    (None, "stages no torch_next"),
    ({"linear": "onednn"}, "changes nothing in torch"),
    ("gqa", "must be a mapping"),
])
def test_next_view_refuses_what_stages_nothing(staged, msg):
    cfg = dict(config.load_study("batch", "cpu"), torch_next=staged)
    with pytest.raises(SpecdecError, match=msg):
        config.next_view(cfg)


def test_a_bad_staged_value_is_a_one_line_error():
    cfg = dict(config.load_study("batch", "cpu"), torch_next={"attention": "flash"})
    with pytest.raises(SpecdecError, match="torch.attention must be one of"):
        Study.from_dict(cfg)
    with pytest.raises(SpecdecError, match="torch_next: unknown key"):
        Study.from_dict(dict(cfg, torch_next={"attn": "gqa"}))


def test_staged_runs_are_set_aside_until_promoted_then_current(tmp_path, monkeypatch):
    """One current run and two staged runs on the fixture: analysis keeps the current one and says the staged
    ones are set aside (not 'older config'); after promotion (torch_next's keys moved into torch) the staged
    runs are current under their own folder names and the old one is the older config."""
    text = _staged_text()
    _root(tmp_path, monkeypatch, text)
    quiet = lambda *_: None  # noqa: E731
    assert harness.measure("batch", "fixture", only="bs1-k0-*", echo=quiet)["ran"] == 1
    res = harness.measure("batch", "fixture", only="bs1-k0-*,bs1-k2-ngram-*", echo=quiet, staged=True)
    assert res["ran"] == 2
    staged_hash = config.config_hash(config.next_view(config.load_study("batch", "fixture")))
    folders = sorted(p.name for p in (tmp_path / "raw" / "fixture" / "batch").iterdir())
    assert sum(name.endswith(staged_hash[:8]) for name in folders) == 2 and len(folders) == 3
    msgs = []
    runs = rawdata.current_runs("batch", "fixture", warn=msgs.append)
    assert [m["cell"]["k"] for _, m in runs] == [0]
    assert msgs == ["set aside 2 run(s) of batch/fixture measured under the staged torch_next (current once it "
                    "is promoted into torch)"]
    again = harness.measure("batch", "fixture", only="bs1-k0-*,bs1-k2-ngram-*", echo=quiet, staged=True)
    assert again["ran"] == 0  # staged sweeps resume like any other
    cells = len(config.cells(config.load_study("batch", "fixture")))
    assert rawdata.staged_progress("batch", "fixture") == (2, cells)
    assert rawdata.staged_progress("hardware", "fixture") is None
    promoted = text.replace(STAGED, "    torch: {attention: gqa, verify: ragged}\n")
    (tmp_path / "configs" / "batch.yaml").write_text(promoted)
    rawdata._HASHES.clear()
    msgs.clear()
    runs = rawdata.current_runs("batch", "fixture", warn=msgs.append)
    assert sorted(m["config"]["torch"]["attention"] for _, m in runs) == ["gqa", "gqa"]
    assert all(m["config_sha256"] == staged_hash for _, m in runs)
    assert msgs == ["ignored 1 run(s) of batch/fixture measured under an older config"]
    assert rawdata.staged_progress("batch", "fixture") is None  # nothing staged any more


def test_next_on_a_study_that_stages_nothing_or_for_vllm_is_one_line(capsys):
    for args, msg in ((["--study", "hardware"], "stages no torch_next"),
                      (["--study", "batch", "--engine", "vllm"], "--next is a torch-engine option")):
        with pytest.raises(SystemExit) as e:
            cli.main(["measure", "--gpu", "fixture", "--next", "--dry-run", *args])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and msg in err and "\n" not in err


def test_the_preview_reads_staged_runs_as_current(tmp_path, monkeypatch):
    """SPECDEC_STAGED=1: analysis takes the staged runs as the torch engine's current ones (the promotion
    previewed on what exists), without touching the config."""
    _root(tmp_path, monkeypatch, _staged_text())
    quiet = lambda *_: None  # noqa: E731
    harness.measure("batch", "fixture", only="bs1-k0-*", echo=quiet)
    harness.measure("batch", "fixture", only="bs1-k0-*", echo=quiet, staged=True)
    from specdec.data import tables
    plain = tables.signature("fixture", "batch")
    monkeypatch.setenv(rawdata.PREVIEW_ENV, "1")
    assert tables.signature("fixture", "batch")[:2] == plain[:2]  # the same runs ...
    assert tables.signature("fixture", "batch")[2] != plain[2]  # ... another selection: tables are rebuilt
    msgs = []
    runs = rawdata.current_runs("batch", "fixture", warn=msgs.append)
    assert [m["config"]["torch"] for _, m in runs] == [{"attention": "gqa", "verify": "ragged"}]
    assert msgs == ["ignored 1 run(s) of batch/fixture measured under an older config"]
    monkeypatch.setenv(rawdata.PREVIEW_ENV, "0")
    assert [m["config"].get("torch") for _, m in rawdata.current_runs("batch", "fixture", warn=quiet)] == [None]
