"""Errors a user can fix, and warnings a user should read. The CLI prints each as one line: an error then exits
2 (anything else exits 1), a warning lets the run go on."""

import warnings


class SpecdecError(Exception):
    """Bad usage or bad input: missing file, unknown model, out-of-range option, NaN logits..."""


class NonFiniteLogitsError(SpecdecError):
    """NaN or +inf in logits given to verification (−inf marks a masked token and is allowed)."""


class InvalidDraftTokensError(SpecdecError):
    """Draft token ids outside [0, V) given to verification (every backend refuses them alike)."""


class SpecdecWarning(UserWarning):
    """Something the user should know and the run goes on: the CLI shows it as one line on stderr."""


def warn(message: str) -> None:
    """Say `message` to the user (a SpecdecWarning: library callers see a Python warning)."""
    warnings.warn(message, SpecdecWarning, stacklevel=3)


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type when it has none): what a one-line error quotes."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]
