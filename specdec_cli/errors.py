"""Errors a user can fix. The CLI prints them as one line and exits 2; anything else exits 1."""


class SpecdecError(Exception):
    """Bad usage or bad input: missing file, unknown model, out-of-range option, NaN logits..."""


class NonFiniteLogitsError(SpecdecError):
    """NaN or +inf in logits given to verification (−inf marks a masked token and is allowed)."""
