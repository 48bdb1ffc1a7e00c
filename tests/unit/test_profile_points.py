"""A profile kept without its raw points (``calibrate.running.journal.points_path``): the bundled ``cpu`` profile ships
without them, they sit beside it in ``cpu.points.jsonl`` (not package data), and the calibrator's readers and
writers (``with_points``, ``write_profile``) find them there."""

import json

from calibrate.running.journal import points_path, with_points, write_profile
from rlhfsim.costs.profile import BUNDLED_DIR, bundled_names, load_profile


def test_the_bundled_cpu_profile_keeps_its_points_beside_it():
    raw = json.loads((BUNDLED_DIR / "cpu.json").read_text())
    assert "points" not in raw and points_path(BUNDLED_DIR / "cpu.json").name == "cpu.points.jsonl"
    doc = with_points(load_profile("cpu"))
    assert len(doc["points"]) > 100 and all("op" in p and "key" in p for p in doc["points"])
    assert "cpu.points" not in bundled_names()   # not taken for a profile of its own


def test_write_profile_keeps_the_points_where_the_profile_keeps_them(tmp_path):
    doc = {"name": "p", "operations": {}, "points": [{"key": "a", "op": "prefill"}, {"key": "b", "op": "train"}]}
    inline = tmp_path / "inline.json"
    write_profile(inline, doc)
    assert json.loads(inline.read_text())["points"] == doc["points"] and not points_path(inline).exists()
    split = tmp_path / "split.json"
    points_path(split).write_text("")
    write_profile(split, doc)
    assert "points" not in json.loads(split.read_text())
    assert with_points(json.loads(split.read_text()), split)["points"] == doc["points"]
    assert with_points({"name": "q"}) == {"name": "q"}   # no file, no points: unchanged
