"""--target-int8: int8 weights for the Whisper target's decoder linears and output layer on a CPU, through
kernels/int8_rows (one weight scale per output row; each activation row quantized alone, integer sums exact), so a
speculative pass computes every row as a one-token step does: greedy speculative output is the int8 target's own
autoregressive output, token for token.

torch's dynamic int8 linear (fbgemm), used before, quantized a call's activations with one scale over all its rows:
a pass could round a row otherwise than a step, and the int8 speculative transcript of the 74 s recording differed
from the int8 autoregressive one. Per call, 2 threads of an AMD EPYC (AVX-512 VNNI), Whisper base's shapes, weights
read from memory, ms (int8_rows | fbgemm | bf16 F.linear; benchmarks/qmatmul_speed.py, benchmarks/README.md):
output layer 51 865 × 512, 1 row 0.58 | 0.57 | 2.8, 11 rows 0.72 | 1.08 | 3.6; fc1 2048 × 512, 1 row 0.029 | 0.048 |
0.132, 11 rows 0.053 | 0.071 | 0.163.

The encoder stays as it is: over its 1 500 frames fbgemm's int8 was no faster than bf16 (0.36 against 0.38 s per 30 s
window), and one activation scale per call over frames with Whisper's outlier activations moved the encoder's output
by 21 % (relative L2 norm, one 30 s window of LibriVox). It changes the model: the output is measured against the
unmodified one (benchmarks/README.md).
"""

from __future__ import annotations

import torch
from torch import nn

from specdec_cli.kernels import int8_rows


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W in int8 (per output row), x of any float dtype [..., in] -> [..., out] in x's; each row of
    x computed alone (kernels/int8_rows)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.packed = int8_rows.pack(linear.weight.detach())
        self.bias = None if linear.bias is None else linear.bias.detach().float().contiguous()  # [out]
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_rows.mm(x, self.packed, self.bias)


def quantize_linears(module: nn.Module) -> int:
    """Replace every nn.Linear inside `module` whose rows are a multiple of 8 long (int8_rows.pack) by an Int8Linear,
    in place; returns how many. CPU only."""
    n = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.in_features % 8 == 0:
                setattr(parent, name, Int8Linear(child))
                n += 1
    return n
