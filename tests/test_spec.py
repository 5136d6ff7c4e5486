"""Typed study configs: defaults in one place, misspelt keys refused, the cell arithmetic both engines use."""
import pytest

from specdec import config
from specdec.errors import SpecdecError
from specdec.spec import Cell, Study


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
