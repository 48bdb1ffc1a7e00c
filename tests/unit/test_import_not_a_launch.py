"""A file that is no verl launch gets one line saying what a launch is (issue 54: "expected Hydra overrides
key=value, got 'python3'" read as if python3 were wrong, when real launches start with python3 too)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from rlhfsim.cli import main

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "scenarios" / "examples" / "field" / "playverl-h100-qwen2.5-0.5b-grpo.sh"


def run(tmp_path, text: str):
    f = tmp_path / "launch.sh"
    f.write_text(text)
    return CliRunner().invoke(main, ["import", "verl", str(f), "--gpu", "h100-sxm", "-o", str(tmp_path / "out")])


def test_a_command_that_runs_no_verl_trainer(tmp_path):
    r = run(tmp_path, "#!/bin/bash\npython3 train.py --lr 1e-6 --epochs 3\n")
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "expected a command running verl.trainer.main_ppo (python3 -m verl.trainer.main_ppo key=value ...)" in r.output
    assert "'python3 train.py --lr 1e-6 --epochs 3', which runs no verl trainer" in r.output


def test_a_real_launch_with_a_stray_word_names_the_word(tmp_path):
    text = LAUNCH.read_text().replace("trainer.nnodes=1", "trainer.nnodes=1 resume")
    r = run(tmp_path, text)
    assert r.exit_code == 2 and "expected Hydra overrides key=value after verl.trainer.main_ppo, got 'resume'" in r.output
