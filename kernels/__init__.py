"""Verification kernels, each beside its torch reference. Imported as ``specdec_cli.kernels``.

    contract.py   what every implementation returns (Verification), PAD, the error flags
    reference.py  the accept/reject rule as plain loops: the specification
    draw.py       the torch pieces the torch twins share: the inverse-CDF draw, the out_tokens layout
    baseline.py   verification as transformers does it (the paper's baseline)
    exact.py      the exact Triton kernels and their torch twin (the CPU path)
    sigmoid.py    the sigmoid approximation: its torch twin (its Triton kernel is exact.py's with SIGMOID)
    compile.py    every plan compiled for a GPU architecture, without a GPU
    triton_launch.py  a compiled kernel launched again without Triton's dispatch (the door to its internals)

And the CPU kernels of the decoding loop's target (C++, built at first use by cpp.py):

    qmatmul.py         x · Wᵀ on a GGUF file's own blocks (qmatmul.cpp), its torch twin and reference
    rows_attention.py  a pass's attention, each row computed alone (rows_attention.cpp), its reference
    layer_ops.py       a Llama-shaped layer's norms and rotary embedding fused (layer_ops.cpp), beside torch's ops
    int8_rows.py       x · Wᵀ with W int8 per output row, each row of x quantized alone (int8_rows.cpp), its twin
    lean_layers.py     the Whisper self draft's int4 / int8 layers in one call (lean_layers.cpp), beside its Python loop
    float_rows.py      x · Wᵀ with fp32 / bf16 weights as they are, each row computed alone (float_rows.cpp), its twin
    frames_attention.py  many queries' attention at once: an encoder's frames, a prompt's prefill (frames_attention.cpp)
    cpp.py             how they are built at first use and cached (load_all: every kernel, the uncached built side by side)

Whether Triton kernels compile for a GPU or run under the interpreter is chosen when `specdec_cli`
is imported (see its __init__): interpreter without a CUDA device.
"""

from .contract import PAD, Verification, triton_backend_name

__all__ = ["PAD", "Verification", "triton_backend_name"]
