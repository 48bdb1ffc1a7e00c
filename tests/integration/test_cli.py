"""The ``rlhfsim`` command line, run as a real process: outputs, files, catalogs, and bad input as one
line on stderr with exit code 2 and no traceback."""

from __future__ import annotations

import csv
import json
import re

import pytest
import yaml

FIELDS = ("step_time_s", "phases_s", "gpu_utilization", "gpu_busy", "gpu_active", "tokens_per_s", "steps")


@pytest.fixture(scope="module")
def tiny_yaml(fixtures_dir):
    return fixtures_dir / "tiny.yaml"


def test_simulate_json(cli, tiny_yaml):
    p = cli("simulate", tiny_yaml, "--steps", 3, "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    for k in FIELDS:
        assert k in doc
    assert doc["steps"] == 3 and doc["schedule"] == "oppo" and doc["scenario"] == "tiny"
    assert doc["step_time_s"] > 0 and doc["tokens_per_s"] > 0
    assert set(doc["gpu_utilization"]) == set(doc["gpu_busy"]) == set(doc["gpu_active"]) == {"all"}
    assert doc["gpu_busy"] == doc["gpu_utilization"]
    assert 0 < doc["gpu_active"]["all"] <= doc["gpu_busy"]["all"] <= 1


def test_simulate_table(cli, tiny_yaml):
    p = cli("simulate", tiny_yaml, "--steps", 2, "--compare", "sync,oppo")
    assert p.returncode == 0, p.stderr
    assert "step time" in p.stdout and "generate" in p.stdout and "GPU utilization" in p.stdout
    doc = json.loads(cli("simulate", tiny_yaml, "--steps", 2, "--format", "json").stdout)
    # The utilization table: a busy and an active column, the pool's row with both percentages.
    row = next(line for line in p.stdout.splitlines() if "│ all " in line and "%" in line)
    busy, active = (f"{100 * doc[k]['all']:.1f}%" for k in ("gpu_busy", "gpu_active"))
    assert "busy" in p.stdout and "active" in p.stdout and busy in row and active in row
    # The comparison table: each variant's pools as busy%/active%.
    assert all(re.search(rf"│ {name} .* all \d+%/\d+% ", p.stdout) for name in ("sync", "oppo")), p.stdout


def test_simulate_out_dir(cli, tiny_yaml, tmp_path):
    out = tmp_path / "run"
    p = cli("simulate", tiny_yaml, "--steps", 3, "--out", out, "--format", "json")
    assert p.returncode == 0, p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(p.stdout)
    with open(out / "steps.csv") as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == 3 and {"step", "step_time_s", "generated_tokens"} <= set(steps[0])
    with open(out / "intervals.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "pool", "gpu", "role", "phase", "start_s", "end_s", "active_s"]
    assert len(rows) > 3
    for r in rows[1:]:
        assert int(r[0]) in (0, 1, 2) and r[1] == "all" and r[2] == "0"
        assert float(r[6]) >= float(r[5]) >= 0
        assert 0 <= float(r[7]) <= float(r[6]) - float(r[5]) + 2e-6


def test_seed_option(cli, tiny_yaml):
    a = json.loads(cli("simulate", tiny_yaml, "--steps", 2, "--seed", 3, "--format", "json").stdout)
    b = json.loads(cli("simulate", tiny_yaml, "--steps", 2, "--seed", 3, "--format", "json").stdout)
    c = json.loads(cli("simulate", tiny_yaml, "--steps", 2, "--seed", 4, "--format", "json").stdout)
    assert a == b
    assert a["step_time_s"] != c["step_time_s"]


def test_compare_option(cli, tiny_yaml):
    p = cli("simulate", tiny_yaml, "--steps", 2, "--compare", "sync,oppo", "--format", "json")
    assert p.returncode == 0, p.stderr
    v = json.loads(p.stdout)["variants"]
    assert set(v) == {"sync", "oppo"} and v["sync"]["speedup"] == pytest.approx(1.0)


def test_schema_prints_json_schema(cli):
    p = cli("schema")
    assert p.returncode == 0
    schema = json.loads(p.stdout)
    assert schema["title"] == "Scenario" and schema["type"] == "object"
    assert {"models", "cluster", "placement", "workload", "schedule"} <= set(schema["properties"])
    assert "description" in schema["$defs"]["Workload"]["properties"]["prompts_per_step"]


def test_models_and_gpus_list_the_catalogs(cli):
    from rlhfsim.hardware.catalog import GPUS
    from rlhfsim.models.catalog import CATALOG

    p = cli("models")
    assert p.returncode == 0 and all(name in p.stdout for name in CATALOG)
    rows = json.loads(cli("models", "--format", "json").stdout)
    assert [r["name"] for r in rows] == list(CATALOG)
    q7 = next(r for r in rows if r["name"] == "qwen2.5-7b")
    assert q7["params_b"] == pytest.approx(7.6, abs=0.1) and q7["layers"] == 28
    p = cli("gpus")
    assert p.returncode == 0 and all(name in p.stdout for name in GPUS)
    gpus = json.loads(cli("gpus", "--format", "json").stdout)
    assert {g["name"] for g in gpus} == set(GPUS)
    # One memory unit throughout: every capacity a whole number of GiB (a100-80gb 80.0, h200 141.0).
    assert all(float(g["memory_gib"]).is_integer() for g in gpus), gpus
    assert {"b200", "mi300x", "h20", "l4", "a10g", "h100-pcie"} <= set(GPUS)


def test_help_lists_commands(cli):
    p = cli("--help")
    assert p.returncode == 0
    for cmd in ("simulate", "schema", "models", "gpus"):
        assert cmd in p.stdout


# --- bad input --------------------------------------------------------------------------------------
def _write(tmp_path, doc, name="s.yaml"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return p


def _tiny(fixtures_dir):
    return yaml.safe_load((fixtures_dir / "tiny.yaml").read_text())


def _bad_cases(fixtures_dir, tmp_path):
    """(id, path to a bad scenario file, expected stderr prefix after 'error: ')."""
    tiny = _tiny(fixtures_dir)
    cases = []

    def add(name, mutate, prefix):
        d = json.loads(json.dumps(tiny))
        mutate(d)
        # Next to the fixtures' mixin and lengths file, so only the mutation is wrong.
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump(d))
        cases.append((name, p, prefix))

    add("unknown-key", lambda d: d["workload"].update(batch=4), "workload.batch: expected a known key")
    add("wrong-type", lambda d: d.update(steps="ten"), "steps: expected an integer, got 'ten'")
    add("out-of-range", lambda d: d["generation"].update(kv_cache_fraction=0), "generation.kv_cache_fraction: expected a number > 0")
    add("too-big-model", lambda d: d["models"]["actor"].update(model="qwen2.5-72b", dtype="bfloat16"),
        "placement.tp.actor: models on pool 'all' need")
    add("too-many-gpus", lambda d: d.update(placement={"kind": "pools", "pools": [
        {"name": "a", "gpus": 1, "roles": ["actor", "reference"]}, {"name": "b", "gpus": 1, "roles": ["reward"]}]}),
        "placement.pools[1].gpus: 2 GPUs placed but the cluster has 1")
    add("lengths-missing", lambda d: d["workload"]["response_length"].update(path="nope.csv"),
        "workload.response_length.path: expected a CSV or JSONL file of lengths")
    add("lengths-empty", lambda d: d["workload"]["response_length"].update(path="lengths_empty.csv"),
        "workload.response_length.path: expected at least one length")
    add("lengths-malformed", lambda d: d["workload"]["response_length"].update(path="lengths_malformed.csv"),
        "workload.response_length.path: expected one positive length per line")
    cases.append(("yaml-syntax", fixtures_dir / "bad_syntax.yaml", "bad_syntax.yaml: expected valid YAML, got a syntax error at line 4"))
    cases.append(("no-such-file", tmp_path / "missing.yaml", "scenario: expected a YAML file"))
    return cases


def test_bad_input_is_one_line_exit_2_no_traceback(cli, fixtures_dir, tmp_path):
    # The mutated copies live next to the fixtures (mixin, lengths files) via a symlinked directory.
    work = tmp_path / "w"
    work.mkdir()
    for f in fixtures_dir.iterdir():
        (work / f.name).symlink_to(f)
    for name, path, prefix in _bad_cases(fixtures_dir, work):
        p = cli("simulate", path, "--steps", 2)
        assert p.returncode == 2, (name, p.returncode, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, (name, p.stderr)
        assert lines[0].startswith("error: " + prefix), (name, lines[0])
        assert "Traceback" not in p.stderr and p.stdout == "", name


def test_bad_profile_and_compare_are_clean(cli, tiny_yaml):
    for args, prefix in [(("--profile", "nope"), "error: profile: expected a profile name"),
                         (("--compare", "sync,warp"), "error: --compare: expected variant names")]:
        p = cli("simulate", tiny_yaml, "--steps", 2, *args)
        assert p.returncode == 2 and p.stderr.startswith(prefix) and "Traceback" not in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


def test_report_of_a_lengths_file_shows_its_fits(cli, tmp_path):
    # `rlhfsim report` on a file (not a run directory) shows the rollout lengths next to scipy fits.
    src = tmp_path / "rollouts.csv"
    rows = [(0, i // 4, i % 4, 20, n) for i, n in enumerate([5, 9, 12, 17, 30, 44, 61, 90, 150, 256, 256, 8])]
    src.write_text("step,prompt_id,rollout,prompt_len,response_len\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    out = tmp_path / "lengths.html"
    r = cli("report", src, "-o", out)
    assert r.returncode == 0, r.stderr
    assert "12 responses" in r.stdout and "lognormal" in r.stdout and "pareto" in r.stdout
    assert out.is_file() and "plotly" in out.read_text().lower()
    bad = cli("report", src, "--trace", tmp_path / "t.json")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") <= 1
