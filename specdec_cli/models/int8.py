"""--target-int8: int8 weights for the Whisper target's decoder linears and output layer on a CPU, through
torch's dynamic int8 linear (internals.dynamic_int8_linear: fbgemm, one weight scale per output row, the
activations quantized per call).

Measured against the other ways torch 2.13 offers, 2 threads of an AMD EPYC (avx512_vnni), Whisper base's
shapes, ms per call (bf16 nn.Linear | this | _weight_int8pack_mm in bf16):
    output layer 51 865 × 512, 1 row: 3.0 | 0.22 | 1.2      11 rows: 4.5 | 1.0 | 7.0
    fc1 2048 × 512, 1 row: 0.07 | 0.05 | 0.03               11 rows: 0.11 | 0.06 | 0.18
so it is used for every row count of a decoding step or pass. The encoder stays as it is: over its 1 500
frames this int8 was no faster than bf16 (0.36 against 0.38 s per 30 s window; 3.1 against 2.6 s on a busy
machine), and one activation scale per call over frames with Whisper's outlier activations moved the
encoder's output by 21 % (relative L2 norm, one 30 s window of LibriVox).

It changes the model: the output is measured against the unmodified one (benchmarks/README.md). And since a
call's activations share one scale, a row's result depends on the other rows of its call: a speculative pass
over γ+1 tokens can round a row otherwise than a one-token step does, so greedy speculative output may
differ from the int8 target's own autoregressive output where two tokens nearly tie (the bench's "= AR").
"""

from __future__ import annotations

import torch
from torch import nn

from specdec_cli import internals


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W in int8 (per output row), for x of any float dtype [..., in] -> [..., out] in x's."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        fp32 = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        with torch.no_grad():
            fp32.weight.copy_(linear.weight.float())
            if linear.bias is not None:
                fp32.bias.copy_(linear.bias.float())
        self.q = internals.dynamic_int8_linear(fp32.eval())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x.float()).to(x.dtype)


def quantize_linears(module: nn.Module) -> int:
    """Replace every nn.Linear inside `module` by an Int8Linear, in place; returns how many. CPU only."""
    n = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear(child))
                n += 1
    return n
