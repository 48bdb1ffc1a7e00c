"""One predictor per price in rlhfsim/costs/model.py: no ``_s`` / ``_parts`` / ``_terms`` / ``_many`` family of near-copies.

A price, its device-busy share and its terms come from one function (a ``Price``: ``rlhfsim.costs.terms``), so no two
functions or methods of the module may differ only by one of those suffixes (``roofline_s`` beside
``roofline_parts``, ``terms`` beside ``steps_terms`` ...). ``TWINS`` names the one pair kept, and why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from rlhfsim.costs import model as M

SOURCE = Path(M.__file__)
SUFFIX = re.compile(r"_(s|parts|terms|many)$")
# The scalar and the numpy form of the decode sum's series: the scalar is the clock's innermost call (a dispatch on
# the argument's type would cost it on every step it inverts), the array form prices a detached replica's segments
# in one pass; test_many_is_the_scalar_elementwise holds them to the same bits.
TWINS = {"_series", "_sum_max_linear"}


def _stems(source: Path = SOURCE) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(SUFFIX.sub("", node.name), []).append(node.name)
    return out


def test_no_function_of_the_cost_model_has_a_suffixed_twin():
    families = {stem: sorted(set(names)) for stem, names in _stems().items() if len(set(names)) > 1}
    assert set(families) == TWINS, families


def test_many_is_the_scalar_elementwise():
    rng = np.random.default_rng(0)
    a1, s1, a2, s2 = (rng.uniform(-1e-3, 1e-2, 64) for _ in range(4))
    s2[:8] = s1[:8]   # parallel lines: no crossing
    n = rng.integers(1, 5000, 64)
    many = M._sum_max_linear_many(a1, s1, a2, s2, n)
    assert [float(x) for x in many] == [M._sum_max_linear(*map(float, (a1[i], s1[i], a2[i], s2[i])), int(n[i]))
                                        for i in range(64)]
    total, active = M.decode_sum((a1, s1, a2, s2, 1e-4), n)
    for i in range(64):
        assert (float(total[i]), float(active[i])) == M.decode_sum((a1[i], s1[i], a2[i], s2[i], 1e-4), int(n[i]))


@pytest.mark.parametrize("suffix", ["_s", "_parts", "_terms", "_many"])
def test_the_check_sees_a_twin(suffix, tmp_path):
    path = tmp_path / "m.py"
    path.write_text(f"def price(x):\n    return x\n\n\ndef price{suffix}(x):\n    return x\n")
    assert _stems(path) == {"price": ["price", f"price{suffix}"]}
