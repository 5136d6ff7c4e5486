"""One module per study stem (configs/<stem>.yaml, data/raw/<profile>/<stem>/, notebooks/<stem>.ipynb,
figures/<profile>/<stem>-*): each says which tables the study computes and which figures it draws from them.

  compute(stem, profile) -> Outputs   every table of the study (views: measured or predicted), with its note
  draw(outputs)      -> {name: Figure}   figures from the tables alone: nothing is recomputed
  Outputs.save() writes build/<profile>/<name>.csv and build/<profile>/<stem>-notes.json;
  Outputs.load(stem, profile) reads them back, so `specdec figures --gpu G` re-draws without recomputing.

A study is declared once, in its module: SOURCE (the raw study, or tuple of raw studies, whose runs make it
measured: views.mode labels its notebook and figures; None for a study that is neither measured nor predicted),
TABLES, FIGURES and FILES (what its notebook writes), READS (the raw studies its notebook reads: the Makefile's
prerequisites, checked by tests/test_studies.py), tables(profile) -> ({name: DataFrame}, {name: note}),
figures(outputs) -> {name: Figure} (report/figures.py functions on the tables only) and optionally
files(outputs) -> {filename: text}. STEMS (the modules here) and OUTPUTS derive from them.
"""
from __future__ import annotations

import importlib
import json
import pkgutil
from dataclasses import dataclass, field

import pandas as pd

from ..data import hardware as profiles
from ..errors import SpecdecError
from ..report import figures, views

STEMS = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)))  # one module per study


def module(stem: str):
    if stem not in STEMS:
        raise SpecdecError(f"unknown study '{stem}'; known: {', '.join(STEMS)}")
    return importlib.import_module(f"{__name__}.{stem}")


def _outputs(stem: str) -> dict:
    mod = module(stem)
    return {"figures": list(mod.FIGURES), "tables": list(mod.TABLES), "files": [*mod.FILES, f"{stem}-notes.json"]}


# What each notebook (notebooks/<stem>.ipynb) writes: figures/<profile>/<name>.{png,pdf}, build/<profile>/<name>.csv
# and other build/<profile>/ files, from the study modules' declarations.
OUTPUTS = {stem: _outputs(stem) for stem in STEMS}


@dataclass
class Outputs:
    """The tables of one study on one profile: DataFrames by name, and notes (why a table is empty, or a
    short text a figure shows) by name."""

    stem: str
    profile: str
    tables: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    def note(self, name: str) -> str:
        return self.notes.get(name, "")

    def save(self) -> None:
        """build/<profile>/<name>.csv per table, <stem>-notes.json, and the study's text files (claims.md, ...)."""
        for name, df in self.tables.items():
            figures.save_table(df, self.profile, name)
        figures.save_text(json.dumps(self.notes, indent=1, sort_keys=True), self.profile, f"{self.stem}-notes.json")
        files = getattr(module(self.stem), "files", None)
        for name, text in (files(self) if files else {}).items():
            figures.save_text(text, self.profile, name)

    @classmethod
    def load(cls, stem: str, profile: str) -> "Outputs":
        """The tables a previous compute().save() wrote under build/<profile>/; a missing one is a one-line error."""
        folder = figures.build_dir(profile)
        out = cls(stem, profile)
        for name in OUTPUTS[stem]["tables"]:
            path = folder / f"{name}.csv"
            if not path.exists():
                raise SpecdecError(f"no saved table {path} (run `make nb-{stem} GPU={profile}` first)")
            try:
                df = pd.read_csv(path)
                text = df.select_dtypes(["object", "str"]).columns  # CSV cannot tell "" from missing: text stays text
                out.tables[name] = df.fillna({c: "" for c in text})
            except pd.errors.EmptyDataError:
                out.tables[name] = pd.DataFrame()
        notes = folder / f"{stem}-notes.json"
        out.notes = json.loads(notes.read_text()) if notes.exists() else {}
        return out


def compute(stem: str, profile: str) -> Outputs:
    """Every table of a study on `profile`, computed now from the processed tables (or predicted)."""
    tabs, notes = module(stem).tables(profile)
    return Outputs(stem, profile, tabs, {k: v for k, v in notes.items() if v})


def draw(out: Outputs) -> dict:
    """The study's figures from its tables, each stamped with where its numbers come from."""
    mod = module(out.stem)
    figs = mod.figures(out)
    want = OUTPUTS[out.stem]["figures"]
    if list(figs) != want:
        raise SpecdecError(f"study {out.stem} drew {list(figs)}, its FIGURES are {want}")
    if mod.SOURCE:
        src = mode(out.stem, out.profile)
        figs = {name: figures.stamp(fig, src) for name, fig in figs.items()}
    return figs


def sources(stem: str) -> tuple:
    """The raw studies whose runs make study `stem` measured (its SOURCE as a tuple; () for none)."""
    src = module(stem).SOURCE
    return (src,) if isinstance(src, str) else tuple(src or ())


def mode(stem: str, profile: str) -> views.Source:
    """Whether study `stem` on `profile` is shown measured, predicted, or not at all (views.mode of its SOURCE)."""
    return views.mode(profile, sources(stem))


def check(profile: str) -> list[str]:
    """`<stem>: MEASURED|PREDICTED|NO DATA: why`, one line per study with a SOURCE; an unknown profile, or one
    where no study has anything to show, is a one-line error."""
    shown = [s for s in STEMS if sources(s)]
    if not any(views.measured(profile, r) for s in shown for r in sources(s)):
        profiles.load_profile(profile)
    lines = [f"{s}: {mode(s, profile).label}" for s in shown]
    if all(": NO DATA" in line for line in lines):
        raise SpecdecError(f"profile '{profile}' has nothing to show: no raw data in data/raw/{profile} and no "
                           f"prediction source ({views.mode(profile, 'batch').text})")
    return lines


def save_figures(figs: dict, profile: str, close: bool = False) -> None:
    """figures/<profile>/<name>.png|pdf per figure (close: free them; a notebook keeps them to show them)."""
    for name, fig in figs.items():
        figures.save(fig, profile, name)
        if close:
            figures.plt.close(fig)


def redraw(profile: str, stems=None, echo=print) -> list[str]:
    """Re-draw the figures of each study from its saved tables (no measurement, no bootstrap)."""
    done = []
    for stem in stems or STEMS:
        if not OUTPUTS[stem]["figures"]:
            continue
        figs = draw(Outputs.load(stem, profile))
        save_figures(figs, profile, close=True)
        echo(f"{stem}: {', '.join(figs)} -> {figures.figures_dir(profile)}")
        done += list(figs)
    return done
