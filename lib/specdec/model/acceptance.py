"""Acceptance model from real per-position traces (not only an i.i.d. alpha).

A trace is one request: the k it ran with and the accepted count n (0..k) of each verification step.
Sources: the engine's step records (steps.parquet: per-sequence lists `accepted`, `proposed`, `active`,
`rids`; the cell's `k`) or a JSONL file, one request per line:

    {"k": 5, "accepted": [3, 0, 5, 2]}
    {"k": 5, "accepted": [3, 0, 1], "proposed": [5, 0, 2]}   (optional: tokens proposed per step, default k)

Per-position conditional acceptance p_j = P(draft token j accepted | tokens 1..j-1 accepted), j = 1..K,
estimated as (steps accepting j) / (steps that tried j). A step tries position j when j <= k and its
first j-1 tokens were accepted; an n-gram proposer that proposed fewer than k tokens counts as a rejection
at the first unproposed position (running it with k' < k would propose the same prefix). From the p_j:
  survival S(m) = P(n >= m) = p_1 * ... * p_m, length distribution P(n = m | k), and
  expected tokens per step E[min(n, k') + 1] = S(0) + ... + S(k') for any k' <= K,
which equals the empirical mean of min(n, k') + 1 when every trace ran with k >= k'.
Proposal lengths (an n-gram lookup proposes up to k tokens, or none) are estimated the same way: q_j =
P(proposal >= j | proposal >= j-1) over steps of traces that ran with k >= j, whence the mean verify width
of a step at k' (verify_width): k'+1 padded, 1 + E[min(proposal, k')] when each sequence verifies only its own
proposal (ragged, as vLLM packs them), or 1 + E[max over the batch] when the batch is padded to its longest.
The i.i.d. comparison uses alpha = accepted / tried positions (the censored-Bernoulli MLE) in
(1 - alpha^(k+1)) / (1 - alpha).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..data import tables
from ..errors import SpecdecError


@dataclass(frozen=True)
class Trace:
    """One request: k proposed tokens per step, accepted count per verification step and, where known, the
    tokens actually proposed at each step (None: k every step, as a draft model proposes)."""

    k: int
    accepted: tuple[int, ...]
    proposed: tuple[int, ...] | None = None


def from_steps(steps: pd.DataFrame) -> list[Trace]:
    """Per-request traces from engine step records (rows with k = 0 and finished sequences are skipped)."""
    by_req: dict[tuple, list[int]] = {}
    props: dict[tuple, list[int]] = {}
    ks: dict[tuple, int] = {}
    run_cols = [c for c in ("run_id", "repeat", "batch_idx") if c in steps.columns]
    for row in steps.itertuples(index=False):
        acc, prop = list(getattr(row, "accepted")), list(getattr(row, "proposed"))
        active = list(getattr(row, "active", [True] * len(acc)))
        rids = list(getattr(row, "rids", range(len(acc))))
        k = int(getattr(row, "k")) if "k" in steps.columns else int(max(prop, default=0))
        if k <= 0:
            continue
        base = tuple(getattr(row, c) for c in run_cols)
        for n, c, on, rid in zip(acc, prop, active, rids):
            if on:
                key = base + (int(rid),)
                by_req.setdefault(key, []).append(int(n))
                props.setdefault(key, []).append(min(int(c), k))
                ks[key] = k
    return [Trace(ks[key], tuple(v), tuple(props[key])) for key, v in by_req.items()]


def read_jsonl(path: str | Path) -> list[Trace]:
    """Traces from a JSONL file ({"k": int, "accepted": [ints]} per line, optionally "proposed": [ints], one per
    step, each in accepted..k); bad lines are one-line errors."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise SpecdecError(f"cannot read traces file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise SpecdecError(f"cannot read traces file {path}: not a text (JSONL) file") from None
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            k, acc = obj["k"], obj["accepted"]
            prop = obj.get("proposed")
            ok = isinstance(k, int) and k >= 1 and isinstance(acc, list) and \
                all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= k for n in acc)
            ok = ok and (prop is None or (isinstance(prop, list) and len(prop) == len(acc) and all(
                isinstance(c, int) and not isinstance(c, bool) and n <= c <= k for n, c in zip(acc, prop))))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            raise SpecdecError(f"{path.name} line {i}: expected {{\"k\": int >= 1, \"accepted\": [ints in 0..k]}} "
                               f"and optionally \"proposed\": [one int in accepted..k per step]")
        out.append(Trace(k, tuple(acc), tuple(prop) if prop is not None else None))
    if not any(t.accepted for t in out):
        raise SpecdecError(f"{path.name} holds no verification steps")
    return out


def write_jsonl(traces: list[Trace], path: str | Path) -> None:
    """Write traces in the JSONL format read_jsonl reads."""
    def line(t: Trace) -> dict:
        out = {"k": t.k, "accepted": list(t.accepted)}
        return out if t.proposed is None else dict(out, proposed=list(t.proposed))

    Path(path).write_text("".join(json.dumps(line(t)) + "\n" for t in traces))


def load_traces(profile: str, pair: str | None = None, proposer: str = "draft", temperature: float = 0.0,
                studies: tuple[str, ...] = ("acceptance", "batch")) -> tuple[list[Trace], str]:
    """Real (non-synthetic) traces from the first study in `studies` that has any for this profile.

    Keeps cells with the given proposer and temperature, k > 0, no synthetic alpha, no quantization, and
    (if given) the pair. Returns (traces, where they came from); none anywhere is a one-line error."""
    for study in studies:
        try:
            steps = tables.load(profile, study, "steps")
        except SpecdecError:
            continue
        keep = (steps["proposer"] == proposer) & (steps["k"] > 0) & np.isclose(steps["temperature"], temperature)
        if "alpha" in steps:
            keep &= steps["alpha"].isna()
        if "quant" in steps:
            keep &= steps["quant"].fillna("none") == "none"
        if pair is not None:
            keep &= steps["pair"] == pair
        traces = from_steps(steps[keep])
        if traces:
            return traces, f"data/raw/{profile}/{study} ({proposer}, t={temperature:g})"
    what = f"{proposer} proposer, temperature {temperature:g}" + (f", pair {pair}" if pair else "")
    raise SpecdecError(f"no acceptance traces ({what}) in data/raw/{profile}/{{{','.join(studies)}}}; "
                       f"pass --traces FILE.jsonl")


class AcceptanceModel:
    """Per-position acceptance estimated from traces; `tried`/`acc` are per-trace counts (n_traces, K).
    `reach`/`offered` (n_traces, K), where proposal lengths are known: steps that ran with k >= j and proposed
    >= j-1 tokens, and those of them that proposed >= j (None: every step proposed its full k)."""

    def __init__(self, tried: np.ndarray, acc: np.ndarray, traces: list[Trace] | None = None, source: str = "",
                 reach: np.ndarray | None = None, offered: np.ndarray | None = None):
        self.tried = np.asarray(tried, dtype=float)
        self.acc = np.asarray(acc, dtype=float)
        self.traces = traces or []
        self.source = source
        self.tried_total = self.tried.sum(0)
        self.acc_total = self.acc.sum(0)
        self.reach = None if reach is None else np.asarray(reach, dtype=float)
        self.offered = None if offered is None else np.asarray(offered, dtype=float)

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_traces(cls, traces: list[Trace], source: str = "") -> "AcceptanceModel":
        traces = [t for t in traces if t.accepted and t.k > 0]
        if not traces:
            raise SpecdecError("no verification steps in the acceptance traces")
        K = max(t.k for t in traces)
        tried, acc = np.zeros((len(traces), K)), np.zeros((len(traces), K))
        reach, offered = np.zeros((len(traces), K)), np.zeros((len(traces), K))
        for i, t in enumerate(traces):
            n = np.asarray(t.accepted)
            if n.min() < 0 or n.max() > t.k:
                raise SpecdecError(f"accepted counts must be in 0..k={t.k}, got {n.min()}..{n.max()}")
            ge = np.bincount(n, minlength=t.k + 1)[::-1].cumsum()[::-1]  # ge[j] = #steps with n >= j
            tried[i, :t.k] = ge[:t.k]
            acc[i, :t.k] = ge[1:t.k + 1]
            c = np.full(len(n), t.k) if t.proposed is None else np.minimum(np.asarray(t.proposed), t.k)
            if len(c) != len(n) or (c < n).any():
                raise SpecdecError(f"proposed counts must be one per step, each in accepted..k={t.k}")
            pe = np.bincount(c, minlength=t.k + 1)[::-1].cumsum()[::-1]  # pe[j] = #steps proposing >= j
            reach[i, :t.k] = pe[:t.k]
            offered[i, :t.k] = pe[1:t.k + 1]
        if all(t.proposed is None for t in traces):
            reach = offered = None
        return cls(tried, acc, traces, source, reach, offered)

    @classmethod
    def from_conditionals(cls, p, source: str = "synthetic") -> "AcceptanceModel":
        """A model with exactly these per-position conditionals (no sampling uncertainty)."""
        p = np.asarray(p, dtype=float)
        if p.ndim != 1 or len(p) == 0 or (p < 0).any() or (p > 1).any():
            raise SpecdecError("conditional acceptance probabilities must be a non-empty list in [0, 1]")
        return cls(np.ones((1, len(p))), p[None, :], None, source)

    @classmethod
    def iid(cls, alpha: float, k: int) -> "AcceptanceModel":
        """i.i.d. acceptance alpha at every position 1..k."""
        return cls.from_conditionals(np.full(k, alpha), source=f"i.i.d. alpha={alpha:g}")

    # -- estimates --------------------------------------------------------------------------------
    @property
    def max_k(self) -> int:
        """Deepest position the traces tried."""
        return int(self.tried.shape[1])

    @property
    def n_steps(self) -> int:
        return int(round(self.tried_total[0]))

    @property
    def iid_alpha(self) -> float:
        """Pooled acceptance rate: accepted / tried draft positions (MLE of an i.i.d. alpha)."""
        return float(self.acc_total.sum() / self.tried_total.sum()) if self.tried_total.sum() else 0.0

    def conditionals(self, k: int | None = None, extrapolate: bool = False) -> np.ndarray:
        """p_1..p_k; a never-tried position gets 0. k > max_k is an error unless `extrapolate`, which
        repeats the deepest observed conditional."""
        k = self.max_k if k is None else k
        if k < 0:
            raise SpecdecError(f"k must be >= 0, got {k}")
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(self.tried_total > 0, self.acc_total / np.maximum(self.tried_total, 1e-300), 0.0)
        if k > self.max_k:
            if not extrapolate:
                raise SpecdecError(f"acceptance traces only cover k <= {self.max_k}, asked for k = {k}")
            p = np.concatenate([p, np.full(k - self.max_k, p[-1])])
        return p[:k]

    def survival(self, k: int, extrapolate: bool = False) -> np.ndarray:
        """S(m) = P(n >= m) for m = 0..k."""
        return np.concatenate([[1.0], np.cumprod(self.conditionals(k, extrapolate))])

    def length_dist(self, k: int, extrapolate: bool = False) -> np.ndarray:
        """P(n = m | k) for m = 0..k (accepted draft tokens in one step)."""
        s = self.survival(k, extrapolate)
        return s - np.concatenate([s[1:], [0.0]])

    def expected_tokens(self, k: int, extrapolate: bool = False) -> float:
        """E[n + 1]: tokens per verification step (accepted draft tokens plus the target's own) at k."""
        return float(self.survival(k, extrapolate).sum())

    def iid_expected_tokens(self, k: int) -> float:
        """The same mean under i.i.d. acceptance at the pooled alpha."""
        return iid_expected_tokens(self.iid_alpha, k)

    def empirical_length_dist(self, k: int) -> np.ndarray | None:
        """Observed P(n = m) over steps of traces that ran with exactly k (None if there are none)."""
        ns = [n for t in self.traces if t.k == k for n in t.accepted]
        return np.bincount(ns, minlength=k + 1) / len(ns) if ns else None

    def proposal_survival(self, k: int, extrapolate: bool = False) -> np.ndarray:
        """P(a step proposes >= j tokens) for j = 1..k (all ones where every step proposed its full k). k > max_k
        is an error unless `extrapolate`, which repeats the deepest observed conditional."""
        if k > self.max_k and not extrapolate:
            raise SpecdecError(f"acceptance traces only cover k <= {self.max_k}, asked for k = {k}")
        if self.offered is None:
            return np.ones(k)
        r, o = self.reach.sum(0), self.offered.sum(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            q = np.where(r > 0, o / np.maximum(r, 1e-300), 0.0)
        if k > self.max_k:
            q = np.concatenate([q, np.full(k - self.max_k, q[-1])])
        return np.cumprod(q[:k])

    def mean_proposed(self, k: int, extrapolate: bool = False) -> float:
        """E[min(proposal, k)]: draft tokens a step proposes at k (k for a draft model)."""
        return float(self.proposal_survival(k, extrapolate).sum())

    def verify_width(self, k: int, batch: int = 1, rule: str = "ragged", extrapolate: bool = False) -> float:
        """Mean tokens per sequence that a step's target forward verifies at k, in a batch of `batch` sequences:
        "k": k + 1 (proposals padded to k); "ragged": 1 + E[min(proposal, k)] (each sequence its own proposal,
        as vLLM packs them and the torch engine's verify: ragged multiplies them); "proposed": 1 + E[the
        batch's longest proposal] (padded to it; proposals independent across sequences)."""
        if k <= 0:
            return 1.0
        if rule == "k":
            return float(k + 1)
        s = self.proposal_survival(k, extrapolate)
        if rule == "ragged":
            return 1.0 + float(s.sum())
        if rule == "proposed":
            return 1.0 + float((1.0 - (1.0 - s) ** max(int(batch), 1)).sum())
        raise SpecdecError(f"unknown verify rule '{rule}'; known: k, proposed, ragged")

    def table(self) -> pd.DataFrame:
        """One row per position j: tried, accepted, conditional p_j, survival S(j)."""
        p = self.conditionals()
        return pd.DataFrame({"position": np.arange(1, self.max_k + 1), "tried": self.tried_total,
                             "accepted": self.acc_total, "p_cond": p, "survival": np.cumprod(p)})

    def resample(self, rng: np.random.Generator) -> "AcceptanceModel":
        """One bootstrap replicate: traces (requests) drawn with replacement."""
        idx = rng.integers(0, len(self.tried), size=len(self.tried))
        pick = (lambda a: None if a is None else a[idx])
        return AcceptanceModel(self.tried[idx], self.acc[idx], None, self.source, pick(self.reach), pick(self.offered))

    def describe(self) -> str:
        n = len(self.traces) or len(self.tried)
        return f"{n} requests, {self.n_steps} steps, k <= {self.max_k}, i.i.d. alpha {self.iid_alpha:.2f}" + \
            (f" from {self.source}" if self.source else "")


def iid_expected_tokens(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha): tokens per step with i.i.d. acceptance (k + 1 when alpha = 1)."""
    if alpha >= 1:
        return float(k + 1)
    return float((1 - alpha ** (k + 1)) / (1 - alpha))


class ReplayAcceptance:
    """Acceptance conditioned on k, from per-position traces (traces.TraceSet): for each k the traces are
    replayed at that k (a step starting at position i emits min(acc_len[i], k+1)) and the resulting step
    records form one AcceptanceModel per k. Tokens per step at k are then the replayed mean, with no
    assumption that positions are independent. Bootstrap replicates resample requests jointly over k."""

    def __init__(self, per_k: dict, propose: dict, source: str = "", n_requests: int = 0, prompt_len=None,
                 gen_len=None):
        self.per_k = per_k  # k -> AcceptanceModel of the replayed steps at k
        self.propose = propose  # k -> per-request (steps, expected steps with a proposal) counts (n_req, 2)
        self.source = source
        self.n_requests = n_requests
        self.prompt_len = np.asarray(prompt_len if prompt_len is not None else [], dtype=float)  # tokens
        self.gen_len = np.asarray(gen_len if gen_len is not None else [], dtype=float)  # output tokens
        self.traces = []

    @classmethod
    def from_trace_set(cls, ts, k_max: int = 8) -> "ReplayAcceptance":
        from ..data import traces as tr

        reqs = [r for r in ts.requests if r.generated_len > 1]
        per_k, propose = {}, {}
        for k in range(1, min(k_max, ts.max_k) + 1):
            steps = []
            counts = np.zeros((len(reqs), 2))
            for i, r in enumerate(reqs):
                starts, emitted = tr.steps(r.acc_len, k)
                steps.append(Trace(k, tuple(int(e) - 1 for e in emitted)))
                acc = np.asarray(r.acc_len)[starts - 1]
                m = ts.match_prob if ts.match_prob is not None else 1.0
                counts[i] = (len(starts), float(np.sum(np.where(acc > 1, 1.0, m))))
            per_k[k] = AcceptanceModel.from_traces(steps)
            propose[k] = counts
        src = f"{ts.name}/{ts.dataset} ({ts.proposer}, replayed per k)"
        return cls(per_k, propose, src, len(reqs), [r.prompt_len for r in reqs], [r.generated_len for r in reqs])

    @property
    def max_k(self) -> int:
        return max(self.per_k)

    def _model(self, k: int) -> AcceptanceModel:
        if k not in self.per_k:
            raise SpecdecError(f"acceptance traces only cover k <= {self.max_k}, asked for k = {k}")
        return self.per_k[k]

    def expected_tokens(self, k: int, extrapolate: bool = False) -> float:
        return self._model(k).expected_tokens(k)

    def propose_fraction(self, k: int) -> float:
        """Share of steps at k in which the proposer proposed anything (n-gram lookups can find nothing)."""
        c = self.propose[k]
        return float(c[:, 1].sum() / c[:, 0].sum())

    def conditionals(self, k: int | None = None, extrapolate: bool = False) -> np.ndarray:
        k = self.max_k if k is None else k
        return self._model(k).conditionals(k)

    def length_dist(self, k: int, extrapolate: bool = False) -> np.ndarray:
        return self._model(k).length_dist(k)

    @property
    def iid_alpha(self) -> float:
        return self._model(self.max_k).iid_alpha

    def iid_expected_tokens(self, k: int) -> float:
        return iid_expected_tokens(self._model(k).iid_alpha, k)

    def resample(self, rng: np.random.Generator) -> "ReplayAcceptance":
        idx = rng.integers(0, self.n_requests, size=self.n_requests)
        per_k = {k: AcceptanceModel(m.tried[idx], m.acc[idx], None, m.source) for k, m in self.per_k.items()}
        return ReplayAcceptance(per_k, {k: c[idx] for k, c in self.propose.items()}, self.source, self.n_requests,
                                self.prompt_len[idx], self.gen_len[idx])

    def request_tokens_per_step(self, k: int) -> np.ndarray:
        """Per request: tokens per step at k (its own replay; accepted + one per step)."""
        m = self._model(k)
        steps = m.tried[:, 0]
        return (m.acc.sum(1) + steps) / np.maximum(steps, 1)

    def request_propose_fraction(self, k: int) -> np.ndarray:
        c = self.propose[k]
        return c[:, 1] / np.maximum(c[:, 0], 1)

    def describe(self) -> str:
        m = self._model(min(3, self.max_k))
        return (f"{self.n_requests} requests replayed at k = 1..{self.max_k} "
                f"(k={min(3, self.max_k)}: {m.n_steps} steps, {m.expected_tokens(min(3, self.max_k)):.2f} tokens/step) "
                f"from {self.source}")
