"""Verification kernels, each beside its torch reference. Imported as ``specdec_cli.kernels``.

Triton picks compiled or interpreted execution when a kernel is decorated, i.e. at import. Without a
CUDA device a Triton kernel can only run under the interpreter, so that is chosen here, before any
kernel module is imported.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def triton_backend_name() -> str:
    """"triton" when kernels compile for a GPU, "triton-interpreter" when they run on the CPU."""
    return "triton-interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else "triton"
