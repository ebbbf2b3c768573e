"""Example inputs: articles with reference summaries, and a speech clip with its transcript.

This folder ships inside specdec as the package `specdec_cli.examples` (pyproject.toml), so
`specdec bench --task summarize|transcribe` finds its default --data in an installed wheel too.
"""
