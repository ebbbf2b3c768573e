"""specdec: speculative decoding with fused verification kernels."""

__version__ = "0.1.0"
