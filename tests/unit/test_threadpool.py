"""``calibrate.cpu.threadpool``: a thread set to one OpenMP thread runs torch on one thread and opens no OpenMP team
of its own, while the other threads keep their count; the executor's scorer thread and the hand-over
calibration's run so on a CPU, the points say so, and the device check names a profile measured otherwise."""

from __future__ import annotations

import os
import threading

import pytest

torch = pytest.importorskip("torch")

from calibrate.fitting.assemble import interference_summary  # noqa: E402
from calibrate.cpu.threadpool import one_thread_here, scorer_threads  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

needs_omp = pytest.mark.skipif(scorer_threads(False) != 1, reason="no OpenMP library beside torch to set")


def _tasks() -> set[str]:
    """This process's OS thread ids (a set, so a thread that ends meanwhile cannot cancel one that began)."""
    return set(os.listdir("/proc/self/task"))


def _in_thread(fn):
    out: dict = {}

    def body():
        out["v"] = fn()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out["v"]


@needs_omp
def test_one_thread_here_sets_the_calling_thread_only():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        def peer():
            what = one_thread_here()
            return what, torch.get_num_threads()

        what, peer_threads = _in_thread(peer)
        assert what.startswith("OpenMP") and peer_threads == 1
        assert torch.get_num_threads() == 2               # the caller's thread keeps its count
    finally:
        torch.set_num_threads(before)


@needs_omp
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts OS threads in /proc")
def test_a_one_thread_peer_opens_no_team_and_a_default_one_does():
    """A matrix product large enough for a parallel region, on a thread alive and blocked afterwards: with
    torch's two threads it leaves an OpenMP worker behind (the peer's team), with one thread none."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.randn(256, 256) @ torch.randn(256, 256)     # the main thread's own team first

        def grow(one: bool) -> int:
            """OS threads the peer's product started and left behind, counted from inside the peer as thread
            ids new since before the product (an ended thread can linger in /proc for a moment after ``join``
            and vanish during the product, so a difference of counts could hide a new worker)."""
            ready, done, out = threading.Event(), threading.Event(), {}

            def body():
                if one:
                    one_thread_here()
                n0 = _tasks()
                torch.randn(256, 256) @ torch.randn(256, 256)
                out["n"] = len(_tasks() - n0)
                ready.set()
                done.wait()

            t = threading.Thread(target=body)
            t.start()
            ready.wait()
            done.set()
            t.join()
            return out["n"]

        # three tries each: a thread another test left running may start one of its own meanwhile
        assert min(grow(True) for _ in range(3)) == 0
        assert max(grow(False) for _ in range(3)) >= 1
    finally:
        torch.set_num_threads(before)


def test_scorer_threads_is_none_on_cuda():
    assert scorer_threads(True) is None


def _pt(side, threads):
    return {"op": "interference", "runtime": "kv_decoder", "side": side, "model": "a", "partner": "a", "batch": 4,
            "seq_len": 32, "prefix_len": 64, "alone_median_s": 1.0, "median_s": 2.0, "alone_tmean_s": 1.0,
            "tmean_s": 2.0, "slowdown": 2.0, "chunk": 32, "corun_pattern": "handover",
            **({"scorer_threads": threads} if threads != "absent" else {})}


@needs_omp
def test_summary_and_device_check_carry_the_scorer_threads():
    from calibrate.measuring.devstate import compare

    default = {"decode_slowdown": 1.25, "prefill_slowdown": 1.4}
    new = interference_summary([_pt("decode", 1), _pt("prefill", 1)], default)
    old = interference_summary([_pt("decode", "absent"), _pt("prefill", "absent")], default)
    assert new["handover"]["kv_decoder"]["scorer_threads"] == 1
    assert old["handover"]["kv_decoder"]["scorer_threads"] is None

    def prof(inter):
        return {"name": "p", "device": {"kind": "cpu", "cpu_model": "X", "name": "X"}, "interference": inter}

    probe = [{"cpu_model": "X"}]
    assert not any("hand-over" in w for w in compare(prof(new), probe)["warnings"])
    w = [w for w in compare(prof(old), probe)["warnings"] if "hand-over" in w]
    assert len(w) == 1 and "kv_decoder" in w[0] and "owned an OpenMP team" in w[0]
