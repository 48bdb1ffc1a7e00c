"""AOTInductor + C++: the reward model exported with ``torch.export``, compiled ahead of time by
``torch._inductor.aoti_compile_and_package`` into a ``.pt2`` package, and timed by a small C++ program
(``calibrate/cpp/aoti_score.cpp``) that loads the package with ``torch::inductor::AOTIModelPackageLoader``
and calls it with no Python in the process.

Pieces and where they are cached:

* the program: configured with CMake against the libtorch inside the installed torch wheel
  (``torch.utils.cmake_prefix_path``, C++20, Release, ``-j2``) on first use, in
  ``<cache>/cpp/<key>/aoti_score`` where ``<cache>`` is ``$RLHFSIM_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/rlhfsim``, else ``~/.cache/rlhfsim``, and ``<key>`` = torch version + C++ ABI + a
  hash of the sources and the compiler. It is built in a temporary directory under an exclusive file
  lock and renamed into place, so concurrent calibrations neither corrupt nor duplicate the build.
  ``rebuild_program()`` (or deleting the directory) forces a rebuild.
* the package: one per (model weights fingerprint, batch, length, input dtype, device, threads, torch
  version), static shapes, in ``<cache_dir>/aoti/<key>.pt2`` (``cache_dir`` is ``time_scoring``'s
  argument), written to a temporary name and renamed.

Timing (done by the program; see the .cpp header): ``first_call_s`` is the first ``run()`` after loading;
``samples_s`` are ``iters`` calls after ``warmup`` untimed calls, ``std::chrono::steady_clock`` on CPU and
CUDA events on GPU. ``setup_s`` = export + AOT compile + package time (0 when the package came from the
cache, as for every runtime that reuses its artifacts) + the program's package load time. The one-off
program build is not part of any point: it is in ``AotiCpp.build`` (``ProgramBuild.build_s``).
Units: seconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from calibrate.measuring.interleave import Sampler
from calibrate.runtimes.base import Runtime, ScoreModule, model_key
from rlhfsim.errors import RlhfsimError

CPP_DIR = Path(__file__).resolve().parent.parent / "cpp"
SOURCES = ("CMakeLists.txt", "aoti_score.cpp")
PROGRAM = "aoti_score"
BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 900
_MAGIC = b"RLHFTEN1"
_DTYPE_CODES = {torch.int64: 1, torch.float32: 2}
PACKAGE_FORMAT = 2  # bump when what export_package writes changes, so stale cached packages are not reused


class AotiUnsupported(RlhfsimError):
    """This model cannot be exported or AOT-compiled with the installed torch: the runtime is unavailable
    for it (the message says why); other runtimes and models are unaffected."""


@dataclass(frozen=True)
class ProgramBuild:
    """The built ``aoti_score`` executable; ``build_s`` is how long its build took (when it was built,
    possibly by an earlier process), ``built_now`` whether this process built it."""

    path: Path
    key: str
    build_s: float
    built_now: bool


@dataclass(frozen=True)
class ProgramResult:
    """What one run of ``aoti_score`` reported (seconds; ``scores`` float32 CPU, the last call's output)."""

    samples_s: list[float]
    first_call_s: float
    load_s: float
    scores: torch.Tensor
    info: dict


def default_cache_dir() -> Path:
    """$RLHFSIM_CACHE_DIR, else $XDG_CACHE_HOME/rlhfsim, else ~/.cache/rlhfsim."""
    env = os.environ.get("RLHFSIM_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlhfsim"


def _compiler() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _torch_cmake_prefix() -> Path:
    return Path(torch.utils.cmake_prefix_path)


def program_key() -> str:
    """torch version, the wheel's C++ ABI, and a hash of the sources and the compiler's identity."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (CPP_DIR / name).read_bytes() + b"\0")
    cxx = _compiler() or ""
    h.update(cxx.encode())
    if cxx:
        ver = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
        h.update(ver.stdout.encode())
    h.update(str(_torch_cmake_prefix()).encode())
    tv = torch.__version__.replace("+", "_")
    return f"torch{tv}-abi{int(torch._C._GLIBCXX_USE_CXX11_ABI)}-{h.hexdigest()[:16]}"


@contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock held while one process builds what others would build too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_program(build_root: Path | None = None) -> ProgramBuild:
    """The ``aoti_score`` executable, built on first use (see the module docstring). A failed build raises
    a one-line ``RlhfsimError`` naming the step and the build log."""
    root = Path(build_root) if build_root is not None else default_cache_dir() / "cpp"
    key = program_key()
    final = root / key
    exe = final / PROGRAM

    def cached() -> ProgramBuild | None:
        if not os.access(exe, os.X_OK):
            return None
        try:
            build_s = float(json.loads((final / "build.json").read_text())["build_s"])
        except (OSError, ValueError, KeyError, TypeError):
            build_s = float("nan")
        return ProgramBuild(exe, key, build_s, False)

    found = cached()
    if found:
        return found
    with _file_lock(root / f"{key}.lock"):
        found = cached()  # another process may have finished the build while we waited
        if found:
            return found
        if shutil.which("cmake") is None or _compiler() is None:
            raise RlhfsimError("aoti_cpp: building the C++ scorer needs cmake and a C++ compiler on PATH")
        tmp = root / f"{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log = root / f"{key}.build.log"
        configure = ["cmake", "-S", str(CPP_DIR), "-B", str(tmp), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DCMAKE_PREFIX_PATH={_torch_cmake_prefix()}",
                     f"-DRLHFSIM_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
        if os.environ.get("CXX"):
            configure.append(f"-DCMAKE_CXX_COMPILER={_compiler()}")
        build = ["cmake", "--build", str(tmp), "--target", PROGRAM, "-j2"]
        t0 = time.perf_counter()
        with open(log, "w") as out:
            for step, cmd in (("cmake configure", configure), ("cmake build", build)):
                out.write("$ " + " ".join(cmd) + "\n")
                out.flush()
                try:
                    rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S).returncode
                except subprocess.TimeoutExpired:
                    rc = f"timeout after {BUILD_TIMEOUT_S} s"
                if rc != 0:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise RlhfsimError(f"aoti_cpp: building the C++ scorer failed ({step}: exit {rc}); log: {log}")
        build_s = time.perf_counter() - t0
        if not os.access(tmp / PROGRAM, os.X_OK):
            raise RlhfsimError(f"aoti_cpp: the C++ build finished but produced no {PROGRAM} in {tmp}; log: {log}")
        shutil.copy(log, tmp / "build.log")
        (tmp / "build.json").write_text(json.dumps({"build_s": build_s, "torch": torch.__version__, "key": key}))
        os.rename(tmp, final)
        return ProgramBuild(final / PROGRAM, key, build_s, True)


def write_inputs(path: Path, tensors: list[torch.Tensor]) -> None:
    """The raw tensor file ``aoti_score`` reads (format in the .cpp header): int64 or float32 tensors."""
    with open(path, "wb") as f:
        f.write(_MAGIC + struct.pack("<I", len(tensors)))
        for i, t in enumerate(tensors):
            if t.dtype not in _DTYPE_CODES:
                raise RlhfsimError(f"aoti_cpp: input {i}: expected an int64 or float32 tensor, got {t.dtype}")
            t = t.detach().cpu().contiguous()
            f.write(struct.pack("<II", _DTYPE_CODES[t.dtype], t.dim()) + struct.pack(f"<{t.dim()}q", *t.shape))
            f.write(t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes())


def run_program(package: Path, inputs: list[torch.Tensor], *, device: str, warmup: int, iters: int,
                threads: int = 0, program: ProgramBuild | None = None) -> ProgramResult:
    """Run ``aoti_score`` on ``package`` with ``inputs``; errors come back as one-line ``RlhfsimError``."""
    package = Path(package)
    if not package.is_file():
        raise RlhfsimError(f"aoti_cpp: expected an AOTInductor package (.pt2), got {str(package)!r} (no such file)")
    prog = program or ensure_program()
    with tempfile.TemporaryDirectory(prefix="rlhfsim-aoti-") as td:
        in_path, out_path = Path(td) / "inputs.bin", Path(td) / "out.json"
        write_inputs(in_path, inputs)
        cmd = [str(prog.path), str(package), str(in_path), str(out_path), "--warmup", str(warmup),
               "--iters", str(iters), "--device", device, "--threads", str(threads)]
        proc = _run_measured(cmd, Path(td))
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            errs = [ln for ln in lines if ln.startswith(f"{PROGRAM}: error:")]
            why = (errs or lines or ["no message"])[-1]
            raise RlhfsimError(f"aoti_cpp: {PROGRAM} failed (exit {proc.returncode}): {why}")
        info = json.loads(out_path.read_text())
        if info.get("peak_rss_mb", -1) < 0:
            info["peak_rss_mb"] = None
    if len(info["samples_s"]) != iters:
        raise RlhfsimError(f"aoti_cpp: expected {iters} samples from {PROGRAM}, got {len(info['samples_s'])}")
    scores = torch.tensor(info.pop("scores"), dtype=torch.float32).reshape(info["output_shape"])
    return ProgramResult([float(x) for x in info["samples_s"]], float(info["first_call_s"]),
                         float(info["load_s"]), scores, info)


@dataclass(frozen=True)
class _Proc:
    returncode: int
    stderr: str
    maxrss_mb: float


def _run_measured(cmd: list[str], workdir: Path) -> _Proc:
    """Run ``cmd`` and return its exit code and stderr (``maxrss_mb``: wait4's ru_maxrss, which on Linux
    keeps the forked parent's high-water mark across exec, so it is not the program's memory; the program
    reports its own ``peak_rss_mb`` from /proc/self/status)."""
    err_path = workdir / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        timer = threading.Timer(RUN_TIMEOUT_S, proc.kill)
        timer.daemon = True
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:   # interrupted (Ctrl-C, SIGTERM): the program must not outlive us
            proc.kill()
            os.waitpid(proc.pid, 0)
            proc.returncode = -9
            raise
        finally:
            timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode == -9:
        raise RlhfsimError(f"aoti_cpp: {PROGRAM} ran past {RUN_TIMEOUT_S} s ({cmd[1]!r})")
    return _Proc(proc.returncode, err_path.read_text(errors="replace"), usage.ru_maxrss / 1024.0)


def input_signature(tensors: list[torch.Tensor]) -> str:
    """``int64[2,16];int64[2,16]``: stored in the package metadata; ``aoti_score`` refuses other inputs."""
    names = {torch.int64: "int64", torch.float32: "float32"}
    return ";".join(f"{names.get(t.dtype, str(t.dtype))}[{','.join(map(str, t.shape))}]" for t in tensors)


def weights_fingerprint(model) -> str:
    """A hash over every weight's name, shape, dtype and a strided sample of ~64 of its values: the package
    embeds the weights, so two models that differ anywhere (seed, one fine-tuned layer) get two packages."""
    h = hashlib.sha256()
    sums = []
    with torch.no_grad():
        for name, t in model.state_dict().items():
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
            flat = t.reshape(-1)
            sample = flat[:: max(1, flat.numel() // 64)]
            sums.append(sample.double().sum() if flat.numel() else flat.new_zeros((), dtype=torch.float64))
    if sums:
        h.update(torch.stack(sums).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def package_key(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, device: str) -> str:
    """Everything the compiled package depends on: weights fingerprint and sizes, the static input shapes
    and dtypes, the device type, the CPU thread count the kernels were generated for, torch's version."""
    parts = [f"format{PACKAGE_FORMAT}", type(model).__name__, model_key(model), weights_fingerprint(model),
             "x".join(map(str, input_ids.shape)), str(input_ids.dtype),
             str(attention_mask.dtype), torch.device(device).type, str(torch.get_num_threads()), torch.__version__]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def export_package(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, device: str,
                   cache_dir: Path) -> tuple[Path, float, bool]:
    """``(package path, seconds spent exporting and compiling now, whether it came from the cache)``.
    Raises ``AotiUnsupported`` when torch cannot export or compile this model."""
    key = package_key(model, input_ids, attention_mask, device)
    out_dir = Path(cache_dir) / "aoti"
    path = out_dir / f"{key}.pt2"
    if path.is_file():
        return path, 0.0, True
    with _file_lock(out_dir / f"{key}.lock"):
        if path.is_file():
            return path, 0.0, True
        tmp = out_dir / f"{key}.tmp-{os.getpid()}.pt2"
        signature = input_signature([input_ids, attention_mask])
        what = f"{type(model).__name__} with torch {torch.__version__} on {torch.device(device).type}"
        t0 = time.perf_counter()
        with torch.no_grad():
            try:
                exported = torch.export.export(ScoreModule(model).eval(), (input_ids, attention_mask))
            except Exception as e:  # torch.export raises many types; all mean "not exportable"
                why = f"{type(e).__name__}: {_first_line(e)}"
                raise AotiUnsupported(f"aoti_cpp: cannot torch.export {what}: {why}") from None
            try:
                torch._inductor.aoti_compile_and_package(
                    exported, package_path=str(tmp),
                    inductor_configs={"aot_inductor.metadata": {"rlhfsim_inputs": signature}})
            except Exception as e:
                tmp.unlink(missing_ok=True)
                why = f"{type(e).__name__}: {_first_line(e)}"
                raise AotiUnsupported(f"aoti_cpp: AOTInductor cannot compile {what}: {why}") from None
        os.replace(tmp, path)
        return path, time.perf_counter() - t0, False


def export_remembered(unsupported: dict[str, str], name: str, model, input_ids, attention_mask, *, device: str,
                      cache_dir: Path) -> tuple[Path, float]:
    """``export_package`` for runtime ``name``, remembering per model class in ``unsupported`` why a model
    cannot be exported (the message names ``name``), so later shapes of that class fail at once.
    Returns (package, seconds spent making it now)."""
    cls = type(model).__name__
    if cls in unsupported:
        raise AotiUnsupported(unsupported[cls])
    try:
        package, package_s, _ = export_package(model, input_ids, attention_mask, device=device, cache_dir=cache_dir)
    except AotiUnsupported as e:
        unsupported[cls] = str(e).replace("aoti_cpp:", f"{name}:", 1)
        raise AotiUnsupported(unsupported[cls]) from None
    return package, package_s


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


class AotiCpp(Runtime):
    """AOTInductor package timed by the C++ ``aoti_score`` program (no Python in the timed loop)."""

    NAME = "aoti_cpp"

    def __init__(self, build_root: Path | None = None):
        self.build_root = build_root
        self.build: ProgramBuild | None = None      # the program used, with its build time
        self.last_info: dict = {}                   # the program's JSON report of the last point
        self.unsupported: dict[str, str] = {}       # model class -> why it cannot be exported
        self.build_error: RlhfsimError | None = None  # a failed build is not retried for every model

    def available(self, device: str) -> tuple[bool, str]:
        import torch._inductor

        if not hasattr(torch._inductor, "aoti_compile_and_package"):
            return False, f"torch {torch.__version__} has no torch._inductor.aoti_compile_and_package"
        if shutil.which("cmake") is None:
            return False, "cmake not found on PATH (needed to build the C++ scorer)"
        if _compiler() is None:
            return False, "no C++ compiler found ($CXX, c++, g++ or clang++)"
        if not (_torch_cmake_prefix() / "Torch" / "TorchConfig.cmake").is_file():
            return False, f"the torch wheel has no TorchConfig.cmake under {_torch_cmake_prefix()}"
        kind = torch.device(device).type
        if kind == "cuda" and not torch.cuda.is_available():
            return False, "CUDA is not available to torch"
        if kind not in ("cpu", "cuda"):
            return False, f"expected device cpu or cuda, got {device!r}"
        return True, ""

    def package(self, model, input_ids, attention_mask, *, device: str, cache_dir: Path) -> tuple[Path, float]:
        """(the AOTInductor package of this model and input shape, seconds spent making it now)."""
        ok, why = self.available(device)
        if not ok:
            raise RlhfsimError(f"{self.NAME}: unavailable on {device}: {why}")
        return export_remembered(self.unsupported, self.NAME, model, input_ids, attention_mask, device=device,
                                 cache_dir=cache_dir)

    def sampler(self, model, input_ids, attention_mask, *, device: str, warmup: int, cache_dir: Path) -> Sampler:
        if self.build_error is not None:
            raise self.build_error
        if self.build is None:
            try:
                self.build = ensure_program(self.build_root)
            except RlhfsimError as e:
                self.build_error = e
                raise
        package, package_s = self.package(model, input_ids, attention_mask, device=device, cache_dir=cache_dir)
        return ProgramSampler(self, package, package_s, [input_ids, attention_mask], device, warmup)


class ProgramSampler(Sampler):
    """``aoti_score`` as an interleaved contender: every call of ``first``/``round`` is one launch of the
    program (load the package, one untimed warm call (``warmup`` for the first launch), then the timed
    calls), so each round is also a fresh process. ``peak_mem_mb`` is the program's own peak RSS (CPU)."""

    def __init__(self, rt: AotiCpp, package: Path, package_s: float, inputs: list[torch.Tensor], device: str,
                 warmup: int):
        self.rt, self.package, self.inputs, self.warmup = rt, package, inputs, warmup
        dev = torch.device(device)
        self.dev_arg = "cpu" if dev.type == "cpu" else f"cuda:{dev.index or 0}"
        self.threads = torch.get_num_threads() if dev.type == "cpu" else 0
        self.package_s = package_s
        self.setup_s = package_s

    def _run(self, warmup: int, iters: int) -> ProgramResult:
        res = run_program(self.package, self.inputs, device=self.dev_arg, warmup=warmup, iters=iters,
                          threads=self.threads, program=self.rt.build)
        self.output = res.scores.reshape(-1)
        self.rt.last_info = {**res.info, "package": str(self.package), "package_s": self.package_s,
                             "build_s": self.rt.build.build_s}
        return res

    def first(self) -> float:
        res = self._run(self.warmup, 1)
        self.setup_s = self.package_s + res.load_s
        if self.dev_arg == "cpu":
            self.peak_mem_mb = res.info.get("peak_rss_mb")
        return res.first_call_s

    def round(self, k: int) -> list[float]:
        return self._run(1, k).samples_s


def rebuild_program(build_root: Path | None = None) -> ProgramBuild:
    """Delete the cached build of the current sources (under the build lock) and build again."""
    root = Path(build_root) if build_root is not None else default_cache_dir() / "cpp"
    key = program_key()
    with _file_lock(root / f"{key}.lock"):
        shutil.rmtree(root / key, ignore_errors=True)
    return ensure_program(root)
