"""specdec: speculative decoding with fused verification kernels."""

import os as _os

__version__ = "0.1.0"


def _choose_triton_mode() -> None:
    """Without a CUDA device, Triton kernels can only run under its interpreter. Triton reads
    TRITON_INTERPRET when a function is decorated, and its own library (tl.sum, tl.zeros, ...) is
    decorated when triton.language is first imported, possibly by torch or transformers: so the choice
    is made here, before any of them can import Triton."""
    if "TRITON_INTERPRET" in _os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        _os.environ["TRITON_INTERPRET"] = "1"


_choose_triton_mode()
