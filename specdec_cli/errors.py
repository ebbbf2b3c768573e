"""Errors a user can fix. The CLI prints them as one line and exits 2; anything else exits 1."""


class SpecdecError(Exception):
    """Bad usage or bad input: missing file, unknown model, out-of-range option, NaN logits..."""


class NonFiniteLogitsError(SpecdecError):
    """NaN or +inf in logits given to verification (−inf marks a masked token and is allowed)."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type when it has none): what a one-line error quotes."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]
