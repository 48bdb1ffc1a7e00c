"""What users already read: verl-named step metrics, TensorBoard event files (read back, and decoded
independently with protobuf when it is installed), and utilization per GPU over time."""

from __future__ import annotations

import json

import pytest

from conftest import make_dict
from rlhfsim import contracts as C
from rlhfsim.report.tfevents import crc32c, event_file_bytes, read_scalars
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.run import simulate, verl_metrics, write_outputs


@pytest.fixture(scope="module")
def result():
    return simulate(load_scenario(make_dict("gpu", schedule="oppo")), steps=4)


def test_crc32c_known_vector():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)


def test_verl_metrics_names_and_values(result):
    rows = verl_metrics(result)
    assert [m["step"] for m in rows] == [1, 2, 3, 4]  # verl counts steps from 1
    n_gpus = sum(p.gpus for p in result.setup.pools)
    for m, r in zip(rows, result.steps):
        assert m[C.VERL_STEP_KEY] == r.step_time_s
        assert m["timing_s/gen"] == r.phases_s["generate"] and m["timing_s/update_actor"] == r.phases_s["actor_train"]
        assert m["timing_s/ref"] == r.phases_s["reference"]
        tokens = sum(p + q for _, p, q in r.lengths)
        assert m["perf/throughput"] == pytest.approx(tokens / (r.step_time_s * n_gpus))
        assert set(m) - {"step"} <= set(C.VERL_PHASE_KEYS.values()) | {
            C.VERL_STEP_KEY, C.VERL_THROUGHPUT_KEY, C.VERL_TOTAL_TOKENS_KEY, C.VERL_RESPONSE_LENGTH_KEY,
            C.VERL_PROMPT_LENGTH_KEY}


def test_out_dir_holds_verl_metrics_and_tensorboard_events(result, tmp_path):
    written = write_outputs(result, tmp_path)
    assert C.VERL_METRICS_FILE in written
    lines = [json.loads(x) for x in (tmp_path / C.VERL_METRICS_FILE).read_text().splitlines()]
    assert lines == json.loads(json.dumps(verl_metrics(result)))
    events = list((tmp_path / C.TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    assert len(events) == 1
    scalars = read_scalars(events[0])
    for key in ("timing_s/gen", "timing_s/ref", "timing_s/update_actor", "timing_s/step", "perf/throughput"):
        got = scalars[key]
        want = [(m["step"], m[key]) for m in lines]
        assert [s for s, _ in got] == [s for s, _ in want]
        assert all(v == pytest.approx(w, rel=1e-6) for (_, v), (_, w) in zip(got, want))  # stored as float32
    write_outputs(result, tmp_path)  # a second write replaces the event file, never adds one
    assert len(list((tmp_path / C.TENSORBOARD_DIR).glob("events.out.tfevents.*"))) == 1


def test_event_file_decodes_with_protobuf():
    """An independent decoder: Event/Summary messages built from their .proto field numbers with the
    protobuf runtime (tensorflow/core/util/event.proto, summary.proto), parsing our bytes."""
    pytest.importorskip("google.protobuf")
    import struct

    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto(name="rlhfsim_test_event.proto", package="t", syntax="proto3")
    value = fd.message_type.add(name="Value")
    value.field.add(name="tag", number=1, type=9, label=1)
    value.field.add(name="simple_value", number=2, type=2, label=1)
    summary = fd.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=11, label=3, type_name=".t.Value")
    event = fd.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=1, label=1)
    event.field.add(name="step", number=2, type=3, label=1)
    event.field.add(name="file_version", number=3, type=9, label=1)
    event.field.add(name="summary", number=5, type=11, label=1, type_name=".t.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    Event = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.Event"))
    data = event_file_bytes([(3, 12.5, {"timing_s/gen": 1.25, "perf/throughput": 640.0})])
    msgs, i = [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        msgs.append(Event.FromString(data[i + 12:i + 12 + n]))
        i += 16 + n
    assert msgs[0].file_version == "brain.Event:2"
    assert msgs[1].step == 3 and msgs[1].wall_time == 12.5
    assert {v.tag: v.simple_value for v in msgs[1].summary.value} == {"timing_s/gen": 1.25, "perf/throughput": 640.0}


def test_gpu_utilization_over_time(result, tmp_path):
    from rlhfsim.report.figures import gpu_busy_over_time, gpu_utilization_figure
    from rlhfsim.report.load import load_run

    write_outputs(result, tmp_path)
    run = load_run(tmp_path)
    labels, edges, busy = gpu_busy_over_time(run.intervals, run.summary["pools"], bins=50)
    assert labels == [f"{p}:{g}" for p, spec in run.summary["pools"].items() for g in range(spec["gpus"])]
    assert busy.shape == (len(labels), 50) and ((busy >= 0) & (busy <= 1)).all()
    # Busy seconds per GPU = the union of its intervals, however they are binned.
    width = edges[1] - edges[0]
    for row, label in zip(busy, labels):
        pool, g = label.split(":")
        m = (run.intervals.pool == pool) & (run.intervals.gpu == int(g))
        segs, total, end = sorted(zip(run.intervals.start_s[m], run.intervals.end_s[m])), 0.0, -1.0
        for a, b in segs:
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        assert row.sum() * width == pytest.approx(total, rel=1e-6, abs=1e-9)
    assert len(gpu_utilization_figure(run.intervals, run.summary["pools"]).data) == 1


def test_out_means_a_directory_and_older_file_paths_still_work(tmp_path):
    from rlhfsim.files import out_path

    assert out_path(None, C.PROFILE_FILE) is None
    assert out_path(tmp_path / "runs", C.PROFILE_FILE) == tmp_path / "runs" / "profile.json"
    assert out_path(tmp_path / "h200.json", C.PROFILE_FILE) == tmp_path / "h200.json"       # older usage
    assert out_path(tmp_path / "r.html", C.REPORT_FILE) == tmp_path / "r.html"
    (tmp_path / "d.json").mkdir()  # an existing directory that happens to end in .json is a directory
    assert out_path(tmp_path / "d.json", C.VALIDATION_FILE) == tmp_path / "d.json" / "validation.json"
