"""What every launch importer shares: reading a launch script into its argument tokens, the record of
each setting (mapped, costless or unmapped), the options a launch does not carry (GPU, mean lengths),
model names to catalog shapes, and writing the scenario with its settings table as a YAML header.

An importer turns one framework's launch into a scenario mapping plus a list of ``Setting`` records,
one per setting of the launch, so nothing is dropped silently:

- ``mapped``: it sets a scenario field (``target`` names it);
- ``no_cost``: recognised, and it does not change a step's time in this model (a learning rate, a
  dataset path, a logger); ``target`` says why;
- ``unmapped``: it can change a step's time, but the scenario has no field for it (yet); ``target``
  says what it does, so the user can judge the miss.

Assumptions the importer had to make (a default mean response length, a rule reward's CPU cost) are
listed beside the settings and written into the scenario's header.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlhfsim.errors import RlhfsimError
from rlhfsim.models.catalog import CATALOG

STATUSES = ("mapped", "no_cost", "unmapped")

# Response lengths when the launch gives only a cap: a lognormal of log-sd 0.5 (p99 = 3.2 x median),
# clipped at the cap; the mean is --mean-response-len or half the cap.
RESPONSE_LOG_SD = 0.5
Z99 = 2.3263478740408408


class ImportError_(RlhfsimError):
    """A launch cannot be imported; the message names the setting. (Not ``ImportError``: that is
    Python's own for a failed module import.)"""


@dataclass(frozen=True)
class Setting:
    """One setting of the launch and what became of it."""

    key: str
    value: str
    status: str
    target: str

    def __post_init__(self):
        assert self.status in STATUSES, self.status


@dataclass(frozen=True)
class ImportOptions:
    """What a launch does not say. ``gpu``: hardware catalog name (a launch never names its GPU);
    ``mean_response_len`` / ``mean_prompt_len``: tokens (default: half the response cap, a quarter of
    the prompt cap); ``steps``: steps to simulate; ``sets``: extra ``key=value`` settings applied after
    the launch's own (verl: Hydra overrides; OpenRLHF: flags without the dashes); ``execution``: map the
    framework's step mechanics (micro-batches, packing, offload, ...) into the scenario's ``execution`` block
    (false: leave it off, the simulator's plain step); ``verl_version``: the verl release the launch ran on
    (verl only), for the defaults that changed between releases (``rlhfsim.importers.verl.VERSIONED``);
    ``max_response_len_logged`` / ``clip_ratio``: the run's logged longest response (verl ``response_length/max``,
    tokens) and share of responses cut at the cap (``response_length/clip_ratio``), to which the response lengths'
    tail is matched (``rlhfsim.workload.shape``); ``lengths_source`` / ``prompt_source``: where the response and the
    prompt lengths came from when not from the options (``--log FILE``), for the assumptions."""

    gpu: str | None = None
    mean_response_len: float | None = None
    mean_prompt_len: float | None = None
    steps: int = 4
    name: str | None = None
    sets: tuple[str, ...] = ()
    gpus_per_node: int | None = None
    execution: bool = True
    verl_version: str | None = None
    max_response_len_logged: float | None = None
    clip_ratio: float | None = None
    lengths_source: str | None = None
    prompt_source: str | None = None


@dataclass
class ImportResult:
    """A scenario mapping (load it with ``load_scenario``) and the record of how it was made."""

    framework: str
    source: str
    scenario: dict
    settings: list[Setting] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    def by_status(self, status: str) -> list[Setting]:
        return [s for s in self.settings if s.status == status]

    def to_json(self) -> dict:
        return {"framework": self.framework, "source": self.source, "scenario": self.scenario,
                "settings": [vars(s) for s in self.settings], "assumptions": list(self.assumptions)}


# --- launch scripts -------------------------------------------------------------------------------
_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)")
_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
_STOP = {">", ">>", "2>&1", "&", "|", ";", "&&", "||", "1>", "2>"}


def _expand(s: str, env: dict[str, str]) -> str:
    """``$NAME`` / ``${NAME}`` / ``${NAME:-default}`` from the script's own assignments; an unknown
    name is left as written, so the setting that uses it can be reported."""
    def sub(m):
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        if m.group(2) is not None:
            return _expand(m.group(2), env)
        return m.group(0)
    return _VAR.sub(sub, s)


def logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined and whole-line comments dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not cur and line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    if cur.strip():
        out.append(cur.strip())
    return out


def launch_tokens(text: str, markers: tuple[str, ...], what: str) -> list[str]:
    """The argument tokens of the first command in ``text`` that runs one of ``markers`` (a module or
    script name), with the script's variable assignments substituted. ``text`` may also be the
    arguments alone (no marker anywhere): then every token is an argument."""
    env: dict[str, str] = {}
    for line in logical_lines(text):
        if _assign(line, env):
            continue
        if not any(mk in line for mk in markers):
            continue
        try:
            toks = shlex.split(line, comments=True)
        except ValueError as e:
            raise ImportError_(f"{what}: expected a shell command line, got unbalanced quotes ({e})") from None
        start = next((i for i, t in enumerate(toks) if any(mk in t for mk in markers)), None)
        return _args_after(toks[start + 1:], env)
    if any(mk in text for mk in markers):
        raise ImportError_(f"{what}: expected a command running {' or '.join(markers)}, found none")
    try:
        toks = shlex.split(" ".join(logical_lines(text)), comments=True)
    except ValueError as e:
        raise ImportError_(f"{what}: expected launch arguments, got unbalanced quotes ({e})") from None
    return _args_after(toks, env)


def _assign(line: str, env: dict[str, str]) -> bool:
    """Record ``NAME=value`` / ``export NAME=value`` (a line that is only an assignment)."""
    try:
        toks = shlex.split(line, comments=True)
    except ValueError:
        return False
    if toks[:1] == ["export"]:
        toks = toks[1:]
    if len(toks) != 1:
        return False
    m = _ASSIGN.match(toks[0])
    if not m:
        return False
    env[m.group(1)] = _expand(m.group(2), env)
    return True


def _args_after(toks: list[str], env: dict[str, str]) -> list[str]:
    out = []
    for t in toks:
        if t in _STOP or t.startswith((">", "2>", "1>")):
            break
        if t in ("$@", "$*") or t.startswith(("${@", "${*")):
            continue  # the script's own arguments (none when imported)
        out.append(_expand(t, env))
    return out


def unresolved(value: str) -> str | None:
    """The first shell variable left in a value, if any."""
    m = _VAR.search(value)
    return m.group(0) if m else None


# --- models ---------------------------------------------------------------------------------------
# Hugging Face names whose config.json has exactly a catalog entry's shape (layers, hidden,
# intermediate, heads, KV heads, vocabulary, tied embeddings), checked against the published files.
SAME_SHAPE = {
    "qwen2-7b": "qwen2.5-7b",        # Qwen/Qwen2-7B(-Instruct): 28 x 3584, 18944, 28/4 heads, 152064 vocab
    "qwen2.5-math-7b": "qwen2.5-7b",  # Qwen/Qwen2.5-Math-7B: Qwen2.5-7B's shape, 4096 positions
    "qwen2.5-math-1.5b": "qwen2.5-1.5b",
    "meta-llama-3.1-8b": "llama-3.1-8b",
    "llama-3-8b": "llama-3.1-8b",     # Llama 3 and 3.1 8B share every shape number
    "meta-llama-3-8b": "llama-3.1-8b",
    "deepseek-r1": "deepseek-v3",     # deepseek-ai/DeepSeek-R1: DeepSeek-V3's config.json shape (its post-training)
}
_SUFFIXES = ("-instruct", "-chat", "-base", "-it", "-sft", "-hf")


def catalog_model(path: str) -> tuple[str, str] | None:
    """(catalog name, how it was matched) for a Hugging Face model name or a local path that carries
    one (``.../Qwen2.5-7B-Instruct``, ``models--Qwen--Qwen2.5-1.5B-Instruct/snapshots/...``), or None. A name
    that extends a known one after a dash (``Llama-3-8b-sft-mixture``) is taken as a fine-tune of that shape."""
    parts = [p for p in re.split(r"[/\\]", path.strip()) if p]
    known = {**{n: n for n in CATALOG}, **SAME_SHAPE}
    for part in reversed(parts):
        name = part.split("--")[-1].lower()
        base = name
        for suf in _SUFFIXES:
            base = base.removesuffix(suf)
        for cand in (name, base):
            if cand in known:
                note = "" if cand in CATALOG else " (same config.json shape)"
                return known[cand], (f"{part} -> {known[cand]}{note}" if known[cand] != part.lower() else known[cand])
        stems = [k for k in known if name.startswith(k + "-")]
        if stems:
            stem = max(stems, key=len)
            return known[stem], f"{part} -> {known[stem]} (named after {stem}: taken as a fine-tune of that shape)"
    return None


def model_ref(key: str, value: str) -> tuple[str, str]:
    """A scenario model reference for a launch's model path: a catalog name, or a local directory or
    config.json that exists. Anything else is an error naming the setting."""
    hit = catalog_model(value)
    if hit:
        return hit
    p = Path(value).expanduser()
    if (p / "config.json").is_file() or (p.suffix == ".json" and p.is_file()):
        return str(p), f"{value} (its config.json)"
    raise ImportError_(f"{key}: expected a model in the catalog ({', '.join(n for n in CATALOG if not n.startswith(('tiny', 'small')))}) "
                       f"or a local directory with a config.json, got {value!r}")


# --- lengths --------------------------------------------------------------------------------------
def response_length(mean: float | None, cap: int, assumptions: list[str], key: str, rows: int | None = None,
                    longest: float | None = None, clip: float | None = None, source: str | None = None) -> dict:
    """A lognormal response length with the given mean (tokens, of the lengths clipped at the cap). With the run's
    logged longest response (``longest``, its mean over steps) or clip ratio (``clip``) and the responses per step
    (``rows``), its tail is matched to them (``rlhfsim.workload.shape``: the clipped share at the cap, else the
    longest of a step); without them a log-sd of 0.5 is assumed."""
    given = f"from {source}" if source else "--mean-response-len"
    if longest is not None and not 0 < longest <= cap:
        raise ImportError_(f"--max-response-len-logged: expected the run's longest response in (0, {cap}] ({key}), "
                           f"got {longest:g}")
    if clip is not None and not 0 <= clip <= 1:
        raise ImportError_(f"--clip-ratio: expected the share of responses cut at {key} in [0, 1], got {clip:g}")
    if mean is None:
        if longest is not None or clip is not None:
            raise ImportError_("--mean-response-len: expected the run's mean response length with "
                               "--max-response-len-logged/--clip-ratio (the tail is matched to both), got none")
        mean = cap / 2
        assumptions.append(f"mean response length {mean:g} tokens (half of {key}={cap}; the launch gives only "
                           f"the cap; pass --mean-response-len, e.g. the run's response_length/mean, or --log)")
    else:
        assumptions.append(f"mean response length {mean:g} tokens ({given})")
    if not 0 < mean <= cap:
        raise ImportError_(f"--mean-response-len: expected a mean in (0, {cap}] ({key}), got {mean:g}")
    if longest is not None or clip is not None:
        from rlhfsim.workload.shape import CLIP_MIN, match_capped_lognormal

        shape = match_capped_lognormal(mean, cap, rows or 1, longest=longest, clip=clip)
        if shape is not None:
            what = (f"clip ratio {clip:g} at the cap {cap}" if "clip_ratio" in shape["matched"] else
                    f"longest response {longest:g} (median longest of the step's {rows} responses)")
            by = f"from {source}" if source else ", ".join(o for o, v in (("--max-response-len-logged", longest),
                                                                            ("--clip-ratio", clip)) if v is not None)
            assumptions.append(f"response lengths lognormal matched to the logged mean {mean:g} and {what} "
                               f"({by}): median {shape['block']['median']:.0f}, p99 {shape['block']['p99']:.0f}, "
                               f"log-sd {shape['sigma']:.3f}, cut at {cap}")
            return shape["block"]
        why = "a mean at the cap" if mean >= cap else f"a clip ratio under {CLIP_MIN} and no longest response"
        assumptions.append(f"logged tail not matched ({why}): the assumed log-sd {RESPONSE_LOG_SD} instead")
    median = round(mean / math.exp(RESPONSE_LOG_SD ** 2 / 2), 1)
    p99 = round(median * math.exp(Z99 * RESPONSE_LOG_SD), 1)
    assumptions.append(f"response lengths lognormal (log-sd {RESPONSE_LOG_SD}: median {median:.0f}, p99 {p99:.0f}), "
                       f"cut at {cap}")
    return {"kind": "lognormal", "median": median, "p99": p99}


def prompt_length(mean: float | None, cap: int, assumptions: list[str], key: str, source: str | None = None) -> dict:
    """A normal prompt length (sd a quarter of the mean)."""
    if mean is None:
        mean = max(cap / 4, 1)
        assumptions.append(f"mean prompt length {mean:g} tokens (a quarter of {key}={cap}; pass --mean-prompt-len, "
                           f"e.g. the run's prompt_length/mean)")
    else:
        assumptions.append(f"mean prompt length {mean:g} tokens (--mean-prompt-len)" if source is None else
                           f"mean prompt length {mean:g} tokens (from {source})")
    if not 0 < mean <= cap:
        raise ImportError_(f"--mean-prompt-len: expected a mean in (0, {cap}] ({key}), got {mean:g}")
    return {"kind": "normal", "mean": round(mean, 1), "std": round(mean / 4, 1)}


# --- output ---------------------------------------------------------------------------------------
def render_yaml(res: ImportResult) -> str:
    """The scenario as YAML, headed by comments: source, every setting by status, every assumption."""
    lines = [f"# Imported from a {res.framework} launch ({res.source}) by `rlhfsim import {res.framework}`.",
             "# Settings the scenario has no field for (they can change the step time):"]
    unm = res.by_status("unmapped")
    lines += [f"#   UNMAPPED {s.key}={s.value}: {s.target}" for s in unm] or ["#   (none)"]
    lines.append("# Assumptions (not in the launch):")
    lines += [f"#   - {a}" for a in res.assumptions] or ["#   (none)"]
    lines.append("# Mapped settings:")
    lines += [f"#   {s.key}={s.value} -> {s.target}" for s in res.by_status("mapped")]
    lines.append("# Settings that cost nothing in this model:")
    lines += [f"#   {s.key}={s.value} ({s.target})" for s in res.by_status("no_cost")] or ["#   (none)"]
    body = yaml.safe_dump(res.scenario, sort_keys=False, default_flow_style=None, width=120)
    return "\n".join(lines) + "\n" + body


def parse_scalar(text: str):
    """A command-line value as YAML reads it (``True``/``1024``/``0.6``/``null``/``['a','b']``); text
    that YAML cannot read stays a string."""
    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(v, str) and re.fullmatch(r"[-+]?\d*\.?\d+(e[-+]?\d+)?", v, re.I):
        return float(v)  # YAML 1.1 reads 1e-6 as text
    return v


def setting_int(cfg: dict, key: str, name: str, lo: int = 1) -> int:
    """``cfg[key]`` as a whole number >= ``lo``; ``name``: how the launch spells the setting."""
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < lo:
        raise ImportError_(f"{name}: expected a whole number >= {lo}, got {v!r}")
    return int(v)


def setting_bool(cfg: dict, key: str, name: str, expected: str) -> bool:
    """``cfg[key]`` as a boolean; ``expected`` says how the launch writes one."""
    v = cfg[key]
    if not isinstance(v, bool):
        raise ImportError_(f"{name}: expected {expected}, got {v!r}")
    return v


def classify_by_patterns(key: str, unmapped: list[tuple[str, str]], no_cost: list[tuple[str, str]]) -> tuple[str, str]:
    """(status, why) of a setting no exact rule maps: the first ``unmapped`` pattern that matches, else the
    first ``no_cost`` one, else unmapped as not recognised."""
    for pat, why in unmapped:
        if re.search(pat, key):
            return "unmapped", why
    for pat, why in no_cost:
        if re.search(pat, key):
            return "no_cost", why
    return "unmapped", "not recognised by the importer"

