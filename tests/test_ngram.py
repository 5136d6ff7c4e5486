"""n-gram lookup: vLLM's rule (earliest of the longest matches) and the legacy rule, and the config policy."""
import numpy as np
import pytest

from specdec.data import config
from specdec.data.spec import Study
from specdec.engines import ngram
from specdec.engines import vllm_runner as vr
from specdec.errors import SpecdecError


def reverse_kmp(tokens: np.ndarray, k: int, max_n: int, min_n: int) -> list[int]:
    """The algorithm of vLLM's NgramProposer (v1 ngram_proposer.py), rewritten from its description:
    reverse the context, run KMP's prefix function capped at max_n, keep the longest match (ties: the
    largest reversed index, i.e. the earliest original position), copy up to k tokens after it."""
    total = len(tokens)
    if total < min_n:
        return []
    rev = tokens[::-1]
    lps = np.zeros(max_n, dtype=np.int64)
    longest = position = prev = 0
    i = 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start:start + min(k, total - start)].tolist()


@pytest.mark.parametrize("seed", range(300))
def test_earliest_rule_equals_vllm_algorithm(seed):
    rng = np.random.default_rng(seed)
    hist = rng.integers(0, 1 + seed % 5, size=int(rng.integers(1, 40)))  # small alphabets: many repeats
    k, max_n = int(rng.integers(1, 7)), int(rng.integers(1, 5))
    min_n = int(rng.integers(1, max_n + 1))
    assert ngram.lookup(hist, k, max_n, min_n, "earliest").tolist() == reverse_kmp(hist, k, max_n, min_n)


def test_rules_differ_where_a_suffix_recurs():
    hist = np.array([7, 1, 2, 7, 3, 4, 7])  # "7" occurred at 0 (followed by 1 2) and at 3 (followed by 3 4)
    assert ngram.lookup(hist, 2, 3, 1, "earliest").tolist() == [1, 2]
    assert ngram.lookup(hist, 2, 3, 1, "latest").tolist() == [3, 4]
    with pytest.raises(ValueError, match="match rule"):
        ngram.lookup(hist, 2, 3, 1, "first")


def test_legacy_rule_keeps_the_hash_of_runs_measured_before_the_key():
    cfg = config.load_study("batch", "cpu-bf16")
    assert cfg["generation"]["ngram_match"] == "latest"
    legacy = {**cfg, "generation": {k: v for k, v in cfg["generation"].items() if k != "ngram_match"}}
    assert config.config_hash(cfg) == config.config_hash(legacy)
    vllm_rule = {**cfg, "generation": {**cfg["generation"], "ngram_match": "earliest"}}
    assert config.config_hash(vllm_rule) != config.config_hash(cfg)


def test_gpu_profiles_measure_with_vllms_rule():
    assert config.load_study("batch", "h100")["generation"]["ngram_match"] == "earliest"


def test_bad_rule_is_a_config_error():
    cfg = config.load_study("batch", "h100")
    cfg["generation"]["ngram_match"] = "first"
    with pytest.raises(SpecdecError, match="ngram_match must be one of"):
        config.validate(cfg)


def test_vllm_refuses_the_legacy_rule():
    cfg = config.load_study("batch", "cpu-bf16")
    with pytest.raises(SpecdecError, match="earliest"):
        vr.speculative_config(Study.from_dict(cfg), {"k": 3, "proposer": "ngram"})
