"""Reward models as a new user meets them (issue 48): an encoder whose prompt + response exceed its 512
positions runs (DeBERTa-v3: relative positions, any length; ELECTRA: absolute positions, rows truncated
to them as the frameworks do, and priced so), and the summary and the report name how the reward model
scored: streamed or not, by which strategy and why."""

from __future__ import annotations

import pytest

from rlhfsim.report.text import print_summary, reward_scoring_text
from rlhfsim.scenario import build_setup, load_scenario
from rlhfsim.sim.rollouts import Rollout, truncated
from rlhfsim.sim.run import simulate

LONG = {"workload": {"max_prompt_tokens": 512, "max_response_tokens": 1024}}   # 1,536 > 512 positions


def _long(scenario_dict, reward: str, **over) -> dict:
    d = scenario_dict("gpu", LONG)
    d["models"]["reward"] = {"model": reward}
    d.update(over)
    return d


def test_deberta_v3_runs_past_512_tokens_untruncated(scenario_dict):
    setup = build_setup(load_scenario(_long(scenario_dict, "deberta-v3-large")))   # was refused
    assert setup.shapes["reward"].max_positions == 512 and setup.reward_max_tokens is None


def test_an_absolute_position_encoder_is_truncated_not_refused(scenario_dict):
    setup = build_setup(load_scenario(_long(scenario_dict, "electra-large")))
    assert setup.reward_max_tokens == 512
    short = build_setup(load_scenario(scenario_dict("gpu", {"models": {"reward": {"model": "electra-large"}},
                                                            "workload": {"max_prompt_tokens": 256,
                                                                         "max_response_tokens": 256}})))
    assert short.reward_max_tokens is None   # every row fits: nothing to truncate


def test_truncated_rows_cut_the_response_on_the_right():
    rows = [Rollout(0, 300, 400), Rollout(1, 100, 50), Rollout(2, 700, 10)]
    out = truncated(rows, 512)
    assert [(r.prompt_len, r.response_len) for r in out] == [(300, 212), (100, 50), (512, 0)]
    assert out[1] is rows[1] and out[0] is not rows[0] and out[0].id == 0
    assert (rows[0].prompt_len, rows[0].response_len) == (300, 400)   # the rollouts themselves are untouched


def test_the_reward_pass_prices_the_truncated_rows(scenario_dict, tracked):
    """Rows of 300 + 400 tokens score as rows of 300 + 212 (ELECTRA's 512 positions): same reward phase."""
    d = _long(scenario_dict, "electra-large")
    n = d["workload"]["prompts_per_step"] * d["algorithm"].get("group_size", 1) * 4
    long = tracked(d, steps=2, rollouts=[(300, 400)] * n)
    cut = tracked(d, steps=2, rollouts=[(300, 212)] * n)
    a = [r.phases_s["reward"] for r in long.records]
    b = [r.phases_s["reward"] for r in cut.records]
    assert a == pytest.approx(b, rel=1e-12) and a[0] > 0
    assert long.records[0].phases_s["generate"] > cut.records[0].phases_s["generate"]   # generation is not cut


def test_streamed_calls_of_an_absolute_position_encoder_are_truncated(scenario_dict, tracked):
    d = _long(scenario_dict, "electra-large", schedule={"kind": "oppo", "intra": {"chunk_tokens": 64},
                                                        "inter": {"enabled": False}})
    d["models"]["reward"]["streaming"] = "final_only"
    n = d["workload"]["prompts_per_step"] * 4
    run = tracked(d, steps=2, rollouts=[(300, 400)] * n)
    scorer = run.sim.scorers["reward"]
    assert scorer.chunks > 0 and scorer.tokens == 512 * scorer.chunks   # one call per rollout, cut to 512


@pytest.mark.parametrize("streaming, source", [(None, "default for an encoder reward model"),
                                               ("reencode", "models.reward.streaming")])
def test_the_summary_and_report_name_the_reward_streaming_in_force(scenario_dict, streaming, source, capsys):
    d = scenario_dict("gpu", {"workload": {"max_prompt_tokens": 256, "max_response_tokens": 256}},
                      schedule="oppo-intra")
    d["models"]["reward"] = {"model": "tiny-deberta", **({"streaming": streaming} if streaming else {})}
    d["steps"] = 3
    summary = simulate(load_scenario(d)).summary
    rs = summary["reward_scoring"]
    assert rs["streamed"] is True and rs["streaming"] == (streaming or "final_only")
    assert rs["streaming_source"] == source and rs["truncated_to_tokens"] is None
    print_summary(summary)
    out = " ".join(capsys.readouterr().out.split())
    assert f"streamed during generation by {rs['streaming']} ({source})" in out


def test_the_summary_says_when_nothing_streams_and_when_rows_are_truncated(scenario_dict):
    summary = simulate(load_scenario(_long(scenario_dict, "electra-large", steps=2))).summary
    rs = summary["reward_scoring"]
    assert rs["streamed"] is False and rs["truncated_to_tokens"] == 512
    text = reward_scoring_text(rs)
    assert "scored after generation" in text and "truncated to its 512 positions" in text


def test_the_html_report_names_the_reward_scoring(scenario_dict, tmp_path):
    from rlhfsim.report.html import run_sections
    from rlhfsim.report.load import load_run
    from rlhfsim.sim.run import write_outputs

    d = scenario_dict("gpu", {"workload": {"max_prompt_tokens": 256, "max_response_tokens": 256}},
                      schedule="oppo-intra")
    d["models"]["reward"] = {"model": "tiny-deberta"}
    d["steps"] = 3
    write_outputs(simulate(load_scenario(d)), tmp_path)
    overview = run_sections(load_run(tmp_path))[0].table_html
    assert "reward scoring" in overview and "streamed during generation by final_only" in overview
