import typer

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command()
def version():
    """Print the version."""
    from specdec_cli import __version__

    typer.echo(__version__)
