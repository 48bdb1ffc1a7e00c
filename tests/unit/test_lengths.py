"""Length distributions: bounds, the statistics each parameter promises, lengths files, seeding."""

from __future__ import annotations

import numpy as np
import pytest

from rlhfsim.errors import ScenarioError
from rlhfsim.scenario.loader import validate_model
from rlhfsim.scenario.schema import Workload
from rlhfsim.workload.lengths import Z99, read_lengths_file, sampler_for


def dist(d: dict):
    """A validated distribution config (through the Workload model, as a scenario would give it)."""
    w = validate_model(Workload, {"prompts_per_step": 1, "response_length": d, "max_response_tokens": 10})
    return w.response_length


def sample(d: dict, n: int = 200_000, cap: int = 1_000_000, seed: int = 0, base_dir=None) -> np.ndarray:
    return sampler_for(dist(d), cap, base_dir, "workload.response_length")(np.random.default_rng(seed), n)


@pytest.mark.parametrize("d", [
    {"kind": "fixed", "value": 7},
    {"kind": "normal", "mean": 10, "std": 30},
    {"kind": "lognormal", "median": 600, "p99": 8000},
    {"kind": "pareto", "scale": 50, "alpha": 1.1},
    {"kind": "mixture", "components": [{"weight": 1, "dist": {"kind": "fixed", "value": 3}},
                                       {"weight": 2, "dist": {"kind": "pareto", "scale": 100, "alpha": 0.5}}]},
])
def test_samples_are_integers_within_one_and_cap(d):
    x = sample(d, n=20_000, cap=4096)
    assert x.dtype == np.int64 and x.shape == (20_000,)
    assert x.min() >= 1 and x.max() <= 4096


def test_fixed():
    assert set(sample({"kind": "fixed", "value": 7}, n=100).tolist()) == {7}


def test_lognormal_median_and_p99():
    x = sample({"kind": "lognormal", "median": 600, "p99": 8000})
    assert np.median(x) == pytest.approx(600, rel=0.02)
    assert np.percentile(x, 99) == pytest.approx(8000, rel=0.05)
    assert Z99 == pytest.approx(2.326347874, rel=1e-9)


def test_lognormal_cap_clips_the_tail():
    x = sample({"kind": "lognormal", "median": 600, "p99": 8000}, cap=16384)
    assert x.max() == 16384
    # P(L > 16383.5) = Q((ln 16383.5 - ln 600) / sigma) = 0.00149 for this lognormal (200,000 draws: +-0.0003)
    assert (x == 16384).mean() == pytest.approx(0.00149, abs=0.0003)


def test_normal_mean_std_and_clipping():
    x = sample({"kind": "normal", "mean": 500, "std": 50})
    assert x.mean() == pytest.approx(500, rel=0.01) and x.std() == pytest.approx(50, rel=0.02)
    y = sample({"kind": "normal", "mean": 5, "std": 50}, n=10_000)
    assert y.min() == 1  # clipped from below


def test_pareto_scale_and_tail():
    x = sample({"kind": "pareto", "scale": 100, "alpha": 2.0})
    assert x.min() >= 100
    # P(L > x) = (scale / x)^alpha
    assert (x > 400).mean() == pytest.approx((100 / 400) ** 2, rel=0.05)


def test_mixture_weights():
    x = sample({"kind": "mixture", "components": [{"weight": 3, "dist": {"kind": "fixed", "value": 10}},
                                                  {"weight": 1, "dist": {"kind": "fixed", "value": 20}}]})
    assert set(x.tolist()) == {10, 20}
    assert (x == 10).mean() == pytest.approx(0.75, abs=0.01)


def test_same_generator_state_same_samples():
    d = {"kind": "lognormal", "median": 300, "p99": 3000}
    assert np.array_equal(sample(d, n=1000, seed=3), sample(d, n=1000, seed=3))
    assert not np.array_equal(sample(d, n=1000, seed=3), sample(d, n=1000, seed=4))


# --- lengths files ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,values", [
    ("lengths.csv", [12, 40, 7, 88, 150, 33]),
    ("lengths_bare.csv", [25, 60, 3]),
    ("lengths_columns.csv", [31, 64, 5]),
    ("lengths.jsonl", [20, 45, 9]),
    ("lengths_bare.jsonl", [17, 42]),
])
def test_read_lengths_files(name, values, fixtures_dir):
    assert read_lengths_file(fixtures_dir / name, "p").tolist() == values


def test_empirical_resamples_observed_values(fixtures_dir):
    x = sample({"kind": "empirical", "path": "lengths.csv"}, n=5000, cap=100, base_dir=fixtures_dir)
    assert set(x.tolist()) == {12, 40, 7, 88, 33, 100}
    assert (x == 100).mean() == pytest.approx(1 / 6, abs=0.03)


@pytest.mark.parametrize("name,fragment", [
    ("lengths_empty.csv", "expected at least one length, got an empty file"),
    ("lengths_malformed.csv", "line 3: ['lots'] is not a number in column 1"),
    ("lengths_zero.csv", "expected lengths >= 1, got 0.0"),
    ("lengths_badkey.jsonl", "line 2 has none of the keys"),
    ("lengths_badjson.jsonl", "expected one positive length per line"),
    ("missing.csv", "(no such file)"),
])
def test_bad_lengths_files(name, fragment, fixtures_dir):
    with pytest.raises(ScenarioError) as ei:
        read_lengths_file(fixtures_dir / name, "workload.response_length.path")
    assert ei.value.path == "workload.response_length.path"
    assert fragment in ei.value.message


@pytest.mark.parametrize("content,fragment", [
    (b"length\n", "got none"),
    (b'{"length": null}\n', "malformed"),
    (b"[1, 2]\n", "malformed"),
    (b"length\n1e400\n", "got inf"),
    (b"\xff\xfe\x00\x01", "not UTF-8 text"),
])
def test_more_bad_lengths_files(tmp_path, content, fragment):
    p = tmp_path / ("x.jsonl" if content.startswith((b"{", b"[")) else "x.csv")
    p.write_bytes(content)
    with pytest.raises(ScenarioError, match=fragment.replace("(", r"\(")):
        read_lengths_file(p, "p")
