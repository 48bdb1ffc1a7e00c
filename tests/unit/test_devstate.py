"""The device state check (``calibrate.measuring.devstate``): the probe measures positive rates in the documented
shapes, a calibration stores it at its start and end, and the comparison with a profile names a different
processor, a rate that moved beyond the tolerance, and a profile without probes, and stays quiet when
nothing moved."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("torch")

from calibrate.measuring.devstate import GEMV_MIB, PROBE_VERSION, TOLERANCE, compare, profile_probes, state_probe  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it


def _probe(model: str = "CPU X", scale: float = 1.0, gemm: float = 100.0) -> dict:
    return {"version": 1, "cpu_model": model, "cpu_cores": 2, "threads": 2, "load_avg_1m": 0.1,
            "gemv_gb_s": {str(m): 10.0 * scale * (i + 1) for i, m in enumerate(GEMV_MIB)}, "gemm_gflop_s": gemm}


def _profile(probes: list[dict], model: str = "CPU X", kind: str = "cpu") -> dict:
    dev = {"kind": kind, "cpu_model": model, "name": model}
    for key, p in zip(("state_probe_at_start", "state_probe_at_end"), probes):
        dev[key] = p
    return {"name": "p", "device": dev}


def test_probe_measures_every_rate():
    p = state_probe(1, calls=3)
    assert set(p["gemv_gb_s"]) == {str(m) for m in GEMV_MIB}
    assert all(v > 0 for v in p["gemv_gb_s"].values()) and p["gemm_gflop_s"] > 0
    assert p["threads"] == 1 and p["cpu_model"]
    assert p["version"] == 2 and p["dispatch_kops_s"] > 0


def test_dispatch_rate_moved_alone_is_named_and_old_probes_skip_it():
    """A host whose per-operator work slowed (the small models' calls) while its memory and compute rates
    held is named by the dispatch rate; a version-1 probe in the profile (no dispatch rate) is compared on
    the rates it has."""
    prof = _profile([{**_probe(), "version": 2, "dispatch_kops_s": 100.0}])
    c = compare(prof, [{**_probe(), "version": 2, "dispatch_kops_s": 75.0}])
    assert c["ratios"]["dispatch"] == pytest.approx(0.75)
    assert len(c["warnings"]) == 1 and "dispatch x0.75" in c["warnings"][0] and "gemv" not in c["warnings"][0]
    old = compare(_profile([_probe()]), [{**_probe(), "version": 2, "dispatch_kops_s": 75.0}])
    assert "dispatch" not in old["ratios"] and old["warnings"] == []


def test_same_machine_same_state_is_quiet():
    prof = _profile([_probe(), _probe(scale=1.04)])
    c = compare(prof, [_probe(scale=1.02), _probe(scale=0.99)])
    assert c["same_cpu_model"] is True and c["warnings"] == []
    assert set(c["ratios"]) == {f"gemv_{m}MiB" for m in GEMV_MIB} | {"gemm"}
    assert all(abs(r - 1) < 0.05 for r in c["ratios"].values())


def test_moved_rate_is_named_with_its_ratio():
    prof = _profile([_probe()])
    c = compare(prof, [_probe(scale=1.0 + 2 * TOLERANCE)])
    assert c["same_cpu_model"] is True
    assert len(c["warnings"]) == 1 and "gemv_32MiB x1.30" in c["warnings"][0] and "gemm" not in c["warnings"][0]
    assert c["ratios"]["gemv_2MiB"] == pytest.approx(1.3)


def test_other_processor_and_missing_probe_are_named():
    c = compare(_profile([], model="AMD EPYC"), [_probe(model="Intel Xeon")])
    assert c["same_cpu_model"] is False and c["ratios"] == {}
    assert any("'AMD EPYC'" in w and "'Intel Xeon'" in w for w in c["warnings"])
    assert any("no device state probe" in w for w in c["warnings"])


def test_gpu_profile_is_not_compared():
    c = compare(_profile([_probe()], kind="cuda"), [_probe()])
    assert c["ratios"] == {} and "CPU profiles only" in c["warnings"][0]


def test_profile_probes_ignores_absent_ends():
    a = _probe()
    prof = _profile([a])
    assert profile_probes(prof) == [a]
    prof2 = copy.deepcopy(prof)
    prof2["device"]["state_probe_at_end"] = None
    assert profile_probes(prof2) == [a]
    assert profile_probes({"name": "x"}) == []


def test_pass_probes_are_pooled_across_passes_written_apart(tmp_path):
    """A calibration whose passes are measured apart writes its profile anew each pass, with that pass's
    start and end probes: ``pool_pass_probes`` keeps every earlier pass's probes beside them, and the
    device check compares the median over all of them (here a slow first pass and a fast second one)."""
    import json

    from calibrate.measuring.devstate import pool_pass_probes

    path = tmp_path / "p.json"
    slow, fast = _probe(scale=0.8), _probe(scale=1.2)
    path.write_text(json.dumps(_profile([slow, slow])))
    prior = profile_probes(json.loads(path.read_text()))
    path.write_text(json.dumps(_profile([fast, fast])))       # the next pass's run overwrites the profile
    pool_pass_probes(path, prior)
    pooled = json.loads(path.read_text())
    assert profile_probes(pooled) == [slow, slow, fast, fast]
    c = compare(pooled, [_probe()])
    assert c["ratios"]["gemv_2MiB"] == pytest.approx(1.0) and c["warnings"] == []
    assert compare(_profile([fast, fast]), [_probe()])["ratios"]["gemv_2MiB"] == pytest.approx(1 / 1.2)
    pool_pass_probes(path, [])                                 # the first pass: nothing to keep
    assert profile_probes(json.loads(path.read_text())) == [slow, slow, fast, fast]


def test_thread_pool_settings_that_differ_from_the_profiles_are_named(monkeypatch):
    """A profile records the thread-pool environment it was measured under (``device.thread_env``); the check
    names a run whose settings differ (either way: set now and not then, or changed), and stays quiet when they
    match or when the profile predates the record."""
    from calibrate.measuring.device_info import THREAD_ENV, describe

    for k in THREAD_ENV:
        monkeypatch.delenv(k, raising=False)
    assert describe("cpu", 1)["thread_env"] == {}
    now = [_probe()]
    prof = _profile([_probe()])
    prof["device"]["thread_env"] = {}
    assert compare(prof, now)["warnings"] == []
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert describe("cpu", 1)["thread_env"] == {"OMP_WAIT_POLICY": "PASSIVE"}
    w = compare(prof, now)["warnings"]
    assert len(w) == 1 and "OMP_WAIT_POLICY=PASSIVE" in w[0] and "the defaults" in w[0]
    prof["device"]["thread_env"] = {"OMP_WAIT_POLICY": "PASSIVE"}
    assert compare(prof, now)["warnings"] == []
    del prof["device"]["thread_env"]       # a profile from before the record: nothing to compare
    assert compare(prof, now)["warnings"] == []


def test_host_probe_measures_the_dispatch_chain_on_the_host_and_on_the_device():
    from calibrate.measuring.devstate import host_probe

    p = host_probe("cpu", calls=3)   # on CUDA the second chain runs on the GPU, synchronised per pass
    assert p["device"] == "cpu" and p["version"] == PROBE_VERSION
    assert p["dispatch_kops_s"] > 0 and p["device_dispatch_kops_s"] > 0 and p["cpu_cores"] >= 1
