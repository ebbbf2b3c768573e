"""specdec_cli.options: one rule and one default per option, read the same by the CLI, the library and bench."""

import dataclasses
import inspect
import math

import pytest

from specdec_cli import options
from specdec_cli.bench import config, runners
from specdec_cli.cli import app
from specdec_cli.decoding import generate
from specdec_cli.errors import SpecdecError

NOT_OPTIONS = {"articles", "audio", "as_json", "output_dir", "skip_existing"}  # inputs, where outputs go (options.check_output)


def command(name):
    return next(c for c in app.registered_commands if (c.name or c.callback.__name__) == name).callback


@pytest.mark.parametrize("name, cls", [("summarize", options.SummarizeOptions), ("transcribe", options.TranscribeOptions)])
def test_the_cli_shows_and_uses_the_options_defaults(name, cls):
    defaults, ray = cls(), options.RayOptions()  # the task's options, and --ray's (specdec_cli/distributed)
    params = inspect.signature(command(name)).parameters
    seen = set()
    for p in params.values():
        if p.name in NOT_OPTIONS:
            continue
        assert p.default == getattr(defaults if hasattr(defaults, p.name) else ray, p.name), \
            f"specdec {name} --{p.name.replace('_', '-')}"
        seen.add(p.name)
    assert seen == {f.name for c in (cls, options.RayOptions) for f in dataclasses.fields(c)}, "every option is on the CLI"


@pytest.mark.parametrize("name, cls, flag", [("summarize", options.SummarizeOptions, "--no-draft-int8"),
                                             ("transcribe", options.TranscribeOptions, "--no-draft-quantized")])
def test_the_cli_hands_the_library_the_options_it_parsed(monkeypatch, name, cls, flag):
    """Each option reaches the command as the options object, under the flag options.py gives it."""
    from typer.testing import CliRunner

    from specdec_cli.tasks import summarize, transcribe

    seen = []

    def stop(opts, progress=True):
        seen.append(opts)
        raise SpecdecError("stop here")

    monkeypatch.setattr({"summarize": summarize, "transcribe": transcribe}[name], "load_pair", stop)
    monkeypatch.setattr(transcribe, "check_inputs", lambda files: [None] * len(files))
    args = [name, "-", "--gamma", "7", "--top-k", "3", flag, "--draft-stop", "0.5", "--language", "DE"] if name == "transcribe" \
        else [name, "-", "--gamma", "7", "--top-k", "3", flag, "--draft-stop", "0.5", "--truncate"]
    r = CliRunner().invoke(app, args, input="some text")
    assert r.exit_code == 2 and "stop here" in r.stderr, r.output
    want = cls(gamma=7, top_k=3, draft_quantized=False, draft_stop=0.5,
               **({"language": "de"} if name == "transcribe" else {"truncate": True}))
    assert seen == [want]


@pytest.mark.parametrize("task, cls", [("summarize", options.SummarizeOptions), ("transcribe", options.TranscribeOptions)])
def test_bench_measures_the_cli_defaults(task, cls):
    """`specdec bench --task T` with no task options runs what `specdec T` runs (mode and γ are the grid's)."""
    cfg = config.TaskConfig(task=task, gammas=[3], modes=["exact"])  # the bench command's own defaults
    got = runners.task_options(cfg)
    want = cls().replace(device=cfg.device)  # the CLI resolves --device auto before either runs
    if hasattr(want, "truncate"):
        want = want.replace(truncate=True)  # on purpose: a long article is cut, not fatal (task_options)
    assert got == want
    given = config.TaskConfig(task=task, gammas=[3], modes=["exact"], options={"draft_stop": 0.25, "draft_vocab": 0})
    assert (runners.task_options(given).draft_stop, runners.task_options(given).draft_vocab) == (0.25, 0)


def test_generate_defaults_are_the_options_defaults():
    d = options.DecodeOptions()
    params = inspect.signature(generate).parameters
    for name, field in [("mode", "mode"), ("gamma", "gamma"), ("gamma_schedule", "gamma_schedule"), ("alpha", "alpha"),
                        ("beta", "beta"), ("backend", "backend"), ("max_new_tokens", "max_new_tokens"),
                        ("draft_stop_below", "draft_stop")]:
        assert params[name].default == getattr(d, field), name
    from specdec_cli.decoding import SamplingParams

    assert SamplingParams() == SamplingParams(d.temperature, d.top_k, d.top_p, d.seed)


@pytest.mark.parametrize("change, flag", [
    (dict(mode="turbo"), "--mode"), (dict(gamma=0), "--gamma"), (dict(gamma=options.MAX_GAMMA + 1), "--gamma"),
    (dict(gamma_schedule="cosine"), "--gamma-schedule"), (dict(temperature=-1.0), "--temperature"),
    (dict(temperature=math.nan), "--temperature"), (dict(top_k=-1), "--top-k"), (dict(top_p=0.0), "--top-p"),
    (dict(top_p=1.5), "--top-p"), (dict(seed=2**64), "--seed"), (dict(max_new_tokens=0), "--max-new-tokens"),
    (dict(batch_size=0), "--batch-size"), (dict(dtype="int8"), "--dtype"), (dict(backend="cuda"), "--backend"),
    (dict(alpha=5.0, beta=5.0), "--alpha"), (dict(alpha=math.nan), "--alpha"), (dict(draft_vocab=-1), "--draft-vocab"),
    (dict(draft_stop=1.0), "--draft-stop"), (dict(target=" "), "--target"), (dict(threads="0"), "--threads"),
    (dict(threads="two"), "--threads"), (dict(threads="1.5"), "--threads"),
])  # fmt: skip
def test_each_rule_refuses_in_one_line_naming_the_option(change, flag):
    with pytest.raises(SpecdecError) as e:
        options.SummarizeOptions(**change).validate()
    assert str(e.value).startswith(flag) and "\n" not in str(e.value)


def test_defaults_are_valid_and_aliases_resolve():
    for cls in (options.DecodeOptions, options.SummarizeOptions, options.TranscribeOptions):
        assert cls().validate() == cls()
    assert options.dtype_name("BF16") == "bfloat16" and options.dtype_name("fp32") == "float32"
    with pytest.raises(SpecdecError, match="--task"):
        options.TranscribeOptions(task="summarize").validate()


def test_help_lists_the_examples_one_per_line():
    from typer.testing import CliRunner

    for name in ("summarize", "transcribe", "bench", "verify-kernel"):
        r = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert r.exit_code == 0
        examples = [line.strip() for line in r.output.splitlines() if line.strip().startswith("specdec ")]
        assert len(examples) >= 3, r.output
        assert all(len(line) <= 80 for line in r.output.splitlines()), "an example wraps on an 80-column terminal"


def test_the_bench_default_modes_are_the_cli_default():
    params = inspect.signature(command("bench")).parameters
    assert params["modes"].default == ",".join(config.DEFAULT_SYNTHETIC_MODES)


def test_a_note_prints_its_text_as_given(capsys):
    """render.note is plain text: an install hint's "[ray]" stays (rich would take it for a style and drop it)."""
    from specdec_cli import render

    render.note("pip install 'specdec-cli[ray]' [bold]x[/]")
    assert "pip install 'specdec-cli[ray]' [bold]x[/]" in capsys.readouterr().err
