"""``rlhfsim lengths import`` and ``report``: TRL completions logs and verl-style dumps round-trip into a
trace with pairing and groups kept; plain tables with counts or text; Parquet; fits; one-line errors."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from calibrate.frameworks.base import FrameworkStep, RolloutLength
from calibrate.frameworks.trl import write_completions_log
from rlhfsim.errors import RlhfsimError
from rlhfsim.lengths.fit import fit_lengths
from rlhfsim.lengths.importers import detect_format, import_lengths
from rlhfsim.workload.lengths import read_lengths_file
from rlhfsim.workload.trace import TraceRow, read_trace


def _steps():
    """Two TRL steps of 2 prompts x 3 completions, prompt ids as TRL's sampler shuffles them."""
    out, texts = [], []
    for s, pids in enumerate(((5, 2), (0, 7))):
        rs, ts = [], []
        for k, pid in enumerate(pids):
            for j in range(3):
                rl = 1 + j + 3 * k + 10 * s
                rs.append(RolloutLength(pid, j, 4 + pid, rl))
                ts.append({"prompt": " ".join(["w2"] * (4 + pid)), "completion": " ".join(["w3"] * (rl - 1))})
        out.append(FrameworkStep(s, 1.0, 1.0, {}, tuple(rs)))
        texts.append(ts)
    return out, texts


def _expected(steps):
    return [TraceRow(s.step, r.prompt_id, r.rollout, r.prompt_len, r.response_len) for s in steps for r in s.rollouts]


def test_trl_completions_log_round_trips_through_the_cli(cli, tmp_path):
    steps, texts = _steps()
    log = tmp_path / "completions.jsonl"
    write_completions_log(log, steps, texts, {"framework": "trl", "algorithm": "grpo"})
    assert detect_format(log) == "trl"
    p = cli("lengths", "import", log, "--trace", tmp_path / "t.csv", "--empirical", tmp_path / "e.csv")
    assert p.returncode == 0, p.stderr
    assert "12 rollouts, 2 step(s), 4 prompt group(s) of 3" in p.stdout
    assert read_trace(tmp_path / "t.csv", "x") == _expected(steps)
    assert read_lengths_file(tmp_path / "e.csv", "x").tolist() == [r.response_len for s in steps for r in s.rollouts]


def _verl_dump(d, steps):
    """verl's rollout_data_dir: {step}.jsonl, one completion per line, a prompt's group consecutive."""
    d.mkdir()
    for s, groups in steps.items():
        lines = []
        for prompt, outs in groups:
            lines += [json.dumps({"input": prompt, "output": o, "gts": "", "score": 0.0, "step": s}) for o in outs]
        (d / f"{s}.jsonl").write_text("\n".join(lines) + "\n")


VERL = {1: [("a b c", ["x", "x y", "x y z"]), ("d e", ["x y", "x"]  + ["x y z w"])],
        2: [("a b c", ["x"] * 3), ("f", ["x y"] * 3)],
        10: [("g h", ["x y z"] * 3), ("g h i j", ["x"] * 3)]}


def test_verl_dump_directory_keeps_pairing_and_groups(tmp_path):
    _verl_dump(tmp_path / "dump", VERL)
    assert detect_format(tmp_path / "dump") == "verl"
    rows = import_lengths(tmp_path / "dump", tokenizer="whitespace")
    expect, pid = [], 0
    for s in (1, 2, 10):   # numeric order of the file names, not 1, 10, 2
        for prompt, outs in VERL[s]:
            expect += [TraceRow(s, pid, j, len(prompt.split()), len(o.split())) for j, o in enumerate(outs)]
            pid += 1
    assert rows == expect


def test_verl_single_jsonl_round_trips_through_the_cli(cli, tmp_path):
    _verl_dump(tmp_path / "dump", VERL)
    one = tmp_path / "all.jsonl"
    one.write_text("".join((tmp_path / "dump" / f"{s}.jsonl").read_text() for s in (1, 2, 10)))
    p = cli("lengths", "import", one, "--tokenizer", "whitespace", "--trace", tmp_path / "t.jsonl", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["rollouts"] == 18 and doc["steps"] == 3 and doc["prompts"] == 6 and doc["group_sizes"] == [3]
    assert read_trace(tmp_path / "t.jsonl", "x") == import_lengths(tmp_path / "dump", tokenizer="whitespace")


@pytest.mark.hw
def test_a_local_tokenizer_directory_counts_text(tmp_path):
    pytest.importorskip("transformers")
    from calibrate.frameworks.trl import build_tokenizer

    build_tokenizer(64).save_pretrained(tmp_path / "tok")
    _verl_dump(tmp_path / "dump", {0: [("w2 w3 w4", ["w5 w6", "w7"])]})
    rows = import_lengths(tmp_path / "dump", tokenizer=str(tmp_path / "tok"))
    assert rows == [TraceRow(0, 0, 0, 3, 2), TraceRow(0, 0, 1, 3, 1)]


def test_plain_csv_with_counts_group_size_and_steps(tmp_path):
    p = tmp_path / "lens.csv"
    p.write_text("prompt_tokens,response_tokens\n" + "".join(f"{10 + i // 2},{i + 1}\n" for i in range(8)))
    rows = import_lengths(p, group_size=2, prompts_per_step=2)
    assert rows == [TraceRow(i // 4, i // 2, i % 2, 10 + i // 2, i + 1) for i in range(8)]


def test_parquet_tables_and_trl_parquet_logs(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"step": [0, 0, 0, 0], "prompt_len": [3, 3, 5, 5], "response_len": [1, 2, 3, 4]}),
                   tmp_path / "t.parquet")
    assert import_lengths(tmp_path / "t.parquet", group_size=2) == [
        TraceRow(0, 0, 0, 3, 1), TraceRow(0, 0, 1, 3, 2), TraceRow(0, 1, 0, 5, 3), TraceRow(0, 1, 1, 5, 4)]
    # TRL's own log_completions files: completions/completions_00001.parquet with text columns
    d = tmp_path / "completions"
    d.mkdir()
    pq.write_table(pa.table({"step": [1, 1], "prompt": ["a b", "a b"], "completion": ["x", "x y z"],
                             "advantage": [0.1, -0.1]}), d / "completions_00001.parquet")
    assert detect_format(d) == "trl"
    assert import_lengths(d, tokenizer="whitespace") == [TraceRow(1, 0, 0, 2, 1), TraceRow(1, 0, 1, 2, 3)]


def test_parquet_without_pyarrow_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(RlhfsimError, match=r"reading Parquet needs pyarrow"):
        import_lengths(tmp_path / "t.parquet")


@pytest.mark.parametrize("name,text,args,fragment", [
    ("missing.jsonl", None, [], "expected a rollout log file or directory, found none"),
    ("bad.jsonl", '{"input": "a",\n', [], "malformed line 1"),
    ("text.jsonl", '{"input": "a b", "output": "c"}\n', [], "pass --tokenizer"),
    ("odd.xlsx", "x", [], "expected a .csv, .jsonl or .parquet file"),
    ("nolen.csv", "a,b\n1,2\n", [], "expected a response length"),
    ("neg.csv", "prompt_len,response_len\n3,-1\n", [], "response length >= 0"),
    ("tok.jsonl", '{"input": "a", "output": "b"}\n', ["--tokenizer", "/no/such/dir"], "local tokenizer directory"),
])
def test_bad_input_is_one_line_exit_2(cli, tmp_path, name, text, args, fragment):
    p = tmp_path / name
    if text is not None:
        p.write_text(text)
    r = cli("lengths", "import", p, "--trace", tmp_path / "out.csv", *args)
    assert r.returncode == 2, r.stdout
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert fragment in r.stderr, r.stderr


def test_fits_recover_the_parameters():
    rng = np.random.default_rng(0)
    ln = fit_lengths(np.rint(rng.lognormal(np.log(100), 0.8, 20000)).clip(1))["lognormal"]["dist"]
    assert ln["median"] == pytest.approx(100, rel=0.03)
    assert ln["p99"] == pytest.approx(100 * np.exp(2.3263 * 0.8), rel=0.05)
    pa = fit_lengths(20 * (1 - rng.random(20000)) ** (-1 / 1.5))["pareto"]["dist"]
    assert pa["alpha"] == pytest.approx(1.5, rel=0.05) and pa["scale"] == pytest.approx(20, rel=0.01)


def test_report_json_html_and_figure(cli, tmp_path):
    from rlhfsim.lengths.fit import fitted_curves, summarize
    from rlhfsim.report.lengths_fit import LengthRecords, lengths_figure

    steps, texts = _steps()
    write_completions_log(tmp_path / "log.jsonl", steps, texts, {"framework": "trl"})
    r = cli("lengths", "report", tmp_path / "log.jsonl", "--json", "-o", tmp_path / "r.html")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc["fits"]) == {"lognormal", "pareto"} and doc["summary"]["n"] == 12
    assert doc["fits"]["lognormal"]["dist"]["kind"] == "lognormal" and 0 <= doc["fits"]["pareto"]["ks"] <= 1
    assert "plotly" in (tmp_path / "r.html").read_text().lower()
    lengths = [x.response_len for s in steps for x in s.rollouts]
    fits, grid = fit_lengths(lengths), np.linspace(1, 30, 20)
    fig = lengths_figure(LengthRecords("t", tuple(lengths), summarize(lengths), fits, tuple(grid), fitted_curves(fits, grid)))
    assert len(fig.data) == 2 + 2 * 2   # histogram, empirical tail, pdf and tail of each fit
