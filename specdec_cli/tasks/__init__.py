"""The two tasks: inputs in, text out, through the decoding loop.

    summarize.py        articles -> summaries, a causal-LM target and draft
    transcribe.py       audio -> transcripts, a Whisper target and draft, window by window
    whisper_rules.py    Whisper's rules for its logits: suppressed tokens, timestamp rules (the logits hook)
    audio.py            any audio file -> 16 kHz mono; silence; 30 s windows cut in pauses; reference texts

Each task takes its options (specdec_cli.options) and its (target, draft) from its load_pair. Tasks build on
drafts, models and decoding; bench and the CLI build on tasks, never the other way.
"""
