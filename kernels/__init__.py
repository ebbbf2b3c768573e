"""Verification kernels, each beside its torch reference. Imported as ``specdec_cli.kernels``.

Whether Triton kernels compile for a GPU or run under the interpreter is chosen when `specdec_cli`
is imported (see its __init__): interpreter without a CUDA device.
"""

import os


def triton_backend_name() -> str:
    """"triton" when kernels compile for a GPU, "triton-interpreter" when they run on the CPU."""
    return "triton-interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else "triton"
