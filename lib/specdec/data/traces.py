"""Per-position acceptance traces of external origin, e.g. the paper's published Llama-3.1-8B / H100 traces.

Format (the paper's simulator, SpecDecode-Bench/simulator `data/<model>/combined_<dataset>.jsonl`): one request
per line with `prompt_token_ids`, `generated_token_ids` and, per proposer, `acc_<proposer>.acc_len`: one value
per output position = the tokens a verification step starting there would emit (accepted proposals plus the
target's own token), recorded with a large k so it is capped only at that k + 1 (21 in the published files).
A step with k proposals starting at position i therefore emits min(acc_len[i], k + 1) tokens and the next step
starts that many positions later: replaying a trace at any k <= cap - 1 needs no independence assumption.

`specdec import-traces` converts such files as-is into a compact committed form under data/traces/<name>/:
`<dataset>.jsonl` ({"id", "prompt_len", "acc": {proposer: [acc_len...]}} per line; token ids are dropped) and
`source.json` (provenance: repository, commit, file sha256s, licence note, the simulator's n-gram match
probabilities). Which datasets may be used to build and test, and which are held out, is recorded there too.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .. import paths
from ..errors import SpecdecError

PROPOSERS = ("eagle", "ngram")  # the keys acc_<proposer> of the paper's files

# The paper's artifact, as imported into data/traces/llama3.1-8b-h100 (see README "Imported data").
PAPER = {
    "name": "llama3.1-8b-h100",
    "pair": "llama3.1-8b/eagle",
    "profile": "h100",
    "held_out": ["gsm8k", "instructcoder"],  # validation only: report errors on them, never tune to them
    # simulator.py NGRAM_MATCHING_PROBABILITY: the authors' P(n-gram match | nothing accepted) per dataset
    "match_prob": {"sharegpt": 0.2, "cnn": 0.4, "gsm8k": 0.2, "instructcoder": 0.8},
    "source": ("github SpecDecode-Bench/simulator data/llama3.1-8B/combined_<dataset>.jsonl: Llama-3.1-8B-Instruct "
               "acceptance profiled on H100 with EAGLE and n-gram proposers (Liu et al., 'Speculative Decoding: "
               "Performance or Illusion?', arXiv 2601.11580)"),
    "commit": "2fdccbd61b62be339fb85fd90caf43f5e8392aa6",
    "licence": ("the source repository has no licence file (no licence granted); only derived per-position "
                "acceptance counts (token ids dropped) are kept, with attribution, for research use; cite the paper"),
}


@dataclass(frozen=True)
class Request:
    """One traced request: prompt length [tokens] and acc_len per output position."""

    id: str
    prompt_len: int
    acc_len: tuple[int, ...]

    @property
    def generated_len(self) -> int:
        return len(self.acc_len)


@dataclass(frozen=True)
class TraceSet:
    """The requests of one dataset for one proposer, with the source's metadata."""

    name: str  # trace collection, e.g. llama3.1-8b-h100
    dataset: str
    proposer: str
    requests: tuple[Request, ...]
    cap: int  # largest acc_len the recording could show (k_recorded + 1)
    match_prob: float | None  # n-gram: P(the lookup proposes anything | acc_len = 1); None = always proposes
    held_out: bool
    pair: str
    profile: str

    @property
    def max_k(self) -> int:
        return self.cap - 1


def traces_root() -> Path:
    return paths.root() / "data" / "traces"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _git_commit(folder: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _is_count(v) -> bool:
    """An acc_len value: an integer >= 1 (not a bool, a fraction or a string)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def check_acc(acc, where: str, cap: int | None = None) -> tuple[int, ...]:
    """One request's acc_len list checked: integers (not bools, not fractions, not strings) >= 1 and, when the
    recording's cap is known, <= cap (= k_recorded + 1). Anything else is a one-line error: a value <= 0 would
    make a replay advance by nothing and never end."""
    if not isinstance(acc, (list, tuple)) or not acc:
        raise SpecdecError(f"{where}: acc_len must be a non-empty list of integers >= 1, got {acc!r:.60}")
    bad = next((v for v in acc if not _is_count(v)), None)
    if bad is not None:
        raise SpecdecError(f"{where}: acc_len values must be integers >= 1, got {bad!r}")
    if cap is not None and max(acc) > cap:
        raise SpecdecError(f"{where}: acc_len value {max(acc)} exceeds the recording's cap {cap} (k_max + 1)")
    return tuple(acc)


def _read_paper_line(line: str, where: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        obj = None
    return _paper_row(obj, where)


def _paper_row(obj, where: str) -> dict:
    """One parsed line of the simulator's format as {"id", "prompt_len", "acc": {proposer: acc_len}}."""
    try:
        acc = {p: obj[f"acc_{p}"]["acc_len"] for p in PROPOSERS if f"acc_{p}" in obj}
        if not acc or not all(isinstance(v, list) and all(map(_is_count, v)) for v in acc.values()):
            raise ValueError
        return {"id": str(obj["id"]), "prompt_len": len(obj["prompt_token_ids"]), "acc": acc}
    except (KeyError, TypeError, ValueError):
        raise SpecdecError(f"{where}: expected the simulator format (id, prompt_token_ids, acc_eagle/acc_ngram "
                           f"with acc_len lists of ints >= 1)") from None


def import_paper(src: str | Path, name: str, held_out: list[str], pair: str, profile: str,
                 match_prob: dict[str, float], source_note: str, licence: str, out_root: Path | None = None,
                 echo=print, commit: str | None = None) -> Path:
    """Convert every combined_<dataset>.jsonl under `src` (a folder, as in the simulator's data/<model>/) into
    data/traces/<name>/. Refuses to overwrite an existing collection (raw data is immutable)."""
    src = Path(src)
    files = sorted(src.glob("combined_*.jsonl")) if src.is_dir() else [src]
    files = [f for f in files if f.exists()]
    if not files:
        raise SpecdecError(f"no combined_<dataset>.jsonl files at {src}")
    final = (out_root or traces_root()) / name
    if final.exists():
        raise SpecdecError(f"trace collection {final} exists already; remove it by hand to re-import")
    out = final.with_name(f".{name}.importing")  # written whole, then renamed: a failed import leaves nothing
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    try:
        meta = _convert(files, out, name, held_out, pair, profile, match_prob, source_note, licence, echo,
                        commit or _git_commit(src if src.is_dir() else src.parent))
        (out / "source.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        out.rename(final)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return final


def _convert(files: list[Path], out: Path, name: str, held_out: list[str], pair: str, profile: str,
             match_prob: dict[str, float], source_note: str, licence: str, echo, commit: str) -> dict:
    """Write one converted <dataset>.jsonl per source file into `out`; returns the collection's source.json."""
    datasets = {}
    for f in files:
        dataset = f.stem.removeprefix("combined_")
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            raise SpecdecError(f"{f.name}: not a text (JSONL) file") from None
        rows = [_read_paper_line(line, f"{f.name} line {i}")
                for i, line in enumerate(text.splitlines(), start=1) if line.strip()]
        if not rows:
            raise SpecdecError(f"{f.name}: no requests")
        (out / f"{dataset}.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
        cap = max(max(v) for r in rows for v in r["acc"].values() if v)
        datasets[dataset] = {"file": f.name, "sha256": _sha256(f), "requests": len(rows), "max_acc_len": cap,
                             "held_out": dataset in held_out, "ngram_match_prob": match_prob.get(dataset)}
        echo(f"{dataset}: {len(rows)} requests, acc_len up to {cap}" + (" (held out)" if dataset in held_out else ""))
    return {"name": name, "pair": pair, "profile": profile, "source": source_note, "licence": licence,
            "source_commit": commit, "datasets": datasets, "cap": max(d["max_acc_len"] for d in datasets.values()),
            "format": "one request per line: id, prompt_len [tokens], acc: {proposer: acc_len per output position}"}


def collections() -> list[str]:
    return sorted(p.parent.name for p in traces_root().glob("*/source.json"))


def source(name: str) -> dict:
    path = traces_root() / name / "source.json"
    if not path.exists():
        raise SpecdecError(f"unknown trace collection '{name}'; known: {', '.join(collections()) or 'none'}")
    return json.loads(path.read_text())


def datasets(name: str, held_out: bool | None = None) -> list[str]:
    """Datasets of a collection; held_out=False: only those for building and testing, True: only held-out."""
    ds = source(name)["datasets"]
    return sorted(d for d, m in ds.items() if held_out is None or bool(m["held_out"]) == held_out)


@lru_cache(maxsize=64)
def load(name: str, dataset: str, proposer: str) -> TraceSet:
    """One dataset's requests for one proposer ("eagle" or "ngram"); unknown names are one-line errors."""
    meta = source(name)
    if dataset not in meta["datasets"]:
        raise SpecdecError(f"collection '{name}' has no dataset '{dataset}'; known: {', '.join(sorted(meta['datasets']))}")
    if proposer not in PROPOSERS:
        raise SpecdecError(f"unknown traced proposer '{proposer}'; known: {', '.join(PROPOSERS)}")
    reqs = []
    path = traces_root() / name / f"{dataset}.jsonl"
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            r = _converted_row(_json_line(line, f"{name}/{path.name} line {i}"), f"{name}/{path.name} line {i}")
            if r["acc"].get(proposer):
                reqs.append(Request(r["id"], r["prompt_len"],
                                    check_acc(r["acc"][proposer], f"{name}/{path.name} line {i}", int(meta["cap"]))))
    if not reqs:
        raise SpecdecError(f"{name}/{dataset} has no '{proposer}' traces")
    dm = meta["datasets"][dataset]
    return TraceSet(name, dataset, proposer, tuple(reqs), int(meta["cap"]),
                    dm.get("ngram_match_prob") if proposer == "ngram" else None, bool(dm["held_out"]),
                    meta["pair"], meta["profile"])


def for_profile(profile: str) -> list[str]:
    """Collections recorded on this hardware profile."""
    return [c for c in collections() if source(c)["profile"] == profile]


def steps(acc_len, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Replay one request at k: (start position of each step, tokens each step emits = min(acc_len, k+1)).

    The first output token comes from the prefill, so steps start at position 1 (0-based index into acc_len
    is position - 1, as in the simulator) and run until len(acc_len) tokens exist."""
    if k < 1:
        raise SpecdecError(f"k must be >= 1 to replay a trace, got {k}")
    acc = np.asarray(acc_len)
    starts, emitted = [], []
    cur = 1
    if len(acc) and acc.min() < 1:
        raise SpecdecError(f"acc_len values must be >= 1 (a step emits at least one token), got {acc.min()}")
    while cur < len(acc):
        e = min(int(acc[cur - 1]), k + 1)
        starts.append(cur)
        emitted.append(e)
        cur += e
    return np.asarray(starts, dtype=int), np.asarray(emitted, dtype=int)


def _json_line(line: str, where: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        raise SpecdecError(f"{where}: not a JSON line") from None


def _converted_row(obj, where: str) -> dict:
    """One parsed line of a converted trace file: {"id", "prompt_len" (int >= 0), "acc": {proposer: acc_len}}."""
    if not isinstance(obj, dict) or not isinstance(obj.get("acc"), dict) or "id" not in obj:
        raise SpecdecError(f"{where}: expected {{\"id\", \"prompt_len\", \"acc\": {{proposer: acc_len}}}}")
    plen = obj.get("prompt_len")
    if isinstance(plen, bool) or not isinstance(plen, int) or plen < 0:
        raise SpecdecError(f"{where}: prompt_len must be an integer >= 0, got {plen!r}")
    return {"id": str(obj["id"]), "prompt_len": plen, "acc": obj["acc"]}


def _from_file(path: Path, proposer: str) -> TraceSet:
    meta = path.parent / "source.json"
    try:
        m = json.loads(meta.read_text()) if meta.exists() else {}
    except json.JSONDecodeError:
        m = {}
    m = m if isinstance(m, dict) else {}
    known_cap = m.get("cap") if isinstance(m.get("cap"), int) else None
    reqs, cap = [], 1
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name} line {i}"
        obj = _json_line(line, where)
        r = _converted_row(obj, where) if isinstance(obj, dict) and "acc" in obj else _paper_row(obj, where)
        acc = r["acc"].get(proposer)
        if acc:
            reqs.append(Request(r["id"], r["prompt_len"], check_acc(acc, where, known_cap)))
            cap = max(cap, max(acc))
    if not reqs:
        raise SpecdecError(f"{path.name} has no '{proposer}' per-position traces")
    dm = m.get("datasets", {}).get(path.stem, {})
    return TraceSet(m.get("name", path.parent.name), path.stem, proposer, tuple(reqs), known_cap or cap,
                    dm.get("ngram_match_prob") if proposer == "ngram" else None, bool(dm.get("held_out", False)),
                    m.get("pair", "unknown"), m.get("profile", "unknown"))


def resolve(spec: str, proposer: str) -> TraceSet | None:
    """A TraceSet from COLLECTION/DATASET or from a per-position trace file; None for a file of engine step
    traces ({"k", "accepted"} lines, read by acceptance.read_jsonl). Errors are one line."""
    path = Path(spec)
    if not path.is_file():
        name, _, dataset = spec.partition("/")
        if dataset and (traces_root() / name / "source.json").exists():
            if proposer not in PROPOSERS:
                raise SpecdecError(f"collection '{name}' traces proposers {', '.join(PROPOSERS)}; "
                                   f"pass --proposer eagle or ngram, not '{proposer}'")
            return load(name, dataset, proposer)
        raise SpecdecError(f"traces '{spec}' is neither a file nor COLLECTION/DATASET "
                           f"(collections: {', '.join(collections()) or 'none'})")
    try:
        first = next((json.loads(line) for line in path.read_text().splitlines() if line.strip()), None)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise SpecdecError(f"cannot read traces file {path}: not JSONL") from None
    if first is None:
        raise SpecdecError(f"traces file {path} is empty")
    if not isinstance(first, dict):
        raise SpecdecError(f"traces file {path}: each line must be a JSON object")
    if "accepted" in first:
        return None
    if proposer not in PROPOSERS:
        raise SpecdecError(f"{path.name} holds per-position traces of {', '.join(PROPOSERS)}; pass --proposer "
                           f"eagle or ngram, not '{proposer}'")
    return _from_file(path, proposer)
