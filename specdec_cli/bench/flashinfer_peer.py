"""FlashInfer's `chain_speculative_sampling`, the GPU rejection sampler bench compares `exact` with.

Two doors to the same kernel: the flashinfer package when it imports, else its kernel built from the header the
flashinfer-python wheel ships (scripts/build_flashinfer_chain.sh) and named by SPECDEC_FLASHINFER_LIB. The second
exists because flashinfer 0.7's top-level import needs cutlass-dsl, cuda-tile and nccl4py, which a machine without
a network (the lent GPU) does not have.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

import torch

LIB_ENV = "SPECDEC_FLASHINFER_LIB"


@functools.cache
def _library() -> ctypes.CDLL | None:
    path = os.environ.get(LIB_ENV)
    if not path or not os.path.isfile(path):
        return None
    lib = ctypes.CDLL(path)
    lib.specdec_flashinfer_chain.restype = ctypes.c_int
    lib.specdec_flashinfer_chain.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_uint] * 3 + [ctypes.c_ulonglong] * 2 + [
        ctypes.c_void_p]
    return lib


def source() -> str | None:
    """Where the kernel comes from, or None when neither door is open."""
    if importlib.util.find_spec("flashinfer") is not None:
        return "flashinfer package"
    if _library() is not None:
        return f"flashinfer-python's sampling.cuh, built ({os.environ[LIB_ENV]})"
    return None


def chain_speculative_sampling(draft_probs: torch.Tensor, draft_ids: torch.Tensor, target_probs: torch.Tensor,
                               seed: int = 0, offset: int = 0) -> torch.Tensor:
    """draft_probs [B, γ, V], draft_ids [B, γ], target_probs [B, γ+1, V] (CUDA) -> out [B, γ+1] int32, −1 padded."""
    if importlib.util.find_spec("flashinfer") is not None:
        from flashinfer.sampling import chain_speculative_sampling as chain

        out = chain(draft_probs, draft_ids, target_probs)
        return out[0] if isinstance(out, tuple) else out
    lib = _library()
    if lib is None:
        raise RuntimeError(f"FlashInfer is not importable and {LIB_ENV} names no built kernel")
    B, G, V = draft_probs.shape
    q = draft_probs.float().contiguous()
    p = target_probs.float().contiguous()
    ids = draft_ids.to(torch.int32).contiguous()
    out = torch.empty(B, G + 1, dtype=torch.int32, device=q.device)
    counts = torch.zeros(2, B, dtype=torch.int32, device=q.device)  # accepted, emitted: the kernel adds to them
    err = lib.specdec_flashinfer_chain(q.data_ptr(), ids.data_ptr(), p.data_ptr(), out.data_ptr(), counts[0].data_ptr(),
                                       counts[1].data_ptr(), B, G, V, seed, offset,
                                       torch.cuda.current_stream(q.device).cuda_stream)
    if err != 0:
        raise RuntimeError(f"FlashInfer's kernel failed to launch: cudaError_t {err}")
    return out
