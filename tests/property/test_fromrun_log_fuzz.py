"""500 mutated real logs through the log reader, the steady-step selection, the length match and the launch check
(issue 54): not one traceback; every refusal an RlhfsimError of one line.

The logs are windows of whole public logs (tests/data/logs/: verl 0.1, ~0.3 and 0.4 consoles) as written, and the
same steps as metrics JSONL, TensorBoard events and a wandb CSV; each is mutated 1-4 times (truncated, a line cut,
binary bytes put in, a number made NaN, negative, infinite or text, key and value swapped, a separator deleted, a
line doubled, dropped or moved, a colon dropped) and read as a file's bytes (``read_log_data``), plain or
gzip-compressed (the compressed bytes cut at random, sometimes). Seeded: the same 500 logs every run."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from rlhfsim.errors import RlhfsimError
from rlhfsim.fromrun.agree import check_agreement
from rlhfsim.fromrun.lengths import logged_shape
from rlhfsim.fromrun.logs import read_log_data, steady_steps
from rlhfsim.importers import ImportOptions, import_verl
from rlhfsim.report.tfevents import event_file_bytes
from rlhfsim.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "logs"
LOGS = ("playverl-ppo-qwen2.5-0.5b.log.gz", "playverl-ppo-qwen2-7b-recommended.log.gz",
        "verldata-gpg-qwen2-7b-math.log.gz", "verl-data-gemma-2-2b-ppo-v0.1.log.gz")
CASES = 500
STEP = re.compile(r"(?:^|\s)step:\d+ - ")
NUMBER = re.compile(r"(?<=:)-?\d+\.\d+")


@pytest.fixture(scope="module")
def material():
    out = []
    for name in LOGS:
        lines = gzip.decompress((DATA / name).read_bytes()).decode().split("\n")
        out.append((lines, [i for i, ln in enumerate(lines) if STEP.search(ln)]))
    return out


@pytest.fixture(scope="module")
def launch():
    launch = ROOT / "scenarios" / "examples" / "field" / "playverl-h100-qwen2.5-0.5b-ppo.sh"
    res = import_verl(launch.read_text(), ImportOptions(gpu="h100-sxm"), launch.name)
    return load_scenario(res.scenario, base_dir=launch.parent)


def window(rng, material) -> list[str]:
    lines, steps = material[rng.integers(len(material))]
    n = int(rng.integers(4, 12))
    a = int(rng.integers(0, len(steps) - n))
    return lines[max(steps[a] - int(rng.integers(0, 4)), 0): steps[a + n - 1] + 2]


def mutate_text(rng, lines: list[str]) -> list[str]:
    lines = list(lines)
    for _ in range(int(rng.integers(1, 5))):
        i = int(rng.integers(len(lines)))
        ln = lines[i]
        op = int(rng.integers(11))
        if op == 0:
            lines = lines[: i + 1]
            lines[-1] = ln[: int(rng.integers(len(ln) + 1))]
        elif op == 1:
            lines[i] = ln[: int(rng.integers(len(ln) + 1))]
        elif op == 2:
            k = int(rng.integers(len(ln) + 1))
            lines[i] = ln[:k] + bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8)).decode(
                "latin-1") + ln[k:]
        elif op in (3, 4):
            nums = list(NUMBER.finditer(ln))
            if nums:
                m = nums[int(rng.integers(len(nums)))]
                new = ["nan", "-" + m.group(0), "inf", "abc", "", "1e999", "np.float64(nan)"][int(rng.integers(7))]
                lines[i] = ln[: m.start()] + new + ln[m.end():]
        elif op == 5:
            toks = ln.split(" - ")
            if len(toks) > 2:
                j = int(rng.integers(1, len(toks)))
                k, _, v = toks[j].partition(":")
                toks[j] = f"{v}:{k}"
                lines[i] = " - ".join(toks)
        elif op == 6:
            lines[i] = ln.replace(" - ", " ", 1 + int(rng.integers(3)))
        elif op == 7:
            lines.insert(i, ln)
        elif op == 8:
            del lines[i]
            if not lines:
                lines = [""]
        elif op == 9:
            j = int(rng.integers(len(lines)))
            lines[i], lines[j] = lines[j], ln
        else:
            lines[i] = ln.replace(":", "", 1)
    return lines


def other_format(rng, lines: list[str]) -> tuple[bytes, str]:
    """The window's steps as JSONL, TensorBoard events or a wandb CSV (read from the unmutated window), the bytes
    then mutated at random."""
    steps = read_log_data("\n".join(lines).encode(), "w.log").steps
    kind = int(rng.integers(3))
    if kind == 0:
        data = "\n".join(json.dumps({"step": s.step, "data": s.metrics}) for s in steps).encode()
        name = "m.jsonl"
    elif kind == 1:
        data = event_file_bytes([(s.step, 1.0, {k: v}) for s in steps for k, v in list(s.metrics.items())[:20]])
        name = "events.out.tfevents.1.x"
    else:
        keys = sorted({k for s in steps for k in s.metrics})[:30]
        rows = ["_step," + ",".join(keys)] + [f"{s.step}," + ",".join(repr(s.metrics[k]) if k in s.metrics else ""
                                                                         for k in keys) for s in steps]
        data = "\n".join(rows).encode()
        name = "h.csv"
    data = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(3))
        if op == 0 and data:
            del data[int(rng.integers(len(data))):]
        elif op == 1 and data:
            data[int(rng.integers(len(data)))] = int(rng.integers(256))
        else:
            k = int(rng.integers(len(data) + 1))
            data[k:k] = bytes(rng.integers(0, 256, int(rng.integers(1, 6)), dtype=np.uint8))
    return bytes(data), name


def test_500_mutated_real_logs_no_traceback(material, launch):
    rng = np.random.default_rng(20261207)
    outcomes = {"read": 0, "refused": 0}
    for case in range(CASES):
        lines = window(rng, material)
        if case % 5 == 4:
            data, name = other_format(rng, lines)
        else:
            data, name = "\n".join(mutate_text(rng, lines)).encode("utf-8", errors="surrogateescape"), "run.log"
            if case % 3 == 0:
                data, name = gzip.compress(data, compresslevel=1), "run.log.gz"
                if rng.random() < 0.3:
                    data = data[: int(rng.integers(len(data) + 1))]
        try:
            st = steady_steps(read_log_data(data, name), name, min_steps=int(rng.integers(1, 4)),
                              strict=rng.random() < 0.2)
            if case % 10 == 0:
                logged_shape(st, 1024, 256)     # a least-squares solve: a tenth of the cases keep the test fast
            st.notices()
            check_agreement(st, launch)
            outcomes["read"] += 1
        except RlhfsimError as e:
            assert "\n" not in str(e) and str(e).strip(), f"case {case}: {e!r}"
            outcomes["refused"] += 1
        except Exception as e:      # noqa: BLE001 - the point of the test: anything else is a traceback
            raise AssertionError(f"case {case} ({name}): {type(e).__name__}: {e}") from e
    assert sum(outcomes.values()) == CASES and outcomes["read"] > 50 and outcomes["refused"] > 50, outcomes
