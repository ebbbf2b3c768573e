"""Where a model runs and in which precision: `--device` and `--dtype` resolved for this machine."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import torch

from specdec_cli import options
from specdec_cli.errors import SpecdecError


def resolve_device(name: str = "auto") -> str:
    """`auto` → "cuda" when torch sees a GPU, else "cpu"; `cuda` / `cuda:N` only when it exists.

    >>> resolve_device("cpu")
    'cpu'
    """
    name = (name or "auto").strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    if re.fullmatch(r"cuda(:\d+)?", name):
        if not torch.cuda.is_available():
            cuda = torch.version.cuda or "none (a CPU-only build)"
            raise SpecdecError(
                f"--device {name}: torch sees no CUDA GPU (torch {torch.__version__}, CUDA {cuda}); use --device cpu"
            )
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise SpecdecError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return name
    if name == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise SpecdecError("--device mps: the MPS backend is not available here; use --device cpu")
        return name
    raise SpecdecError(f"--device {name}: unknown device '{name}': use auto, cpu or cuda")


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    """True when the CPU does bf16 matmuls in hardware (x86 AVX512-BF16 / AMX, Arm BF16).

    Without it oneDNN emulates bf16 and fp32 is faster. Read from /proc/cpuinfo (Linux); False elsewhere.
    """
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.lower().startswith(("flags", "features")):
            flags.update(line.split(":", 1)[-1].split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_dtype(name: str | torch.dtype = "auto", device: str = "cpu") -> torch.dtype:
    """The torch dtype for `--dtype NAME` on `device`.

    auto: CUDA → bfloat16 where supported, else float16; CPU → bfloat16 when the CPU has bf16 in hardware
    (here a forward over 8 tokens costs ~1.2× one token in bf16 against ~1.8× in fp32, and a token
    ~2.6× less: speculative decoding pays only in bf16), else float32; MPS → float16.

    >>> resolve_dtype("float16", "cpu")
    torch.float16
    >>> resolve_dtype("bf16")
    torch.bfloat16
    """
    if isinstance(name, torch.dtype):
        return name
    key = options.dtype_name(name)
    if key != "auto":
        return getattr(torch, key)
    device = str(device)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "mps":
        return torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


