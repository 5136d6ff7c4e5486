"""The cache's growth path (config `torch: {kv: concat|grow}`, engines/kv.py): "grow" writes each step's K/V into
spare capacity instead of concatenating; the engine's outputs are the same token for token, and the cache is
not copied on a step that fits its buffer."""
import numpy as np
import pytest
import torch

from specdec.data import config
from specdec.data.models import load_pair
from specdec.data.spec import Study
from specdec.engines import harness, kv
from specdec.engines.engine import GenConfig, generate
from specdec.errors import SpecdecError

PAD = 258


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny")


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    out = [rng.integers(0, 256, size=int(rng.integers(3, 41))).tolist() for _ in range(n)]
    return [p + p for p in out]  # repeated: the n-gram lookup matches, so steps accept unevenly (holes)


def _with(pair, path):
    for model in (pair.target, pair.draft):
        kv.apply(model, path)


@pytest.mark.parametrize("proposer,finished", [("draft", "keep"), ("ngram", "retire"), ("none", "keep")])
def test_grown_cache_gives_the_same_tokens_as_concatenation(pair, proposer, finished):
    """Static batches with holes, compaction (every 4 hole columns) and, under retire, sequences leaving."""
    prompts = _prompts(5, seed=3)
    out = {}
    try:
        for path in ("concat", "grow"):
            _with(pair, path)
            cfg = GenConfig(k=0 if proposer == "none" else 3, proposer=proposer, max_new_tokens=30,
                            compact_after=4, finished=finished)
            eng, _, _ = generate(pair.target, pair.draft if proposer == "draft" else None, prompts, cfg,
                                 pad_token_id=PAD)
            out[path] = [s.generated for s in eng.requests]
            if path == "grow":
                layer = kv._layers(eng.tkv.cache)[0]
                assert type(layer).__name__ == "GrowLayer" and layer._owns()
    finally:
        _with(pair, "concat")
    assert out["grow"] == out["concat"] and all(len(g) == 30 for g in out["grow"])


def test_grown_cache_under_continuous_admission(pair):
    """Sequences joining a running batch (merge, left pad) and leaving it (select): test_engine's admission check
    (each sequence's tokens equal its plain decoding alone) with every cache grown."""
    import test_engine  # tests/ is on sys.path (pytest's default rootdir import mode)

    _with(pair, "grow")
    try:
        test_engine.test_continuous_batching_admission_keeps_outputs(pair)
    finally:
        _with(pair, "concat")


def test_a_grow_layer_writes_in_place_until_full_and_adopts_replaced_tensors(pair):
    """Its keys/values equal the concatenation of every update; a step that fits the buffer does not move it;
    keys replaced from outside (as KVState.select does) are adopted at the next update."""
    from transformers import DynamicCache

    cache = DynamicCache(config=pair.target.config)
    kv.grow(cache)
    layer = cache.layers[0]
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for n in (5, 1, 1, 3)]
    layer.update(parts[0], parts[0] * 2)
    ptr, cap = layer._kbuf.data_ptr(), layer._kbuf.shape[2]
    assert cap > 5 + 5  # spare room for the next steps
    for p in parts[1:]:
        layer.update(p, p * 2)
    assert layer._kbuf.data_ptr() == ptr  # written in place: no copy of the cache
    want = torch.cat(parts, dim=2)
    assert torch.equal(layer.keys, want) and torch.equal(layer.values, want * 2)
    assert cache.get_seq_length() == 10
    layer.keys, layer.values = layer.keys[[1]], layer.values[[1]]  # a sequence left (advanced indexing: a copy)
    assert not layer._owns()
    extra = torch.randn(1, 3, 2, 4, generator=g, dtype=torch.float64)
    layer.update(extra, extra * 2)
    assert layer._owns() and torch.equal(layer.keys, torch.cat([want[[1]], extra], dim=2))
    big = torch.randn(1, 3, layer._kbuf.shape[2], 4, generator=g, dtype=torch.float64)  # more than the room left
    before = layer.keys.clone()
    layer.update(big, big)
    assert torch.equal(layer.keys, torch.cat([before, big], dim=2)) and layer._kbuf.shape[2] > layer.keys.shape[2]


def test_the_kv_key_reaches_the_models_and_bad_values_are_one_line_errors():
    mc = harness.ModelCache("tiny", "float32", "cpu", kv="grow")
    assert all(getattr(m, kv._ATTR) == "grow" for m in mc.get("none"))
    with pytest.raises(SpecdecError, match="torch.kv must be one of concat, grow"):
        Study.from_dict(dict(config.load_study("batch", "fixture"), torch={"kv": "paged"}))
    with pytest.raises(ValueError, match="unknown kv path"):
        kv.apply(None, "paged")
    st = Study.from_dict(dict(config.load_study("batch", "fixture"), torch={"kv": "grow"}))
    assert st.torch.kv == "grow" and Study.from_dict(config.load_study("batch", "fixture")).torch.kv == "concat"


def test_stepprofile_times_both_paths_interleaved_and_restores_the_model(pair):
    from specdec.engines import stepprofile

    out = stepprofile.kv_paths(pair.target, batch=2, context=8, pairs=2, new_tokens=4)
    assert list(out["kv"]) == ["concat", "grow", "grow", "concat"]  # A B, B A
    assert (out["step_s"] > 0).all() and (out.loc[out["kv"] == "concat", "ratio"] == 1).all()
    assert getattr(pair.target, kv._ATTR) == "concat"
