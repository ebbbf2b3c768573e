"""The `specdec` command: thin Typer commands that parse, call the library, and render."""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from specdec_cli.errors import SpecdecError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    help="Faster transformer decoding with speculative sampling, verified by fused Triton kernels.",
)
err = Console(stderr=True)


@app.callback()
def _root():
    """Faster transformer decoding with speculative sampling, verified by fused Triton kernels."""


def handle_errors(fn):
    """SpecdecError → one line, exit 2. Anything else → one line, exit 1 (traceback with SPECDEC_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SpecdecError as e:
            err.print(f"[bold red]error:[/] {e}", highlight=False)
            raise typer.Exit(2)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - the last resort: never a bare traceback
            if os.environ.get("SPECDEC_DEBUG") == "1":
                raise
            err.print(f"[bold red]error:[/] unexpected failure: {type(e).__name__}: {e} (set SPECDEC_DEBUG=1 for the traceback)", highlight=False)
            raise typer.Exit(1)

    return wrapper


# Options shared by several commands, defined once.
Device = Annotated[str, typer.Option(help="auto | cpu | cuda")]
Seed = Annotated[int, typer.Option(help="Random seed.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")]
Alpha = Annotated[float, typer.Option(help="Sigmoid approximation: lower logit constant α (paper eq. 5).")]
Beta = Annotated[float, typer.Option(help="Sigmoid approximation: upper logit constant β (paper eq. 5).")]


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise SpecdecError(f"--device must be auto, cpu or cuda (got {device!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecdecError("--device cuda: no CUDA device is available on this machine")
    return device


@app.command("verify-kernel")
@handle_errors
def verify_kernel(
    mode: Annotated[str, typer.Option(help="exact | sigmoid")] = "exact",
    vocab: Annotated[int, typer.Option(help="Vocabulary size of the random cases.")] = 32000,
    gamma: Annotated[int, typer.Option(help="Draft tokens per step (1..32).")] = 5,
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 4,
    samples: Annotated[int, typer.Option(help="Draws for the distribution test.")] = 100_000,
    cases: Annotated[int, typer.Option(help="Random cases checked decision for decision.")] = 8,
    alpha: Alpha = -1e4,
    beta: Beta = 1e4,
    device: Device = "auto",
    seed: Seed = 0,
    as_json: Json = False,
):
    """Prove a verification kernel right: the Triton kernel (compiled on CUDA, under the Triton
    interpreter on a CPU) against the reference on random cases, then the output distribution.

    For `sigmoid`, which is lossy by design, it checks the kernel against its own torch reference and
    reports how far the output distribution moves from the target's. Exits 0 only if every check passed.

    Examples:

        specdec verify-kernel --mode exact
        specdec verify-kernel --mode exact --vocab 151936 --gamma 10 --batch 2 --json
        specdec verify-kernel --mode sigmoid --alpha -1000 --beta 1000
    """
    from specdec_cli import kernel_check, render

    if mode not in ("exact", "sigmoid"):
        raise SpecdecError(f"--mode must be exact or sigmoid (got {mode!r})")
    kernel_check.validate(vocab, gamma, batch, samples, alpha, beta, cases)
    device = resolve_device(device)
    with render.status(f"verify-kernel --mode {mode}", quiet=as_json) as step:
        report = kernel_check.run(
            mode, vocab=vocab, gamma=gamma, batch=batch, samples=samples, alpha=alpha, beta=beta,
            device=device, seed=seed, cases=cases, progress=step,
        )
    if as_json:
        print(json.dumps(report.to_dict()))
    else:
        render.kernel_report(report)
    raise typer.Exit(0 if report.passed else 1)


def main():  # pragma: no cover - the console script
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
