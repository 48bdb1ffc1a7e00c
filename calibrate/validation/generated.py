"""``rlhfsim validate --generate N [--seed S]``: draw N scenarios from ``rlhfsim.validate_gen.RANGES``,
write them (with their models' ``config.json`` files and ``generated.json``) into a directory, and
validate them like any others.

The seed is drawn at run time (``secrets``) unless given, and printed with the command that reruns the
same set. The default profile is the blind one (``cpu``: the bundled quick calibration, measured at
its own grid on the catalog's tiny models, never at these shapes or operating points); ``--profile
quick`` is validate's own quick calibration of exactly the drawn models at their operating points, and
``--profile cpu,quick`` predicts the same measured steps with both, so the error of a profile that
never saw the shapes and the error left once they are calibrated are reported side by side.
"""

from __future__ import annotations

import json
import math
import secrets
import tempfile
from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError

MAX_GENERATE = 100
# The default --profile with --generate: the quick generic calibration measured now, its passes between blocks of the steps
# (calibrate.validation.calibration.measure_generic), then the bundled cpu profile, both blind to the drawn scenarios.
# The bundled one alone prices the machine as it was when it was measured; on this project's shared VM the
# same steps ran 30-35% faster at one hour than at another.
BLIND_PROFILE = "generic,cpu"


def parse_count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = None
    if n is None or not 1 <= n <= MAX_GENERATE:
        raise RlhfsimError(f"--generate: expected a number of scenarios from 1 to {MAX_GENERATE}, got {text!r}")
    return n


def parse_seed(text: str | None) -> int:
    if text is None:
        return secrets.randbelow(2**31)
    try:
        s = int(text)
    except ValueError:
        s = None
    if s is None or not 0 <= s < 2**63:
        raise RlhfsimError(f"--seed: expected an integer >= 0, got {text!r}")
    return s


def read_ranges(path: Path | None) -> dict | None:
    """A JSON mapping replacing some entries of RANGES (each written out with the set)."""
    from rlhfsim.validate_gen import RANGES

    if path is None:
        return None
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RlhfsimError(f"--ranges: expected a readable JSON file, got {str(path)!r} ({e})") from None
    keys = ("choices", "range", "log_range", "value")
    bad = [k for k, v in doc.items() if k not in RANGES or not isinstance(v, dict) or not any(x in v for x in keys)] \
        if isinstance(doc, dict) else ["<top level>"]
    if bad:
        raise RlhfsimError(f"--ranges: expected a mapping of RANGES entries ({', '.join(RANGES)}) each with one of "
                           f"{', '.join(keys)}, got {', '.join(map(str, bad))}")
    for name, entry in doc.items():
        _check_range_entry(name, entry, RANGES[name])
    return doc


def _check_range_entry(name: str, entry: dict, default: dict) -> None:
    """One ``--ranges`` entry against RANGES' own: the same kind of field (``choices``, ``range``,
    ``log_range`` or ``value``) with values of the same types, a non-empty list of choices, bounds in order."""
    def num(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    for field in ("choices", "range", "log_range", "value"):
        if field not in default:
            continue
        v, want = entry.get(field), default[field]
        where = f"--ranges {name}.{field}"
        if field == "choices" and not isinstance(want, list):
            raise RlhfsimError(f"{where}: expected no override ({want}: drawn from the rest), got {v!r}")
        if field == "choices":
            w = entry.get("weights")
            if w is not None and not (isinstance(w, list) and isinstance(v, list) and len(w) == len(v)
                                      and all(num(x) and x > 0 for x in w)):
                raise RlhfsimError(f"--ranges {name}.weights: expected one number > 0 per choice, got {w!r}")
            types = {type(x) for x in want}
            ok = isinstance(v, list) and v and all(type(x) in types for x in v)
            expect = f"a non-empty list of {'/'.join(sorted(t.__name__ for t in types))} like {want}"
        elif field == "value":
            ok, expect = num(v) and v > 0, f"a number > 0 like {want}"
        else:
            ints = all(isinstance(x, int) for x in want)
            ok = (isinstance(v, list) and len(v) == 2 and all(num(x) and (not ints or isinstance(x, int)) for x in v)
                  and v[0] <= v[1] and (field == "range" or v[0] > 0))
            expect = f"[low, high] with low <= high{' > 0' if field == 'log_range' else ''}, " \
                     f"{'integers ' if ints else ''}like {want}"
        if not ok:
            raise RlhfsimError(f"{where}: expected {expect}, got {v!r}")


def out_dir_for(out: Path | None, seed: int, n: int) -> Path:
    from calibrate.validation.calibration import cache_dir

    if out is None:
        base = cache_dir() / "generated"
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"seed{seed}-n{n}-", dir=base))
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RlhfsimError(f"--out: expected a new or empty directory for the drawn scenarios, got {str(out)!r}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def generate_set(count: str, seed: str | None, out: Path | None, ranges_file: Path | None,
                 device: str) -> tuple[list[Path], dict]:
    """Draw and write the set; returns the scenario paths and ``generated.json``'s content."""
    from rlhfsim.validate_gen import draw, write_set

    n = parse_count(count)
    s = parse_seed(seed)
    if device != "cpu":
        raise RlhfsimError(f"--generate: expected --device cpu (the ranges are sized for this CPU), got {device!r}")
    ranges = read_ranges(ranges_file)
    d = out_dir_for(out, s, n)
    drawn = draw(n, s, d, ranges)
    paths = write_set(drawn, d, ranges)
    meta = json.loads((d / "generated.json").read_text())
    if ranges:
        (d / "ranges.json").write_text(json.dumps(ranges, indent=1) + "\n")
        meta["rerun"] += f" --ranges {d / 'ranges.json'}"
        (d / "generated.json").write_text(json.dumps(meta, indent=1) + "\n")
    meta["dir"] = str(d)
    click.echo(f"generated {n} scenario(s) from seed {s} into {d} ({drawn.redraw_count} re-draw(s)); "
               f"rerun: {meta['rerun']}", err=True)
    return paths, meta
