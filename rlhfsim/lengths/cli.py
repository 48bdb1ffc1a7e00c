"""``rlhfsim lengths``: import real rollout logs as a trace or empirical length file, and report them
against parametric fits. Each command parses, calls the library (``importers``, ``fit``) and writes."""

from __future__ import annotations

import json
from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError

FORMATS = ("auto", "trl", "verl", "table")


def _source_options(f):
    f = click.option("--prompts-per-step", type=click.IntRange(min=1),
                     help="Re-cut the prompt groups into steps of this many prompts (for logs without steps).")(f)
    f = click.option("--group-size", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Rows per prompt group when the log has neither prompt text nor prompt ids.")(f)
    f = click.option("--tokenizer", metavar="DIR|whitespace",
                     help="Count text with this local tokenizer directory (transformers), or 'whitespace' (words).")(f)
    f = click.option("--format", "fmt", type=click.Choice(FORMATS), default="auto", show_default=True,
                     help="trl: the TRL adapter's completions log or TRL's completions Parquet; verl: rollout "
                          "dumps (input/output per line); table: CSV/JSONL/Parquet with counts or text.")(f)
    return click.argument("source", type=click.Path(path_type=Path))(f)


def _load(source, fmt, tokenizer, group_size, prompts_per_step):
    from rlhfsim.lengths.importers import import_lengths

    return import_lengths(source, fmt, tokenizer, group_size, prompts_per_step)


@click.group("lengths")
def lengths_group():
    """Real rollout logs as workload input (trace and empirical length files) and their fits."""


@lengths_group.command("import")
@_source_options
@click.option("--trace", "trace_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a trace (workload.response_length: {kind: trace}); .csv or .jsonl.")
@click.option("--empirical", "empirical_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the response lengths as an empirical file (workload.response_length: {kind: empirical}).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def import_command(source, fmt, tokenizer, group_size, prompts_per_step, trace_out, empirical_out, as_json):
    """Import SOURCE (a rollout log file or directory) as a trace and/or empirical length file."""
    from rlhfsim.lengths.fit import summarize
    from rlhfsim.workload.trace import write_trace

    if trace_out is None and empirical_out is None and not as_json:
        raise click.UsageError("expected --trace FILE and/or --empirical FILE (or --json for the summary only)")
    rows = _load(source, fmt, tokenizer, group_size, prompts_per_step)
    try:
        if trace_out is not None:
            write_trace(trace_out, rows)
        if empirical_out is not None:
            empirical_out.parent.mkdir(parents=True, exist_ok=True)
            empirical_out.write_text("response_length\n" + "".join(f"{r.response_len}\n" for r in rows))
    except OSError as e:
        raise RlhfsimError(f"{e.filename}: cannot write ({e.strerror})") from None
    groups = {}
    for r in rows:
        groups.setdefault((r.step, r.prompt_id), 0)
        groups[(r.step, r.prompt_id)] += 1
    doc = {"source": str(source), "rollouts": len(rows), "steps": len({r.step for r in rows}),
           "prompts": len(groups), "group_sizes": sorted(set(groups.values())),
           "response_length": summarize([r.response_len for r in rows]),
           "prompt_length": summarize([r.prompt_len for r in rows]),
           "trace": str(trace_out) if trace_out else None, "empirical": str(empirical_out) if empirical_out else None}
    if as_json:
        click.echo(json.dumps(doc))
        return
    rl = doc["response_length"]
    click.echo(f"{doc['rollouts']} rollouts, {doc['steps']} step(s), {doc['prompts']} prompt group(s) of "
               f"{'/'.join(map(str, doc['group_sizes']))}; response length median {rl['median']:.0f}, "
               f"p90 {rl['p90']:.0f}, p99 {rl['p99']:.0f}, max {rl['max']:.0f}")
    for what, p in (("trace", trace_out), ("empirical", empirical_out)):
        if p is not None:
            click.echo(f"wrote {what} {p}")


@lengths_group.command("report")
@_source_options
@click.option("-o", "out_html", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a self-contained HTML page (histogram and tail against the fits).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary and fits as JSON.")
def report_command(source, fmt, tokenizer, group_size, prompts_per_step, out_html, as_json):
    """Show SOURCE's response lengths next to lognormal and Pareto fits (scipy)."""
    import numpy as np

    from rlhfsim.lengths.fit import fit_lengths, fitted_curves, summarize

    rows = _load(source, fmt, tokenizer, group_size, prompts_per_step)
    lengths = [r.response_len for r in rows]
    try:
        fits = fit_lengths(lengths)
    except ValueError as e:
        raise RlhfsimError(f"{source}: {e}, got {len(set(lengths))} distinct length(s)") from None
    summary = summarize(lengths)
    if out_html is not None:
        from rlhfsim.report.lengths_fit import LengthRecords, lengths_report_html

        grid = np.unique(np.geomspace(max(min(lengths), 1), max(lengths), 200))
        curves = {k: {kk: tuple(float(v) for v in vv) for kk, vv in c.items()} for k, c in fitted_curves(fits, grid).items()}
        rec = LengthRecords(str(source), tuple(lengths), summary, fits, tuple(float(g) for g in grid), curves)
        try:
            out_html.parent.mkdir(parents=True, exist_ok=True)
            out_html.write_text(lengths_report_html(rec))
        except OSError as e:
            raise RlhfsimError(f"{out_html}: cannot write ({e.strerror})") from None
    if as_json:
        click.echo(json.dumps({"source": str(source), "summary": summary,
                               "fits": {k: {kk: v for kk, v in f.items()} for k, f in fits.items()}}))
        return
    click.echo(f"{summary['n']} responses: median {summary['median']:.0f}, p90 {summary['p90']:.0f}, "
               f"p99 {summary['p99']:.0f}, max {summary['max']:.0f} ({100 * summary['capped_fraction']:.0f}% at the max)")
    for name, f in fits.items():
        click.echo(f"  {name:9} {json.dumps(f['dist'])}  KS {f['ks']:.3f}  log-likelihood {f['loglik']:.1f}")
    if out_html is not None:
        click.echo(f"wrote {out_html}")
