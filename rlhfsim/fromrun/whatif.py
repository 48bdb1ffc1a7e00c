"""``rlhfsim whatif OVERLAY --set KEY=VALUE ...``: a run that ``calibrate --from-run`` fitted, with something changed,
priced with the same fitted terms: measured | fitted | what-if per phase and for the step, each what-if number with
a 90% interval from the fit's own uncertainty.

The run is rebuilt as it was fitted, from what the overlay records of it (``from_run.runs[]``: the launch's text,
the GPU, the verl release, the ``--set`` list and the log's mean prompt and response lengths), and the change
applied:

* a KEY that is a scenario path (its first part one of the scenario's blocks: ``cluster``, ``schedule``,
  ``workload``, ``generation``, ``placement``, ``execution``, ``models``, ``algorithm.{kind,group_size,...}``) is set
  on the imported scenario, as ``rlhfsim simulate --set`` sets it (``schedule.kind=oppo``);
* any other KEY is a launch setting, applied after the launch's own, as ``rlhfsim import verl --set`` applies it
  (``trainer.n_gpus_per_node=16``, ``data.max_response_length=2048``).

**Response lengths.** The fit matched the response lengths' shape to the log (``rlhfsim.fromrun.lengths``: a
lognormal, median e^mu and log-sd sigma, cut at the cap c). The what-if carries that shape unless it changes the
lengths, and says what it did:

* nothing about lengths changed: the fitted shape, as fitted;
* a new mean (``--mean-response-len``, tokens or ``2x`` the logged mean; the mean of the responses as verl logs it,
  i.e. after the cut): the fitted sigma kept, mu solved so that the capped mean
  E[min(X, c')] = e^(mu + sigma^2/2) Phi((ln c' - mu - sigma^2)/sigma) + c' (1 - Phi((ln c' - mu)/sigma))
  is the new mean at the what-if's cap c';
* only the cap changed (``data.max_response_length``): the fitted lognormal (mu, sigma) cut at the new cap: the
  policy's lengths as fitted, only the cut moves, so the mean moves with it (the note gives the new mean);
* the KEY sets ``workload.response_length`` itself: that shape, and a note that it replaced the fitted one.

**Interval.** Two parts, the same two that ``simulate --profile OVERLAY`` carries (``rlhfsim.sim.uncertainty``):

* the fitted terms' uncertainty: the overlay records the fitted coordinates (x = ln e for an efficiency, s / scale
  for a time) with two covariances (``from_run.spread``, ``rlhfsim.fromrun.fit``): the bootstrap's over the log's
  steady steps and the misfit's, s^2 (J^T J)^-1. ``overlay_draws`` draws x ~ N(x*, C_bootstrap + C_misfit), clipped
  to the terms' bounds, as whole profiles (``term_draws``; an overlay written before the spread was recorded draws
  each term independently from its two recorded 90% intervals), and the what-if is simulated at each draw (same
  scenario and seed);
* the fit's misfit: what the fitted model still leaves between its phases and the logged ones, s^2 = RSS / (N - k)
  over the fit's N logged timers and k free terms, as a log-normal error on each phase its timers spanned (the
  bundled field record on the phases they did not; ``uncertainty.model_error``), applied to every draw by
  ``rlhfsim.sim.modelerror.widen``: each phase's span times exp(-r), the step as the sum of the widened phases
  where they run one after another (else the step's own record).

Each timer's interval is read off the simulator phase it is measured as (verl's ``timing_s/gen`` off generate, its
folds included: the weight sync, the old log-probs or the reward where the release times them there; OpenRLHF's
timers off the first phase of each). On a CPU profile (no model error) the interval is the draws' 5th and 95th
percentiles alone. It is still the fitted runs' error: a change that leaves their regime (another GPU, a model
size the fit did not see) can miss by more (docs/from-run.md, leave-one-run-out).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlhfsim.errors import RlhfsimError

DEFAULT_DRAWS = 32
LEVEL = 0.90
LENGTH_KEYS = ("workload.response_length",)


class WhatIfError(RlhfsimError):
    """A what-if that cannot be built: one line saying why."""


@dataclass(frozen=True)
class Change:
    """What a what-if changes: launch settings, scenario paths and the mean lengths (None: as logged; a float;
    or a string ``"2x"``: that multiple of the logged mean)."""

    launch: tuple[str, ...] = ()
    scenario: tuple[tuple[str, object], ...] = ()
    mean_response: float | str | None = None
    mean_prompt: float | str | None = None

    @property
    def text(self) -> str:
        parts = [*self.launch, *(f"{k}={v}" for k, v in self.scenario)]
        parts += [f"mean response {self.mean_response}"] if self.mean_response is not None else []
        parts += [f"mean prompt {self.mean_prompt}"] if self.mean_prompt is not None else []
        return ", ".join(parts) or "nothing"


def scenario_roots() -> dict[str, set[str] | None]:
    """The scenario's top-level blocks (None: any key under it), and for ``algorithm`` the keys that are the
    scenario's (verl has an ``algorithm`` block too: ``algorithm.adv_estimator`` is a launch setting)."""
    from rlhfsim.scenario.schema import Algorithm, Scenario

    roots: dict[str, set[str] | None] = {k: None for k in Scenario.model_fields}
    roots["algorithm"] = set(Algorithm.model_fields)
    return roots


def split_sets(sets: list[str] | tuple[str, ...]) -> Change:
    """``--set KEY=VALUE`` items as a ``Change`` (module docstring: a scenario path or a launch setting)."""
    from rlhfsim.scenario.loader import parse_set

    roots = scenario_roots()
    launch, scen = [], []
    for item in sets:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            raise WhatIfError(f"--set: expected KEY=VALUE (a launch setting such as trainer.n_gpus_per_node=16 or a "
                              f"scenario path such as schedule.kind=oppo), got {item!r}")
        head, _, rest = key.strip().lstrip("+").partition(".")
        sub = rest.partition(".")[0]
        if head in roots and (roots[head] is None or sub in roots[head]):
            scen.append(parse_set(item))
        else:
            launch.append(item.strip())
    return Change(tuple(launch), tuple(scen))


def _scaled(value: float | str | None, logged: float, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(?:([0-9]*\.?[0-9]+)\s*x|x\s*([0-9]*\.?[0-9]+))\s*", value)
        if m:
            return float(m.group(1) or m.group(2)) * logged
        try:
            value = float(value)
        except ValueError:
            raise WhatIfError(f"--mean-{what}-len: expected tokens (e.g. 400) or a multiple of the logged mean "
                              f"(e.g. 2x), got {value!r}") from None
    if not value > 0:
        raise WhatIfError(f"--mean-{what}-len: expected a positive number of tokens, got {value:g}")
    return float(value)


def capped_mean(mu: float, sigma: float, cap: float) -> float:
    from rlhfsim.fromrun.lengths import capped_mean as cm

    return cm(mu, sigma, cap)


def mu_for_mean(mean: float, sigma: float, cap: float) -> float:
    """The mu whose lognormal (mu, sigma) cut at ``cap`` has capped mean ``mean`` (< cap)."""
    from scipy.optimize import brentq

    if not 0 < mean < cap:
        raise WhatIfError(f"--mean-response-len: expected a mean below the what-if's response cap {cap:g}, got {mean:g} "
                          f"(raise the cap too: --set data.max_response_length=N)")
    f = lambda mu: capped_mean(mu, sigma, cap) - mean   # noqa: E731  (increasing in mu)
    lo, hi = math.log(mean) - 10 * sigma - 5, math.log(cap) + 10 * sigma + 5
    return float(brentq(f, lo, hi, xtol=1e-10))


def _block(mu: float, sigma: float) -> dict:
    from rlhfsim.fromrun.lengths import Z99

    return {"kind": "lognormal", "median": round(math.exp(mu), 2), "p99": round(math.exp(mu + Z99 * sigma), 2)}


@dataclass
class Built:
    """A run rebuilt from an overlay's record: its scenario, and what was done about its lengths."""

    scenario: object
    gpu: object
    notes: list[str] = field(default_factory=list)
    lengths: dict = field(default_factory=dict)


def _launch_text(rec: dict, overlay_path: Path) -> tuple[str, Path]:
    """The launch's text (recorded in the overlay; an older overlay: the file it names) and the directory it is
    read from (model paths in it are relative to it)."""
    p = Path(rec["launch"])
    here = p if p.is_file() else (overlay_path.parent / p if (overlay_path.parent / p).is_file() else None)
    if rec.get("launch_text") is not None:
        return rec["launch_text"], (here.parent if here is not None else overlay_path.parent)
    if here is None:
        raise WhatIfError(f"{overlay_path.name}: expected the launch of run {rec['id']!r} at {rec['launch']!r} "
                          f"(this overlay does not keep its text; fit it again with this rlhfsim), got no such file")
    from rlhfsim.fromrun.fit import read_launch

    return read_launch(here), here.parent


def build(rec: dict, overlay_path: Path, change: Change = Change()) -> Built:
    """The run as fitted (``change`` empty) or with ``change`` (module docstring), as a scenario."""
    from rlhfsim.fromrun import frameworks
    from rlhfsim.fromrun.fit import is_config
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.importers import ImportOptions
    from rlhfsim.scenario.loader import load_scenario

    text, base_dir = _launch_text(rec, overlay_path)
    lengths = rec["lengths"]
    resp = _scaled(change.mean_response, lengths["response"], "response")
    prompt = _scaled(change.mean_prompt, lengths["prompt"], "prompt")
    opts = ImportOptions(gpu=rec["gpu"], mean_response_len=lengths["response"],
                         mean_prompt_len=prompt if prompt is not None else lengths["prompt"], steps=4, name=rec["id"],
                         sets=tuple(rec["sets"]) + change.launch, verl_version=rec["verl_version"])
    fw = rec.get("framework", "verl")
    try:
        res = frameworks.import_launch(fw, text, opts, Path(rec["launch"]).name, is_config(Path(rec["launch"])))
    except RlhfsimError as e:
        raise WhatIfError(f"run {rec['id']}: {e}") from None
    scen = list(change.scenario)
    sc = load_scenario(res.scenario, base_dir=base_dir, overrides=scen)
    given = {item.partition("=")[0].strip().lstrip("+") for item in change.launch}
    ignored = [f"{st.key}={st.value} is not priced ({st.target}): the what-if does not move with it"
               for st in res.settings if st.key in given and st.status in ("unmapped", "no_cost")]
    user_shape = any(k == p or k.startswith(p + ".") for k, _ in scen for p in LENGTH_KEYS)
    if user_shape:
        notes, out_lengths = ["response lengths: the shape you set replaces the fitted one"], {}
    elif lengths.get("response_shape") is None and resp is not None:
        sc = _reimport_mean(fw, res, text, opts, base_dir, scen, resp, is_config(Path(rec["launch"])))
        notes, out_lengths = [f"response lengths: mean {resp:.1f} with the importer's shape (the fit matched the mean "
                              f"only)"], {}
    else:
        block, notes, out_lengths = fitted_shape(lengths, sc.workload.max_response_tokens, resp)
        if block is not None:
            sc = load_scenario(res.scenario, base_dir=base_dir, overrides=[*scen, ("workload.response_length", block)])
    notes = ignored + notes
    out_lengths.update(mean_prompt=opts.mean_prompt_len, cap=sc.workload.max_response_tokens)
    if get_gpu(sc.cluster.gpu).name != get_gpu(rec["gpu"]).name:
        notes.append(f"GPU: fitted on {rec['gpu']}, priced on {sc.cluster.gpu} with the same fitted fractions of peak and "
                     f"host times (an extrapolation the fit did not see)")
    return Built(sc, get_gpu(sc.cluster.gpu), notes, out_lengths)


def fitted_shape(lengths: dict, cap: int, mean: float | None = None) -> tuple[dict | None, list[str], dict]:
    """The response-length block a what-if with response cap ``cap`` and (None: unchanged) mean ``mean`` gets from
    the fitted run's ``lengths`` (module docstring), with its note and numbers; (None, [], {}): the fit matched
    the mean only, nothing to carry."""
    shape = lengths.get("response_shape")
    if shape is None:
        return None, [], {}
    cap_fit = lengths.get("response_cap", cap)
    sigma, mu = float(shape["sigma"]), math.log(shape["block"]["median"])
    if mean is not None:
        mu = mu_for_mean(mean, sigma, cap)
        note = (f"response lengths: the fitted shape re-derived for mean {mean:.1f} (was {lengths['response']:.1f}): "
                f"log-sd {sigma:.3f} kept, median {math.exp(mu):.1f} (was {shape['block']['median']:.1f}), cut at {cap}")
    elif cap != cap_fit:
        note = (f"response lengths: the fitted lognormal (median {math.exp(mu):.1f}, log-sd {sigma:.3f}) cut at the new "
                f"cap {cap} (was {cap_fit}): mean {capped_mean(mu, sigma, cap):.1f} (logged {lengths['response']:.1f}); "
                f"pass --mean-response-len to set the mean instead")
    else:
        note = (f"response lengths: the fitted shape carried (median {math.exp(mu):.1f}, log-sd {sigma:.3f}, cut at "
                f"{cap}; mean {lengths['response']:.1f} as logged)")
    block = _block(mu, sigma) if (mean is not None or cap != cap_fit) else dict(shape["block"])
    return block, [note], {"block": block, "sigma": sigma,
                           "mean_response": capped_mean(math.log(block["median"]), sigma, cap)}


def shape_for_scenario(rec: dict, sc) -> tuple[object, list[str]]:
    """A what-if given as a scenario (``python -m rlhfsim.fromrun.compare``): the fitted shape applied by the same
    rule. Its lengths count as unchanged when its response block is the one ``rlhfsim import verl`` builds for
    the logged mean (or is the fitted block itself); otherwise its lognormal's capped mean is the what-if's mean.
    A block of another kind is kept, with a note."""
    from rlhfsim.importers.common import RESPONSE_LOG_SD
    from rlhfsim.scenario.loader import load_scenario

    lengths, w = rec["lengths"], sc.workload
    if lengths.get("response_shape") is None:
        return sc, []
    rl = w.response_length
    if rl.kind != "lognormal":
        return sc, [f"response lengths: the scenario's own ({rl.kind}); the fitted shape not applied"]
    imported = round(lengths["response"] / math.exp(RESPONSE_LOG_SD ** 2 / 2), 1)
    same = abs(rl.median - imported) < 0.051 or (abs(rl.median - lengths["response_shape"]["block"]["median"]) < 0.006
                                                 and abs(rl.p99 - lengths["response_shape"]["block"]["p99"]) < 0.006)
    mean = None
    if not same:
        from rlhfsim.fromrun.lengths import Z99

        s = math.log(rl.p99 / rl.median) / Z99
        mean = capped_mean(math.log(rl.median), s, w.max_response_tokens)
    block, notes, _ = fitted_shape(lengths, w.max_response_tokens, mean)
    return load_scenario(sc.model_dump(mode="json"), base_dir=sc.base_dir,
                         overrides=[("workload.response_length", block)]), notes


def _reimport_mean(fw, res, text, opts, base_dir, scen, mean, is_yaml):
    from dataclasses import replace

    from rlhfsim.fromrun import frameworks
    from rlhfsim.scenario.loader import load_scenario

    res = frameworks.import_launch(fw, text, replace(opts, mean_response_len=mean), res.source, is_yaml)
    return load_scenario(res.scenario, base_dir=base_dir, overrides=scen)


def overlay_draws(prof: dict, n: int, seed: int = 0) -> list[dict]:
    """``n`` copies of a from-run overlay profile (merged, as ``load_profile`` returns it) whose fitted terms take
    one joint draw each (``rlhfsim.sim.uncertainty.term_draws``: from ``from_run.spread``, or for an older overlay
    from the terms' recorded intervals); [] when there is nothing to draw."""
    from rlhfsim.fromrun import terms as T
    from rlhfsim.sim.uncertainty import term_draws

    draws = term_draws(prof.get("from_run") or {}, n, np.random.default_rng(seed)) if n > 0 else {}
    if not draws:
        return []
    return [T.with_values(copy.copy(prof), {path: vals[k] for path, vals in draws.items()}) for k in range(n)]


def _timer_phase(rec: dict, scenario) -> dict[str, str]:
    """Each logged timer -> the simulator phase its interval is read off (module docstring, "Interval")."""
    from rlhfsim.contracts import VERL_PHASE_KEYS

    if rec.get("framework", "verl") != "verl":
        from rlhfsim.fromrun.frameworks import phase_groups

        return {k: ps[0] for k, ps in phase_groups(scenario).items() if ps}
    return {v: k for k, v in VERL_PHASE_KEYS.items()}


def _interval(prof: dict, gpu, rec: dict, scenario, point: dict, samples: list[dict]) -> tuple[dict, str]:
    """{timer: [lo, hi]} (``timing_s/step`` included) of a what-if: the draws ``samples`` widened by the fit's misfit
    (module docstring), or their percentiles alone where no model error applies; and what it rests on."""
    from rlhfsim.contracts import VERL_STEP_KEY
    from rlhfsim.sim.modelerror import widen
    from rlhfsim.sim.uncertainty import model_error

    q = (1 - LEVEL) / 2
    err = model_error(prof, gpu)
    if err is None:
        out = {}
        for k in point:
            vals = [s[k] for s in samples if k in s]
            if len(vals) >= 2:
                out[k] = [float(np.quantile(vals, q)), float(np.quantile(vals, 1 - q))]
        return out, "the draws alone (no model error on this device)"
    rep = _timer_phase(rec, scenario)
    points = [(s[VERL_STEP_KEY], {rep[k]: v for k, v in s.items() if k in rep}) for s in (samples or [point])]
    w = widen(err, points, LEVEL)
    out = {VERL_STEP_KEY: w["step_time_s_interval"]}
    for k in point:
        if k in rep and rep[k] in w["phases_s_interval"]:
            out[k] = w["phases_s_interval"][rep[k]]
    return out, err.source


def _spans(result, rec: dict) -> dict[str, float]:
    """The simulated run in the spans its framework's timers measure (``fit.predict``'s rule)."""
    from rlhfsim.contracts import VERL_PHASE_KEYS, VERL_STEP_KEY
    from rlhfsim.fromrun.fit import verl_spans

    if rec.get("framework", "verl") != "verl":
        from rlhfsim.fromrun.frameworks import spans

        return spans(result, result.setup.scenario)
    summary = result.summary
    out = verl_spans({VERL_PHASE_KEYS[p]: float(v) for p, v in summary["phases_s"].items()},
                     rec["weight_sync_in_gen"], rec.get("reward_in_adv", False), rec.get("old_log_prob_in_gen", False),
                     rec.get("reward_in_gen", False))
    out[VERL_STEP_KEY] = float(summary["step_time_s"])
    return out


def _simulate(built: Built, prof: dict):
    from rlhfsim.costs.model import CostModel
    from rlhfsim.fromrun.fit import priced
    from rlhfsim.sim.run import simulate

    return simulate(built.scenario, cost=CostModel(built.gpu, priced(prof, built.gpu)), max_work=None)


def runs_of(prof: dict, overlay: str, run_id: str | None) -> list[dict]:
    runs = (prof.get("from_run") or {}).get("runs") or []
    if not runs:
        raise WhatIfError(f"{overlay}: expected a from-run overlay (a from_run.runs section, written by "
                          f"`rlhfsim calibrate --from-run`), got none")
    if run_id is None:
        return runs
    chosen = [r for r in runs if r["id"] == run_id]
    if not chosen:
        raise WhatIfError(f"--run: expected one of {', '.join(r['id'] for r in runs)}, got {run_id!r}")
    return chosen


def whatif(overlay: str, change: Change, run_id: str | None = None, draws: int = DEFAULT_DRAWS, seed: int = 0) -> dict:
    """Each chosen run of the overlay as measured, as fitted (re-simulated now) and with ``change``, per phase in
    verl's names and for the step, with a 90% interval for the what-if (module docstring)."""
    from rlhfsim.costs.profile import load_profile

    path = Path(overlay)
    prof = load_profile(overlay)
    profiles = overlay_draws(prof, draws, seed)
    out = []
    misfit = ""
    for rec in runs_of(prof, overlay, run_id):
        fitted_b = build(rec, path)
        fitted = _spans(_simulate(fitted_b, prof), rec)
        changed = build(rec, path, change)
        wi = _spans(_simulate(changed, prof), rec)
        samples = [_spans(_simulate(changed, p), rec) for p in profiles]
        notes = list(changed.notes)
        drift = {k: v for k, v in fitted.items() if rec["fitted_s"].get(k) and abs(v / rec["fitted_s"][k] - 1) > 0.01}
        if drift:
            notes.append("fitted: re-simulated now, which differs by more than 1% from what the fit recorded for "
                         + ", ".join(f"{k} ({rec['fitted_s'][k]:.3f} s then)" for k in drift)
                         + " (the cost model changed since the fit: fit again for a what-if on today's model)")
        keys = list(dict.fromkeys([*rec["measured_s"], *wi]))
        iv, misfit = _interval(prof, changed.gpu, rec, changed.scenario, wi, samples)
        rows = []
        for k in keys:
            rows.append({"phase": k, "measured_s": rec["measured_s"].get(k), "fitted_s": fitted.get(k),
                         "whatif_s": wi.get(k),
                         "change_pct": (100 * (wi[k] - fitted[k]) / fitted[k] if fitted.get(k) and k in wi else None),
                         "whatif_interval_s": iv.get(k) if k in wi else None})
        out.append({"run": rec["id"], "change": change.text, "notes": notes, "lengths": changed.lengths,
                    "scenario": changed.scenario.model_dump(mode="json"), "rows": rows})
    return {"overlay": overlay, "draws": len(profiles), "seed": seed, "level": LEVEL,
            "interval_source": ("the fit's bootstrap and misfit covariance (from_run.spread)"
                                if (prof.get("from_run") or {}).get("spread") else
                                "the fitted terms' recorded 90% intervals, drawn independently"),
            "interval_misfit": misfit, "runs": out}


def write_scenarios(doc: dict, out: Path) -> list[str]:
    """Each run's what-if scenario as ``out/RUN.yaml`` (``rlhfsim whatif -o``), headed by what it is."""
    import yaml

    from rlhfsim.files import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for r in doc["runs"]:
        path = out / f"{r['run']}.yaml"
        head = [f"# Run {r['run']} of {doc['overlay']}, rebuilt by `rlhfsim whatif` with: {r['change']}.",
                *(f"# {n}" for n in r["notes"]),
                f"# Price it with the same fitted terms: --profile {doc['overlay']}"]
        write_atomic(path, "\n".join(head) + "\n" + yaml.safe_dump(r["scenario"], sort_keys=False))
        written.append(str(path))
    return written


def render(doc: dict) -> list[str]:
    """The what-if as text lines."""
    def f(v):
        return f"{v:10.3f}" if v is not None else f"{'-':>10}"

    lines = []
    for r in doc["runs"]:
        lines.append(f"run {r['run']}: measured | fitted | what-if ({r['change']})   overlay {doc['overlay']}")
        for n in r["notes"]:
            lines.append(f"  note: {n}")
        lines.append(f"  {'phase':26} {'measured':>10} {'fitted':>10} {'what-if':>10} {'change':>8}  "
                     f"{100 * doc['level']:.0f}% interval")
        for row in r["rows"]:
            ch = f"{row['change_pct']:+7.1f}%" if row["change_pct"] is not None else f"{'':8}"
            iv = row["whatif_interval_s"]
            ivs = f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "-"
            lines.append(f"  {row['phase']:26} {f(row['measured_s'])} {f(row['fitted_s'])} {f(row['whatif_s'])} {ch}  {ivs}")
    terms = (f"{doc['draws']} draws of the fitted terms ({doc['interval_source']}), each simulated"
             if doc["draws"] else "no draws of the fitted terms (--draws 0, or none recorded)")
    misfit = doc.get("interval_misfit") or ""
    lines.append(f"interval: {terms}; widened by {misfit}" if misfit and not misfit.startswith("the draws alone")
                 else f"interval: {terms} ({misfit or 'no model error'})")
    lines.append("  it holds the fitted runs' error, not the cost model's where the change leaves their regime "
                 "(docs/from-run.md)")
    return lines
