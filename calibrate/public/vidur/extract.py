"""Write the compact copy of Vidur's per-operation profiling data kept here (see README.md).

    python calibrate/public/vidur/extract.py GIT_DIR [COMMIT]

GIT_DIR: a git directory of github.com/microsoft/vidur (a bare mirror is enough: files are read with
``git show COMMIT:PATH``). Keeps, for the a100 and h100 directories only: from each ``compute/<gpu>/<org>/
<model>/mlp.csv`` the median kernel time (ms) of every operation plus the shape and size columns, at token
counts <= 64 and every multiple of 64 (every multiple of 1024 past 4096), one row per (num_tokens,
num_tensor_parallel_workers) (the first where Vidur repeated a pair); from each ``network/<gpu>_<topology>/
{all_reduce,send_recv}.csv`` the median (ms) and the size and worker columns of the message sizes nearest a
geometric grid (x1.5 from 2 KiB). The column names and directory layout are Vidur's, so
``calibrate.fitting.fromops`` reads the original files and this copy alike. Prints the files that are listed in
the commit but absent from the snapshot.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GPUS = ("a100", "h100")
SHAPE = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
         "num_tensor_parallel_workers"]
NET = ["rank", "num_workers", "size", "collective", "devices_per_node", "max_devices_per_node"]


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def _keep_tokens(n: int) -> bool:
    return n <= 64 or (n % 64 == 0 and n <= 4096) or n % 1024 == 0


def _geometric(sizes: list[int]) -> set[int]:
    keep, target = set(), 2048.0
    while target <= sizes[-1] * 1.5:
        keep.add(min(sizes, key=lambda s: abs(s - target)))
        target *= 1.5
    return keep


def main(git_dir: str, commit: str = "HEAD") -> None:
    names = _git(git_dir, "ls-tree", "-r", "--name-only", commit, "data/profiling").split()
    missing = []
    for name in names:
        rel = Path(name).relative_to("data/profiling")
        try:
            text = _git(git_dir, "show", f"{commit}:{name}")
        except subprocess.CalledProcessError:
            missing.append(name)
            continue
        if rel.parts[0] == "compute" and rel.parts[1] in GPUS and rel.name == "mlp.csv":
            rows = list(csv.DictReader(io.StringIO(text)))
            ops = [c for c in rows[0] if c.startswith("time_stats.") and c.endswith(".median")]
            cols, seen, out = ops + SHAPE, set(), []
            for r in rows:
                key = (int(r["num_tokens"]), int(r["num_tensor_parallel_workers"]))
                if key in seen or not _keep_tokens(key[0]):
                    continue
                seen.add(key)
                out.append([r[c] for c in cols])
        elif rel.parts[0] == "network" and rel.parts[1].split("_")[0] in GPUS and rel.name in ("all_reduce.csv", "send_recv.csv"):
            rows = list(csv.DictReader(io.StringIO(text)))
            med = f"time_stats.{rel.stem}.median"
            keep = _geometric(sorted({int(r["size"]) for r in rows}))
            cols = [med] + NET
            out = [[r[c] for c in cols] for r in rows if int(r["size"]) in keep]
        else:
            continue
        dest = HERE / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        w.writerows(out)
        dest.write_text(buf.getvalue())
        print(f"{rel}: {len(out)} of {len(rows)} rows")
    for name in missing:
        print(f"missing from the snapshot: {name}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: extract.py GIT_DIR [COMMIT]")
    main(*sys.argv[1:])
