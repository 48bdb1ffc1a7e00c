"""Profile names: calibrations are named after the device or --name and never shadow a bundled profile;
a user profile that does (left by an older calibrate) is used with a warning, never silently; the
quality verdict flags poor fits."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("torch")

from calibrate.fitting.quality import assess_quality  # noqa: E402
from calibrate.running.run import cpu_profile_name, profile_target  # noqa: E402
from rlhfsim.costs.profile import BUNDLED_DIR, ProfileShadowWarning, bundled_names, load_profile  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it


def test_cpu_profiles_are_named_after_the_cpu_model():
    assert cpu_profile_name("Intel(R) Xeon(R) Processor") == "cpu-intel-xeon-processor"
    assert cpu_profile_name("AMD Ryzen 7 5800H with Radeon Graphics") == "cpu-amd-ryzen-7-5800h-with-radeon-graphics"
    assert cpu_profile_name("Intel(R) Core(TM) i7-9700K CPU @ 3.60GHz") == "cpu-intel-core-i7-9700k"
    assert cpu_profile_name("Intel(R) Xeon(R) Processor") not in bundled_names()


def test_a_bundled_name_in_the_user_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFSIM_PROFILE_DIR", str(tmp_path))
    assert {"cpu", "default"} <= bundled_names()
    name, path = profile_target("cpu-intel-xeon-processor", None, None)
    assert name == "cpu-intel-xeon-processor" and path == tmp_path / "cpu-intel-xeon-processor.json"
    for bad in ("cpu", "default"):
        with pytest.raises(RlhfsimError, match="would shadow"):
            profile_target("cpu-x", bad, None)
        with pytest.raises(RlhfsimError, match="would shadow"):
            profile_target("cpu-x", None, tmp_path / f"{bad}.json")
    # elsewhere (e.g. regenerating the bundled profile itself) the name is free
    assert profile_target("cpu-x", "cpu", tmp_path / "elsewhere" / "cpu.json") == ("cpu", tmp_path / "elsewhere" / "cpu.json")
    assert profile_target("h200", None, None)[0] == "h200"
    with pytest.raises(RlhfsimError, match="--name"):
        profile_target("cpu-x", "a/b", None)


def test_a_shadowing_user_profile_warns(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFSIM_PROFILE_DIR", str(tmp_path))
    doc = json.loads((BUNDLED_DIR / "cpu.json").read_text())
    (tmp_path / "cpu.json").write_text(json.dumps({**doc, "name": "old-cpu"}))
    with pytest.warns(ProfileShadowWarning, match="shadows the bundled profile"):
        assert load_profile("cpu")["name"] == "old-cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_profile("default")["name"] == "default"


def _profile(ops: dict, points=(), device=None) -> dict:
    return {"operations": ops, "points": list(points), "device": device or {"kind": "cpu", "threads": 2}}


def test_quality_flags_high_heldout_error_underdetermined_fits_and_contention():
    good = {"source": "measured", "heldout_mape": 0.1, "heldout_mape_by_model": 0.2}
    q = assess_quality(_profile({"decode": good}, [{"contended": False}] * 10))
    assert q["status"] == "ok" and q["warnings"] == []
    q = assess_quality(_profile({"decode": {**good, "heldout_mape": 0.44, "heldout_mape_by_model": 2.6}}))
    assert q["status"] == "poor" and any("held-out error 44%" in w for w in q["warnings"])
    assert any("leave-one-model-out error 260%" in w for w in q["warnings"])
    q = assess_quality(_profile({"score:aoti_cpp": {"source": "underdetermined", "n_points": 1, "n_params": 3}}))
    assert q["status"] == "poor" and "underdetermined" in q["warnings"][0]
    q = assess_quality(_profile({"decode": good}, [{"contended": True}] * 3 + [{"contended": False}] * 7))
    assert q["status"] == "poor" and q["contended_points"] == 3
    q = assess_quality(_profile({"decode": good}, device={"kind": "cpu", "threads": 2, "load_avg_1m_at_end": 4.5}))
    assert q["status"] == "poor" and "load average" in q["warnings"][0]
