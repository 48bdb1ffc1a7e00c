"""The ``trace`` length source: replayed one for one (prompt lengths included) in (step, prompt, rollout)
order, group structure checked against the scenario, bad files as one line naming the YAML path; and
``algorithm.kind: rloo`` (GRPO-like: no critic, same costs)."""

from __future__ import annotations

import json

import pytest

from rlhfsim.errors import ScenarioError
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.run import simulate
from rlhfsim.workload.trace import TraceRow, read_trace, trace_rollouts, write_trace

G, B = 4, 4  # the cpu base scenario: grpo, group 4, 4 prompts per step


def _rows(steps=2, first_prompt=100):
    """A trace whose prompt ids are not in order within a step and whose lengths are all different."""
    out = []
    for s in range(steps):
        for k, pid in enumerate((3, 1, 7, 5)):
            for j in range(G):
                out.append(TraceRow(s, first_prompt + pid + 10 * s, j, 10 + k + 4 * s, 1 + j + 5 * k + 20 * s))
    return out


def _cpu(scenario_dict, response_length, **over):
    """The cpu base scenario with its response lengths replaced (not merged: another kind's keys go)."""
    d = scenario_dict("cpu", over)
    d["workload"]["response_length"] = response_length
    return d


def _scenario(scenario_dict, path, **over):
    return load_scenario(_cpu(scenario_dict, {"kind": "trace", "path": str(path)}, **over))


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_write_read_round_trip(tmp_path, suffix):
    rows = _rows()
    p = tmp_path / f"t{suffix}"
    write_trace(p, rows)
    assert read_trace(p, "x") == rows


def test_jsonl_meta_line_aliases_and_extra_keys(tmp_path):
    p = tmp_path / "log.jsonl"
    lines = [{"meta": {"framework": "trl"}}]
    lines += [{"step": 0, "prompt_id": 9, "group_index": j, "prompt_length": 5, "response_length": 2 + j,
               "completion": "w2 w3"} for j in range(2)]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert read_trace(p, "x") == [TraceRow(0, 9, 0, 5, 2), TraceRow(0, 9, 1, 5, 3)]


def test_replay_order_is_step_prompt_appearance_rollout(tmp_path):
    rows = _rows(steps=1)
    shuffled = list(reversed(rows))  # rollouts in reverse; prompts in reverse appearance order
    pairs = trace_rollouts(shuffled, G, B, 10_000, 10_000, tmp_path, "x")
    expect = []
    for pid in (5, 7, 1, 3):  # first appearance in the reversed file
        g = sorted((r for r in rows if r.prompt_id == 100 + pid), key=lambda r: r.rollout)
        expect += [(r.prompt_len, r.response_len) for r in g]
    assert pairs == expect


def test_simulation_replays_the_trace_one_for_one(scenario_dict, tmp_path):
    rows = _rows(steps=3)
    write_trace(tmp_path / "t.csv", rows)
    sc = _scenario(scenario_dict, tmp_path / "t.csv", steps=3)
    res = simulate(sc)
    replayed = [[(pl, rl) for _, pl, rl in sorted(r.lengths)] for r in res.steps]
    expect = [[(r.prompt_len, r.response_len) for r in rows if r.step == s] for s in range(3)]
    # within a step the trace's prompts come in file order (3, 1, 7, 5), rollouts by index
    assert replayed == expect
    assert all(r.generated_tokens == sum(x for _, x in e) for r, e in zip(res.steps, expect))


def test_a_run_longer_than_the_trace_starts_it_over(scenario_dict, tmp_path):
    rows = _rows(steps=2)
    write_trace(tmp_path / "t.csv", rows)
    res = simulate(_scenario(scenario_dict, tmp_path / "t.csv", steps=5))
    per_step = [[(pl, rl) for _, pl, rl in sorted(r.lengths)] for r in res.steps]
    assert per_step[2] == per_step[0] and per_step[3] == per_step[1] and per_step[4] == per_step[0]


def test_trace_relative_to_the_scenario_file(scenario_dict, tmp_path):
    import yaml

    write_trace(tmp_path / "t.jsonl", _rows())
    d = _cpu(scenario_dict, {"kind": "trace", "path": "t.jsonl"})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    assert len(simulate(load_scenario(tmp_path / "s.yaml"), steps=2).steps) == 2


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


HEADER = "step,prompt_id,rollout,prompt_len,response_len\n"


@pytest.mark.parametrize("name,text,fragments", [
    ("missing.csv", None, ["no such file"]),
    ("empty.csv", "", ["empty trace"]),
    ("header_only.csv", HEADER, ["at least one rollout after the header"]),
    ("nocol.csv", "step,prompt_id,rollout,prompt_len\n0,0,0,3\n", ["no 'response_len' column", "line 2"]),
    ("notint.csv", HEADER + "0,0,0,3,lots\n", ["integer response_len", "line 2", "'lots'"]),
    ("zero.csv", HEADER + "0,0,0,3,0\n", ["response_len >= 1", "got 0"]),
    ("fields.csv", HEADER + "0,0,0,3\n", ["expected 5 fields on line 2", "got 4"]),
    ("dup.csv", HEADER + "0,0,0,3,4\n0,0,0,3,5\n", ["once", "step 0 prompt 0 rollout 0 twice"]),
    ("badjson.jsonl", '{"step": 0,\n', ["malformed line 1"]),
    ("list.jsonl", "[1, 2]\n", ["got list on line 1"]),
    ("group.csv", HEADER + "".join(f"0,0,{j},3,4\n" for j in range(3)), ["expected 4 rollouts per prompt", "got 3 for step 0 prompt 0"]),
    ("prompts.csv", HEADER + "".join(f"0,{p},{j},3,4\n" for p in range(3) for j in range(4)), ["expected 4 prompts in every step", "got 3 in step 0"]),
    ("plen.csv", HEADER + "".join(f"0,{p},{j},{3 + (j == 1)},4\n" for p in range(4) for j in range(4)), ["one prompt length per prompt"]),
])
def test_bad_trace_files_name_the_yaml_path(scenario_dict, tmp_path, name, text, fragments):
    p = tmp_path / name if text is None else _write(tmp_path, name, text)
    with pytest.raises(ScenarioError) as ei:
        _scenario(scenario_dict, p)
    assert ei.value.path == "workload.response_length.path"
    msg = str(ei.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, msg


def test_bad_trace_through_the_cli_is_one_line_exit_2(cli, scenario_dict, tmp_path):
    import yaml

    _write(tmp_path, "t.csv", HEADER + "0,0,0,3,x\n")
    d = _cpu(scenario_dict, {"kind": "trace", "path": "t.csv"})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    p = cli("simulate", tmp_path / "s.yaml")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and p.stderr.startswith("error: workload.response_length.path:")


def test_trace_is_refused_where_it_cannot_pair(scenario_dict, tmp_path):
    write_trace(tmp_path / "t.csv", _rows())
    d = scenario_dict("cpu")
    d["workload"]["prompt_length"] = {"kind": "trace", "path": str(tmp_path / "t.csv")}
    with pytest.raises(ScenarioError) as ei:
        load_scenario(d)
    assert ei.value.path == "workload.prompt_length.kind"
    d = _cpu(scenario_dict, {"kind": "mixture", "components": [
        {"weight": 1, "dist": {"kind": "fixed", "value": 4}},
        {"weight": 1, "dist": {"kind": "trace", "path": str(tmp_path / "t.csv")}}]})
    with pytest.raises(ScenarioError) as ei:
        load_scenario(d)
    assert ei.value.path == "workload.response_length.components[1].dist.kind"


def test_rloo_simulates_like_grpo(scenario_dict):
    grpo = simulate(load_scenario(scenario_dict("cpu")))
    rloo = simulate(load_scenario(scenario_dict("cpu", {"algorithm": {"kind": "rloo"}})))
    assert rloo.summary["step_time_s"] == grpo.summary["step_time_s"]
    assert rloo.summary["phases_s"] == grpo.summary["phases_s"]


def test_rloo_refuses_a_critic(scenario_dict):
    d = scenario_dict("cpu", {"algorithm": {"kind": "rloo"}, "models": {"critic": {"model": "tiny-qwen2", "dtype": "float32"}}})
    with pytest.raises(ScenarioError) as ei:
        load_scenario(d)
    assert ei.value.path == "models.critic" and "rloo" in str(ei.value)
