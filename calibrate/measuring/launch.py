"""Repeated process launches (``Grid.launches`` > 1, ``calibrate --launches N``): each launch of one
scoring operating point is a fresh Python process (``python -m calibrate.measuring.launch SPEC OUT``) that builds
the reward model again (same seed, so the same weights; a checkpoint is reloaded), prepares every
runtime (exports and AOTInductor packages come from the on-disk cache; ``torch.compile`` compiles
again) and runs the interleaved rounds (``calibrate.measuring.scoring.interleaved_point``). Launch-level effects
(allocator state, memory layout, which cores the threads land on, a one-off slow process) then show up
as spread between launches instead of being frozen into one measurement, which is what the study's
repeated launches guard against.

This module is the child (``main``); the parent, ``calibrate.measuring.scoring.run_launches``, starts the
launches and pools them: samples and their round indices concatenated (round indices offset per launch,
``launch_of`` per sample), ``first_call_s``/``setup_s`` of the first launch, the worst ``max_abs_diff``, the
highest peak memory; a runtime that failed in any launch is an error. (The child imports the parent's module,
never the reverse: the parent names the child by its module path only.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

def main(spec_path: str, out_path: str) -> None:
    import torch

    from calibrate.measuring.models import build_hf_model, load_hf_checkpoint, random_batch
    from calibrate.runtimes import RUNTIMES
    from calibrate.measuring.scoring import _seed, interleaved_point
    from calibrate.running.session import SEED
    from rlhfsim.models.catalog import ModelShape

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    shape = ModelShape(**spec["shape"])
    if spec["checkpoint"]:
        model = load_hf_checkpoint(spec["checkpoint"], "value", spec["dtype"], spec["device"])
    else:
        model = build_hf_model(shape, "value", spec["dtype"], spec["device"], seed=SEED)
    b, n = spec["batch"], spec["seq_len"]
    ids, mask = random_batch(shape.vocab, [n] * b, spec["device"], _seed(b, n))
    rts = {name: RUNTIMES[name]() for name in spec["runtimes"]}
    res = interleaved_point(model, rts, ids, mask, device=spec["device"], dtype=spec["dtype"], warmup=spec["warmup"],
                            rounds=spec["rounds"], per_round=spec["per_round"], cache_dir=Path(spec["cache_dir"]),
                            round_offset=spec["round_offset"])
    Path(out_path).write_text(json.dumps(res))


if __name__ == "__main__":
    main(*sys.argv[1:3])
