"""Typed study configs: defaults in one place, misspelt keys refused, the cell arithmetic both engines use."""
import pytest

from specdec.data import config
from specdec.data.spec import Cell, Study
from specdec.errors import SpecdecError


def test_misspelt_keys_are_one_line_errors():
    cfg = config.load_study("batch", "cpu")
    cfg["generation"] = {**cfg["generation"], "max_new_token": 8}
    with pytest.raises(SpecdecError, match="generation: unknown key.*max_new_token") as e:
        Study.from_dict(cfg)
    assert "\n" not in str(e.value)
    with pytest.raises(SpecdecError, match="unknown key.*repeat"):
        Study.from_dict({**config.load_study("batch", "cpu"), "timing": {"repeat": 3}})


def test_shipped_configs_read_as_typed():
    st = Study.from_dict(config.load_study("batch", "cpu-bf16"))
    assert (st.dtype, st.draft_dtype, st.draft_quant) == ("bfloat16", "float32", "int8")
    assert st.timing.min_timed_batches == 5 and st.generation.ngram_match == "latest"
    assert Study.from_dict(config.load_study("bench", "cpu")).protocol == 2


@pytest.mark.parametrize("batch,requests,min_requests,repeats,min_batches,n_req,timed", [
    (4, None, 6, 1, 5, 8, 3),    # 6 requests -> two whole batches of 4 per pass; 3 passes give >= 5 batches
    (1, None, 6, 1, 5, 6, 1),    # six batches per pass already
    (16, None, 6, 2, 1, 16, 2),  # never fewer requests than one batch
    (2, 8, 6, 2, 1, 8, 2),       # the cell's own request count wins
])
def test_requests_and_timed_repeats(batch, requests, min_requests, repeats, min_batches, n_req, timed):
    st = Study(pair="tiny", prompts=Study.from_dict(
        {"pair": "tiny", "grid": {}, "study": "s", "profile": None,
         "prompts": {"min_requests": min_requests}}).prompts,
        timing=Study.from_dict({"pair": "tiny", "grid": {}, "study": "s", "profile": None,
                                "timing": {"repeats": repeats, "min_timed_batches": min_batches}}).timing)
    cell = Cell(batch=batch, k=0, requests=requests)
    assert st.requests_per_cell(cell) == n_req
    assert st.timed_repeats(cell) == timed


def test_one_proposer_registry_drives_every_engine_and_model():
    """Issue 14: a proposer is registered once (spec.PROPOSERS); the engines, vLLM's config, the cost model and
    the trace replay read it."""
    from specdec.data import traces
    from specdec.data.spec import PROPOSERS, proposer_names
    from specdec.engines import harness, vllm_runner
    from specdec.engines.engine import GenConfig
    from specdec.model import costmodel, predict

    assert vllm_runner.PROPOSERS == proposer_names("vllm") and predict.PROPOSERS == proposer_names(predicted=True)
    for name in proposer_names("torch"):
        GenConfig(max_new_tokens=4, k=2, proposer=name).validate()
    with pytest.raises(SpecdecError, match="unknown proposer 'eagle3'"):
        GenConfig(max_new_tokens=4, k=2, proposer="eagle3").validate()  # vLLM only
    for p in PROPOSERS.values():
        assert p.vllm_method is None or p.vllm_method in vllm_runner.VLLM_METHODS
        assert p.traced_as is None or p.traced_as in traces.PROPOSERS
        assert harness.TRACE_PROPOSER.get(p.name) == p.traced_as
    costs = costmodel.CostModel("fixture", "tiny", "test", costmodel.LinearCost(1e-3, 1e-4, 0),
                                costmodel.LinearCost(1e-4, 1e-5, 0))
    for name in proposer_names(predicted=True):
        assert costs.draft_s(1, 3, 100, name) >= 0
    with pytest.raises(SpecdecError, match="unknown proposer 'none'"):
        costs.draft_s(1, 3, 100, "none")


def test_the_engines_settings_are_the_studys_generation_plus_the_cell():
    """Issue 14: one generation type. GenConfig extends spec.Generation (its fields are declared once), and a
    cell's settings are built from the study's section and the cell in one place."""
    from dataclasses import fields

    from specdec.data.spec import Cell, Generation, Study
    from specdec.engines.engine import GenConfig
    assert {f.name for f in fields(Generation)} <= {f.name for f in fields(GenConfig)}
    st = Study.from_dict({"pair": "tiny", "generation": {"max_new_tokens": 7, "ngram_match": "latest",
                                                        "ngram_max": 2}})
    g = GenConfig.from_cell(st.generation, Cell(batch=2, k=3, proposer="ngram", temperature=0.5, alpha=0.25), 11)
    assert (g.max_new_tokens, g.ngram_match, g.ngram_max, g.k, g.proposer, g.temperature, g.seed,
            g.synthetic_alpha) == (7, "latest", 2, 3, "ngram", 0.5, 11, 0.25)
    assert GenConfig().ngram_match == "earliest" and Generation().ngram_match == "latest"  # legacy configs
    with pytest.raises(SpecdecError, match="unknown proposer"):
        GenConfig.from_cell(st.generation, Cell(batch=1, k=2, proposer="eagle3"), 0)
