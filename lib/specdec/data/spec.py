"""Typed views of a study config and its cells: what harness and vLLM runner read, with every default in
one place (the YAML stays the stored, hashed form; these are built from it and reject unknown keys).

Units: tokens for lengths, seconds nowhere (timing counts repeats, steps and batches).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..errors import SpecdecError

# n-gram lookup's rules for picking among earlier matches (engines/ngram.py applies them).
MATCH_RULES = ("earliest", "latest")
# What a config without generation.ngram_match means: the rule the engine used before the key existed.
LEGACY_MATCH = "latest"


@dataclass(frozen=True)
class Proposer:
    """One proposer, registered once: the engines that run it (torch | vllm), vLLM's speculative_config method
    for it (None: no speculation), how the cost model counts proposing ("draft forward": a model's forward per
    proposed token; "lookup": a share of the verify forward; "none"), whose acceptance it follows in the paper's
    traces (their acc_<name> keys: eagle | ngram; None: not traced), and whether advise predicts it."""

    name: str
    engines: tuple
    vllm_method: str | None
    cost: str
    traced_as: str | None
    predicted: bool


# torch's eagle runs on pairs with an EAGLE-sized head (synthetic shapes); vLLM's eagle/eagle3 need a hub head
PROPOSERS = {p.name: p for p in (
    Proposer("draft", ("torch", "vllm"), "draft_model", "draft forward", "eagle", True),
    Proposer("ngram", ("torch", "vllm"), "ngram", "lookup", "ngram", True),
    Proposer("eagle", ("torch", "vllm"), "eagle", "draft forward", "eagle", True),
    Proposer("eagle3", ("vllm",), "eagle3", "draft forward", None, False),
    Proposer("none", ("torch", "vllm"), None, "none", None, False),
)}


def proposer_names(engine: str | None = None, predicted: bool | None = None) -> tuple:
    """Registered proposer names, optionally those an engine runs or those advise predicts."""
    return tuple(n for n, p in PROPOSERS.items()
                 if (engine is None or engine in p.engines) and (predicted is None or p.predicted == predicted))


def _build(cls, data, where: str):
    data = data or {}
    if not isinstance(data, dict):
        raise SpecdecError(f"{where} must be a mapping, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpecdecError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls(**data)


@dataclass(frozen=True)
class Prompts:
    """sets: prompt sets (prompts.py); per_set: prompts per set; max_prompt_tokens: prompts are cut to their
    last this many tokens; min_requests: requests per static cell (at least one batch); requests: requests
    per continuous-batching (poisson) cell."""

    sets: tuple = ("humaneval",)
    per_set: int = 8
    max_prompt_tokens: int = 512
    min_requests: int | None = None
    requests: int = 16


@dataclass(frozen=True)
class Generation:
    """max_new_tokens per request; temperature default (cells set their own); ignore_eos: always generate
    max_new_tokens; ngram_max/ngram_min: n-gram lookup lengths; ngram_match: earliest | latest (ngram.py);
    acceptance_trace: replayed acceptance (below)."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    ignore_eos: bool = True
    ngram_max: int = 3
    ngram_min: int = 1
    ngram_match: str = LEGACY_MATCH  # a config without the key means the rule its runs were measured with
    # COLLECTION/DATASET under data/traces: acceptance replayed per request from the trace (torch engine; the
    # draft model's cells follow the EAGLE traces, n-gram cells the n-gram ones), prompts are random token ids
    # of the traced prompt lengths. Draft and verify passes run in full: timings are real, acceptance the trace's.
    acceptance_trace: str | None = None


@dataclass(frozen=True)
class Timing:
    """warmup_steps: untimed decode steps before timing a cell; repeats: timed passes over the cell's
    requests; min_timed_batches: at least this many timed batches (more repeats if needed); warmup_forwards:
    untimed forwards per hardware cell; paired: every timed batch of an SD cell also runs without
    speculation, interleaved (pairing.py); warmup_batches: each cell's first timed batches that analysis leaves
    out (one-time device costs; an analysis setting, so left out of the config hash)."""

    warmup_steps: int = 2
    repeats: int = 2
    min_timed_batches: int = 1
    warmup_forwards: int = 1
    paired: bool = False
    warmup_batches: int = 0


@dataclass(frozen=True)
class Serving:
    """The serving study's load (config section `serving`): requests per load window; pairs of windows per
    cell (each pair runs the no-SD server and the cell's server on the same arrivals and prompts, in
    alternating order: pairing.py); warmup_requests per server after it starts (untimed); request_timeout_s
    per request; window_timeout_s per window (its open requests are then cancelled); start_timeout_s for a
    server to answer /health; port: null takes a free loopback port per server, a number fixes it;
    side_by_side: keep the no-SD server alive beside the SD server (false: one server at a time, restarted
    when the arm changes, for machines that cannot hold both)."""

    requests: int = 16
    pairs: int = 2
    warmup_requests: int = 2
    request_timeout_s: float = 600.0
    window_timeout_s: float = 1800.0
    start_timeout_s: float = 900.0
    port: int | None = None
    side_by_side: bool = True

    def __post_init__(self):
        for key in ("requests", "pairs"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise SpecdecError(f"serving.{key} must be an integer >= 1, got {getattr(self, key)!r}")
        for key in ("request_timeout_s", "window_timeout_s", "start_timeout_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise SpecdecError(f"serving.{key} must be > 0 (seconds), got {v!r}")
        if self.port is not None and (not isinstance(self.port, int) or not 1024 <= self.port <= 65535):
            raise SpecdecError(f"serving.port must be null or a port 1024..65535, got {self.port!r}")


@dataclass(frozen=True)
class Slo:
    """A latency target a served request meets (section `slo`, analysis only: left out of the config hash):
    time to first token <= ttft_s and time per output token after the first <= tpot_s (seconds)."""

    ttft_s: float = 10.0
    tpot_s: float = 1.0


LINEAR_PATHS = ("dense", "onednn")  # onednn.py
ATTENTION_PATHS = ("sdpa", "gqa")  # attention.py
VERIFY_WIDTHS = ("k", "proposed", "ragged")  # engine.SpecEngine.step
FINISHED_RULES = ("keep", "retire")  # engine.decode
KV_PATHS = ("concat", "grow")  # kv.py


@dataclass(frozen=True)
class TorchEngine:
    """The torch engine's own settings (config section `torch`; left out of vLLM runs' config hash).

    linear: "dense" (torch's default matmul path) or "onednn" (fp32 weights pre-packed for oneDNN, CPU only).
    attention: "sdpa" (transformers' sdpa path, which copies K/V out to every query head when given a mask) or
    "gqa" (torch's sdpa reads the KV heads in place: engines/attention.py).
    verify: how many tokens per sequence a step's target forward verifies: "k" (always k+1: an n-gram lookup
    that proposed fewer, or nothing, is padded) or "proposed" (1 + the longest proposal in the batch: a step
    where no sequence's lookup matched is a plain 1-token forward, as in vLLM, which verifies only what was
    proposed) or "ragged" (that width, and the target's Linears multiply only each sequence's pending token and
    real proposals, engines/ragged.py, as vLLM packs them). Greedy outputs are the same every way; the draft
    model always proposes k.
    finished: what a static batch does with a sequence that has all its tokens while others decode on: "keep"
    (it stays in the batch to the end, computed and discarded: the batch is as wide at its last step as at its
    first) or "retire" (it leaves the batch, as vLLM's scheduler drops a finished request, so later steps run
    only the unfinished ones). Without speculation every sequence of a batch finishes at the same step
    (ignore_eos), so this matters only to SD arms, whose sequences accept at different rates.
    kv: how a cache takes each step's new K/V: "concat" (transformers' DynamicCache concatenates them to the whole
    cache, a copy of it per layer per step) or "grow" (written in place into spare capacity: engines/kv.py
    GrowLayer, as vLLM's paged cache writes only the new slots). Outputs are the same either way."""

    linear: str = "dense"
    attention: str = "sdpa"
    verify: str = "k"
    finished: str = "keep"
    kv: str = "concat"

    def __post_init__(self):
        if self.linear not in LINEAR_PATHS:
            raise SpecdecError(f"torch.linear must be one of {', '.join(LINEAR_PATHS)}, got '{self.linear}'")
        if self.attention not in ATTENTION_PATHS:
            raise SpecdecError(f"torch.attention must be one of {', '.join(ATTENTION_PATHS)}, "
                               f"got '{self.attention}'")
        if self.verify not in VERIFY_WIDTHS:
            raise SpecdecError(f"torch.verify must be one of {', '.join(VERIFY_WIDTHS)}, got '{self.verify}'")
        if self.finished not in FINISHED_RULES:
            raise SpecdecError(f"torch.finished must be one of {', '.join(FINISHED_RULES)}, got '{self.finished}'")
        if self.kv not in KV_PATHS:
            raise SpecdecError(f"torch.kv must be one of {', '.join(KV_PATHS)}, got '{self.kv}'")


def staged_split(torch_next: dict) -> tuple[dict, object]:
    """A staged `torch_next` mapping split into (its torch settings, its staged `timing` value, {} when none):
    a `timing` mapping inside torch_next stages timing keys (config.next_view merges it into `timing`)."""
    return {k: v for k, v in torch_next.items() if k != "timing"}, torch_next.get("timing") or {}


@dataclass(frozen=True)
class Study:
    """A study config after the profile's overrides (config.load_study), typed."""

    pair: str
    study: str = ""
    profile: str | None = None
    grid: object = None
    description: str = ""
    dtype: str | None = None  # None: float32 in the torch engine, "auto" in vLLM
    draft_dtype: str | None = None
    draft_quant: str = "none"
    seed: int = 0
    threads: int | None = None
    protocol: int = 1
    vllm: dict = field(default_factory=dict)
    # run-id shell patterns of SD cells whose step times calibrate the cost model end to end
    # (costmodel.fit_steps); every other SD cell is held out to validate it. Analysis only: not in the hash.
    calibration: tuple = ()
    torch: TorchEngine = TorchEngine()
    # torch settings being re-measured before they replace `torch` (config.next_view, `measure --next`); the
    # runs use `torch` merged with these (a `timing` mapping inside stages timing keys: config.next_view). Not in
    # the hash: staging them changes no run's validity.
    torch_next: TorchEngine | None = None
    serving: Serving = Serving()
    slo: Slo = Slo()
    prompts: Prompts = Prompts()
    generation: Generation = Generation()
    timing: Timing = Timing()

    @classmethod
    def from_dict(cls, cfg: dict) -> "Study":
        name = f"config {cfg.get('study', '?')}.yaml"
        if "pair" not in cfg:
            raise SpecdecError(f"{name}: needs a 'pair'")
        top = {k: v for k, v in cfg.items()
               if k not in ("prompts", "generation", "timing", "torch", "torch_next", "serving", "slo")}
        st = _build(cls, top, name)
        prompts = dict(cfg.get("prompts") or {})
        if "sets" in prompts:
            prompts["sets"] = tuple(prompts["sets"])
        if cfg.get("torch_next") is not None and not isinstance(cfg["torch_next"], dict):
            raise SpecdecError(f"{name}: torch_next must be a mapping of torch settings, got {cfg['torch_next']!r}")
        if not isinstance(st.calibration, (list, tuple)) or not all(isinstance(p, str) for p in st.calibration):
            raise SpecdecError(f"{name}: calibration must be a list of run-id patterns, got {st.calibration!r}")
        return replace(st, calibration=tuple(st.calibration), prompts=_build(Prompts, prompts, f"{name}: prompts"),
                        generation=_build(Generation, cfg.get("generation"), f"{name}: generation"),
                        timing=_build(Timing, cfg.get("timing"), f"{name}: timing"), vllm=dict(cfg.get("vllm") or {}),
                        torch=_build(TorchEngine, cfg.get("torch"), f"{name}: torch"),
                        torch_next=(None if cfg.get("torch_next") is None else
                                    _build(TorchEngine, {**(cfg.get("torch") or {}),
                                                         **staged_split(cfg["torch_next"])[0]},
                                           f"{name}: torch_next")),
                        serving=_build(Serving, cfg.get("serving"), f"{name}: serving"),
                        slo=_build(Slo, cfg.get("slo"), f"{name}: slo"))

    def requests_per_cell(self, cell: "Cell") -> int:
        """Requests of a static cell: the cell's `requests`, else prompts.min_requests, never below one batch,
        rounded up to whole batches (a partial last batch would not be batch size `batch`)."""
        n = max(cell.batch, cell.requests or self.prompts.min_requests or cell.batch)
        return -(-n // cell.batch) * cell.batch

    def timed_repeats(self, cell: "Cell") -> int:
        """Timed passes over a static cell's requests: timing.repeats, more when min_timed_batches needs it."""
        per_pass = self.requests_per_cell(cell) // cell.batch
        return max(self.timing.repeats, -(-self.timing.min_timed_batches // per_pass))


@dataclass(frozen=True)
class Cell:
    """One grid point (config.py): batch (sequences), k (proposed tokens), proposer, temperature, alpha
    (forced acceptance or None), quant, rate (arrivals/s), context (KV tokens), requests, mode, trace (dataset
    of generation.acceptance_trace's collection this cell replays; None: that setting's own)."""

    batch: int
    k: int
    mode: str = "static"
    proposer: str = "draft"
    temperature: float = 0.0
    alpha: float | None = None
    quant: str = "none"
    rate: float | None = None
    context: int | None = None
    requests: int | None = None
    trace: str | None = None

    @classmethod
    def from_dict(cls, cell: dict) -> "Cell":
        return _build(cls, {k: v for k, v in cell.items() if v is not None or k in ("alpha",)}, "cell")
