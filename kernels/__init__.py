"""Verification kernels, each beside its torch reference. Imported as ``specdec_cli.kernels``."""
