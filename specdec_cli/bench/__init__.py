"""Measurement: `specdec bench` (harness.run) and `specdec verify-kernel` (kernel_check.run); see harness.py
for the rooms. bench builds on the tasks, drafts, models, decoding and kernels; only the CLI builds on it."""
