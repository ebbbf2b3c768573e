"""`specdec summarize` through the CLI, on a tiny random model saved locally (the path users take with
their own models): greedy speculative output equals the target alone, JSON fields, one-line errors."""

import dataclasses
import json

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from conftest import GREEDY, WORDS, tiny_config, word_tokenizer
from specdec_cli.cli import app
from specdec_cli.decoding import Proposal, SamplingParams
from specdec_cli.drafts.lookup import Lookup

runner = CliRunner()
ARTICLE = " ".join(f"w{(i * 37) % 900 + 2}" for i in range(60))


@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir):
    return tiny_llama_dir


@pytest.fixture(scope="module")
def article(tmp_path_factory):
    p = tmp_path_factory.mktemp("articles") / "a.txt"
    p.write_text(ARTICLE)
    return p


def summarize(*args):
    return runner.invoke(app, ["summarize", *map(str, args)])


def common(model_dir):
    return ["--target", model_dir, "--draft", "self:2", "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "20"]


def test_greedy_exact_and_baseline_equal_autoregressive(model_dir, article):
    texts = {}
    for mode in ("autoregressive", "baseline", "exact"):
        r = summarize(article, *common(model_dir), "--mode", mode, "--json")
        assert r.exit_code == 0, r.output
        obj = json.loads(r.stdout)
        texts[mode] = obj["text"]
        assert obj["mode"] == mode and obj["device"] == "cpu" and obj["input"] == str(article)
        for key in ("new_tokens", "target_calls", "draft_tokens", "accepted_tokens", "acceptance_rate",
                    "mean_accepted_per_call", "wall_s", "tokens_per_s", "verify_ms_per_call"):
            assert key in obj["stats"]
        assert 0 < obj["stats"]["new_tokens"] <= 20
    assert texts["exact"] == texts["autoregressive"] == texts["baseline"]
    assert texts["exact"], "the random model should say something"


def test_sampling_modes_run_and_report_acceptance(model_dir, article):
    for mode in ("exact", "sigmoid"):
        r = summarize(article, *common(model_dir), "--mode", mode, "--temperature", "1", "--top-p", "0.9", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["stats"]["acceptance_rate"] is not None


def summary_of(model_dir, article, *options, new_tokens=20):
    """The text `specdec summarize` prints for `article` in exact mode with a constant γ (auto's γ follows measured
    times, so sampled tokens would vary run to run: constant makes them a function of --seed)."""
    args = common(model_dir)
    args[args.index("--max-new-tokens") + 1] = new_tokens
    r = summarize(article, *args, "--mode", "exact", "--gamma-schedule", "constant", "--json", *options)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["text"]


SAMPLING = ("--temperature", "0.8", "--top-k", "50", "--top-p", "0.9")


def test_sampling_options_reach_the_decoder(model_dir, article):
    """--temperature, --top-k, --top-p, --seed from the command line to the decoder: the same seed gives the same
    summary, another seed another, and both differ from greedy (20 sampled tokens each: equal only if every one
    coincides). Each option's value is seen too, as a limit that makes sampling greedy again: --top-k 1, a --top-p
    of 1e-6 (only the most likely token is left) and --temperature 1e-3 (z/T: the most likely token takes all the
    mass unless two logits tie within ~0.01) each give the greedy summary where T = 1, seed 1 alone does not."""
    greedy = summary_of(model_dir, article)
    one = summary_of(model_dir, article, *SAMPLING, "--seed", "1")
    assert one == summary_of(model_dir, article, *SAMPLING, "--seed", "1"), "the same seed, the same summary"
    assert one != summary_of(model_dir, article, *SAMPLING, "--seed", "2"), "another seed, another summary"
    assert greedy not in (one, summary_of(model_dir, article, "--temperature", "1", "--seed", "1"))
    for limit in (("--top-k", "1"), ("--top-p", "0.000001")):
        assert summary_of(model_dir, article, "--temperature", "1", "--seed", "1", *limit) == greedy, limit
    assert summary_of(model_dir, article, "--temperature", "0.001", "--seed", "1") == greedy


PROCESSED = SamplingParams(temperature=0.7, top_k=20, top_p=0.8)  # each binds: see the test below


@pytest.mark.slow
def test_first_sampled_token_follows_the_processed_target_distribution(model_dir, article):
    """N = 2 000 copies of the article summarized in one batch from the command line (--temperature 0.7 --top-k 20
    --top-p 0.8, 2 new tokens, γ = 1: the first token is a verified draft token or a resampled one): its
    frequencies against the target's distribution at the prompt processed as PROCESSED says (T, then the 20 most
    likely, then the nucleus of 0.8 of those: 9 tokens), chi-square p > 1e-3, and no token outside it.
    With any option lost on its way, what the CLI would sample instead (T = 1; no top-k; no top-p; greedy) puts
    mass m outside those 9 tokens or moves their frequencies: the test passes it with chance at most
    min((1 − m)^N, the noncentral chi-square's), computed here for each and asserted < 1 %."""
    from scipy.stats import chi2, ncx2

    from specdec_cli.bench.metrics import chi_square_p
    from specdec_cli.decoding.sampling import probs_from_logits, process_logits
    from specdec_cli.models import load_causal_lm
    from specdec_cli.tasks.summarize import encode, read_article

    n = 2000
    args = common(model_dir)
    args[args.index("--max-new-tokens") + 1] = 2
    r = summarize(*[article] * n, *args, "--mode", "exact", "--gamma-schedule", "constant", "--gamma", "1",
                  "--temperature", "0.7", "--top-k", "20", "--top-p", "0.8", "--seed", "3", "--batch-size", n, "--json")
    assert r.exit_code == 0, r.output
    objects = [json.loads(line) for line in r.stdout.splitlines()]
    hist = [sum(o["stats"]["accepted_histogram"][k] for o in objects) for k in (0, 1)]  # each article's own
    assert len(objects) == n and hist[1] > 0 and hist[0] > 0  # drafts accepted, and not all
    word = {w: i for i, w in enumerate(WORDS)}
    first = torch.tensor([word[o["text"].split()[0]] for o in objects])  # tokens 0, 1 (unk, eos): outside

    target = load_causal_lm(str(model_dir), dtype=torch.float32, device="cpu", progress=False)
    ids = encode(target.tokenizer, target.model, [read_article(str(article))], 2, False)[0]
    with torch.inference_mode():
        z = target.model(torch.tensor([ids])).logits[0, -1].double()  # [V]

    def sampled_by(params):
        return probs_from_logits(process_logits(z, params)).double() if not params.greedy else \
            torch.nn.functional.one_hot(z.argmax(), len(z)).double()

    p = sampled_by(PROCESSED)
    support = p > 0
    assert int(support.sum()) == 9 and not support[:2].any()
    counts = torch.bincount(first, minlength=len(p)).double()
    assert counts[~support].sum() == 0, f"tokens outside the processed distribution: {counts[~support].nonzero()}"
    assert chi_square_p(counts[support], p[support] * n) > 1e-3
    crit, df = chi2.isf(1e-3, int(support.sum()) - 1), int(support.sum()) - 1
    for lost in (dict(temperature=1.0), dict(top_k=0), dict(top_p=1.0), dict(temperature=0.0)):
        alt = sampled_by(dataclasses.replace(PROCESSED, **lost))
        outside = float(alt[~support].sum())
        inside = alt[support] / alt[support].sum()
        lam = float(n * ((inside - p[support]) ** 2 / p[support]).sum())
        assert min((1 - outside) ** n, ncx2.cdf(crit, df, lam)) < 0.01, (lost, outside, lam)


def test_batch_of_articles_and_stdin(model_dir, article, tmp_path):
    other = tmp_path / "b.txt"
    other.write_text(" ".join(ARTICLE.split()[:20]))
    one = [json.loads(line)["text"] for line in summarize(article, other, *common(model_dir), "--json").stdout.splitlines()]
    batched = summarize(article, other, *common(model_dir), "--json", "--batch-size", "2")
    assert batched.exit_code == 0, batched.output
    assert [json.loads(line)["text"] for line in batched.stdout.splitlines()] == one
    piped = runner.invoke(app, ["summarize", "-", *map(str, common(model_dir)), "--json"], input=ARTICLE)
    assert piped.exit_code == 0 and json.loads(piped.stdout)["text"] == one[0]


def test_too_long_is_refused_unless_truncated(model_dir, tmp_path):
    long = tmp_path / "long.txt"
    long.write_text(" ".join(["w5"] * 400))  # the tiny model's context is 256
    r = summarize(long, *common(model_dir))
    assert r.exit_code == 2 and "context" in r.output and "--truncate" in r.output
    assert summarize(long, *common(model_dir), "--truncate").exit_code == 0


def bad_inputs(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n\t ")
    (tmp_path / "binary.txt").write_bytes(b"\x89PNG\x00\x01\x02")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    return {
        "missing": (tmp_path / "nope.txt", "no such file"),
        "directory": (tmp_path, "directory"),
        "empty": (tmp_path / "empty.txt", "empty"),
        "binary": (tmp_path / "binary.txt", "binary"),
        "not utf-8": (tmp_path / "latin1.txt", "UTF-8"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "binary", "not utf-8"])
def test_bad_input_is_one_line_exit_2(case, tmp_path, model_dir):
    path, words = bad_inputs(tmp_path)[case]
    r = summarize(path, *common(model_dir))
    assert r.exit_code == 2
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], r.output


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("--gamma", "0", "--gamma"),
        ("--temperature", "-1", "temperature"),
        ("--top-p", "0", "top-p"),
        ("--top-p", "1.5", "top-p"),
        ("--top-k", "-2", "top-k"),
        ("--max-new-tokens", "0", "--max-new-tokens"),
        ("--draft-stop", "1", "--draft-stop"),
        ("--mode", "turbo", "--mode"),
        ("--draft", "self:9", "self:9"),
        ("--target", "/no/such/model", "no such file"),
        ("--target", "nobody/unknown-model-xyz", "unknown-model-xyz"),
    ],
)
def test_bad_options_are_one_line_exit_2(option, value, words, model_dir, article):
    args = common(model_dir)
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    r = summarize(article, *args)
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("args, words", [
    (["--draft", "lookup:0"], "lookup:N"),
    (["--draft", "lookup+lookup"], "one draft"),
    (["--draft", "lookup", "--mode", "sigmoid"], "sigmoid"),
])
def test_bad_lookup_drafts_are_one_line_exit_2(args, words, model_dir, article):
    common_args = common(model_dir)
    common_args[common_args.index("--draft") : common_args.index("--draft") + 2] = []
    r = summarize(article, *common_args, *args)
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("draft", ["lookup", "lookup:2-2", "lookup+self:2"])
def test_greedy_lookup_equals_autoregressive_from_the_cli(draft, model_dir, article, tmp_path):
    repeating = tmp_path / "repeating.txt"
    repeating.write_text(" ".join([ARTICLE] * 2))  # the article twice: lookup has something to find
    texts = {}
    for mode, d in (("autoregressive", "self:2"), ("exact", draft)):
        args = common(model_dir)
        args[args.index("--draft") + 1] = d
        r = summarize(repeating, *args, "--mode", mode, "--max-new-tokens", "30", "--json")
        assert r.exit_code == 0, r.output
        texts[mode] = json.loads(r.stdout)
    assert texts["exact"]["text"] == texts["autoregressive"]["text"]
    if draft != "lookup:2-2":  # a random model's words rarely repeat a 2-gram of the article
        assert texts["exact"]["stats"]["draft_tokens"] > 0


def test_draft_with_another_vocabulary_is_refused(model_dir, article, tmp_path):
    other = tmp_path / "other"
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(tiny_config("qwen2", layers=2), dtype=torch.float32).save_pretrained(other)
    word_tokenizer(["<unk>", "<eos>"] + [f"v{i}" for i in range(998)]).save_pretrained(other)
    r = summarize(article, *common(model_dir)[:2], "--draft", other, "--dtype", "float32")
    assert r.exit_code == 2 and ("vocabular" in r.output.lower() or "token" in r.output), r.output


def test_stats_table_names_each_input_by_its_file_name(model_dir, tmp_path):
    """On an 80-column terminal, long paths are not cut to 'exampl…': the table shows file names in full, and
    every figure in full (a name too long for the line folds onto a second one)."""
    deep = tmp_path / "a" / "rather" / "deep" / "folder" / "of" / "articles"
    deep.mkdir(parents=True)
    names = ["earnings_report_final.txt", "second_article.txt"]
    for name in names:
        (deep / name).write_text(ARTICLE)
    r = runner.invoke(app, ["summarize", *(str(deep / n) for n in names), *map(str, common(model_dir))],
                      terminal_width=80)
    assert r.exit_code == 0, r.output
    table = [line for line in r.stderr.splitlines() if line.startswith(tuple(names))]
    assert [line.split()[0] for line in table] == names, r.stderr
    assert "…" not in r.stderr, r.stderr


# ----------------------------------------------------------------------------------------------------
# bf16: a pass's rows are a step's bits (decoding/exact_rows.py), so greedy speculative = autoregressive


def _steps_and_pass(model, prompt, k, tokens=None):
    """Logits [k, V] of k one-token steps after `prompt` [1, T], and of one pass over the same k tokens: the
    prompt's last, then `tokens` [1, ≥ k−1] (default: random)."""
    from specdec_cli.decoding.adapters import Decoder

    T = prompt.shape[1]
    if tokens is None:
        tokens = torch.randint(0, 30000, (1, k), generator=torch.Generator().manual_seed(k))  # [1, k]
    seq = torch.cat([prompt[:, -1:], tokens], 1)  # [1, ≥ k]: the pending token, then the others
    pos = torch.arange(T - 1, T + k)[None]  # [1, k+1]
    out = []
    with torch.inference_mode():
        for one_by_one in (True, False):
            d = Decoder(model)
            d.prefill(prompt[:, :-1], None, torch.arange(T - 1)[None])
            if one_by_one:
                out.append(torch.cat([d.forward(seq[:, i : i + 1], None, pos[:, i : i + 1]) for i in range(k)], 1)[0])
            else:
                out.append(d.forward(seq[:, :k], None, pos[:, :k])[0])
    return out


@pytest.mark.slow
def test_exact_rows_give_a_pass_the_bits_of_steps(smollm2):
    """The premise: in bf16 a CPU rounds a pass's rows otherwise than steps (so a near tie of the top two logits
    can flip between them); exact_rows makes every row bit for bit a step's, at every pass length."""
    from specdec_cli.decoding.exact_rows import exact_rows, needs_rows

    prompt = torch.tensor([smollm2.tokenizer("Bumblebees raise more queens near wildflower strips, a study")["input_ids"]])
    steps, passed = _steps_and_pass(smollm2.model, prompt, 5)
    if needs_rows(smollm2.model.lm_head.weight):
        assert not torch.equal(steps, passed), "bf16 on a CPU: expected the plain pass to round otherwise"
    rows = exact_rows(smollm2.model)
    for k in (2, 5, 9, 33):
        steps, passed = _steps_and_pass(rows, prompt, k)
        bad = [i for i in range(k) if not torch.equal(steps[i], passed[i])]
        assert not bad, f"k={k}: rows {bad} of the pass differ from their steps"


class _Oracle(Lookup):
    """A deterministic draft that knows the output: each round proposes the next γ tokens of `tokens` (the
    continuation of a prompt of T tokens), so greedy verification scores them, and the rows after them, in one
    pass."""

    def __init__(self, T, tokens):
        super().__init__()
        self.T, self.tokens = T, list(tokens)

    def propose(self, slots, gamma, settings):
        done = slots.length - self.T  # tokens emitted so far (the last is the pending slot)
        out = torch.tensor([self.tokens[done : done + gamma]], dtype=torch.int64).reshape(1, -1)  # [1, ≤ γ]
        return Proposal(out, None)


@pytest.mark.slow
def test_exact_rows_keep_greedy_speculative_autoregressive_at_a_built_tie(smollm2):
    """A tie of the top two logits, built (token c's lm_head row set next to the argmax a's) where a plain bf16
    pass breaks it otherwise than the steps: with exact_rows the pass picks what the steps pick, and greedy
    speculative output is the autoregressive output token for token."""
    import math

    from torch import nn
    from torch.nn.functional import linear

    from specdec_cli import internals
    from specdec_cli.decoding import Decoder, generate
    from specdec_cli.decoding.exact_rows import exact_rows, needs_rows

    model = smollm2.model
    if not needs_rows(model.lm_head.weight):
        pytest.skip("steps and passes round alike here (not bf16/fp16 on a CPU): no tie to build")
    k = 5  # rows of a pass: the pending token and γ = k−1 draft tokens
    prompt = torch.tensor([smollm2.tokenizer("Bumblebees raise more queens near wildflower strips, a study")["input_ids"]])
    T = prompt.shape[1]
    # the fixture's model untouched: a shallow copy with an lm_head of its own (SmolLM2 ties lm_head to embed_tokens)
    tied = internals.shallow_copy(model)
    tied.lm_head = head = nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False, device="meta")
    head.weight = W = nn.Parameter(model.lm_head.weight.detach().clone(), requires_grad=False)

    def decode(target, draft, n, **kw):  # a plain model as it is: generate() would run a bare model as exact_rows
        mode = "autoregressive" if draft is None else "exact"
        return generate(Decoder(target), draft, prompt, mode=mode, params=GREEDY, max_new_tokens=n, **kw)

    y = decode(tied, None, k - 1).tokens[0]  # the plain model's greedy tokens: rows 1..k−1 follow them
    seen = []
    hook = head.register_forward_hook(lambda module, inputs, out: seen.append(inputs[0]))
    try:
        steps, passed = _steps_and_pass(tied, prompt, k, torch.tensor([y]))
    finally:
        hook.remove()
    assert len(seen) == k + 3  # prefill, k steps, prefill, the pass: what lm_head read, [1, 1 or k, d]
    h_steps, h_pass = seen[1 : k + 1], seen[-1]
    assert steps.argmax(-1).tolist()[: k - 1] == y

    def tops(r):  # with lm_head W as it is now: argmax of the steps' rows 0..r and of the pass's
        return ([linear(h_steps[i], W)[0, -1].argmax().item() for i in range(r + 1)],
                linear(h_pass, W)[0, : r + 1].argmax(-1).tolist())

    # build the tie: W[c] = W[a] + δ·e_j, the logit gap δ·h_j a multiple of an eighth of the bf16 spacing at a's
    # logit, up to two spacings either way; the first (row r ≥ 1, j, δ) where the step and the pass pick otherwise
    tie = None
    with torch.inference_mode():
        for r in range(1, k):
            a, c = steps[r].topk(2).indices.tolist()
            spacing = 2.0 ** (math.floor(math.log2(abs(steps[r, a].item()))) - 7)
            h = h_steps[r][0, -1].float()
            for j in h.abs().argsort(descending=True)[:8].tolist():
                for m in (*range(1, 17), *range(-1, -17, -1)):
                    W[c] = W[a]
                    W[c, j] += m * spacing / 8 / h[j].item()
                    step_top, pass_top = tops(r)
                    if step_top[r] != pass_top[r] and step_top[:r] == pass_top[:r] == y[:r]:
                        tie = r, a, c, j, W[c, j].item() - W[a, j].item(), spacing, step_top[r], pass_top[r]
                        break
                if tie:
                    break
            if tie:
                break  # W keeps the tie
            W[c] = model.lm_head.weight[c]
    assert tie, "bf16 on a CPU: expected some W[c] = W[a] + δ·e_j whose tie a plain pass breaks otherwise than steps"
    r, a, c, j, delta, spacing, step_pick, pass_pick = tie
    where = f"row {r}: W[{c}] = W[{a}] + {delta:.3g}·e_{j}, a step picks {step_pick}, the pass {pass_pick}"

    # the premise, end to end: greedy speculative decoding with the plain model leaves the autoregressive output
    # at the tie (the draft proposes y, so the first round's pass is the one above)
    ar = decode(tied, None, k).tokens[0]
    spec = decode(tied, _Oracle(T, y), k, gamma=k - 1, gamma_schedule="constant").tokens[0]
    assert ar[:r] == spec[:r] == y[:r] and (ar[r], spec[r]) == (step_pick, pass_pick), f"{where}: {ar} {spec}"

    # the claim: with exact_rows the pass picks what the steps pick at every row (bit for bit), and speculative
    # output is autoregressive, the tied row scored inside the one pass of a draft that is always right
    rows = exact_rows(tied)
    steps, passed = _steps_and_pass(rows, prompt, k, torch.tensor([y]))
    assert steps.argmax(-1).tolist() == passed.argmax(-1).tolist(), where
    assert torch.equal(steps, passed), where
    top2 = steps[r].float().topk(2)
    assert sorted(top2.indices.tolist()) == sorted([a, c]) and top2.values.diff().abs().item() <= 2 * spacing, \
        f"{where}: the tie should hold with exact_rows too, its top two {top2}"
    ar = decode(rows, None, k)
    assert ar.tokens[0][:r] == y[:r], "exact_rows should reach the tied row on the plain model's path"
    spec = decode(rows, _Oracle(T, ar.tokens[0]), k, gamma=k - 1, gamma_schedule="constant")
    assert spec.tokens == ar.tokens, where
    assert (spec.stats.target_calls, spec.stats.accepted_tokens) == (1, k - 1)  # one pass scored every row


@pytest.fixture(scope="module")
def smollm2_articles(smollm2):
    """The seven example articles and SmolLM2's greedy autoregressive summaries of them (bf16, 32 tokens)."""
    from specdec_cli.bench.runners import data_files
    from specdec_cli.tasks import summarize as task

    articles = [task.read_article(p) for p in data_files("summarize", None)]
    opts = task.SummarizeOptions(target="embedded:smollm2", max_new_tokens=32, dtype="bfloat16")
    return articles, opts, [s.text for s in task.summarize(smollm2, None, articles, opts, mode="autoregressive")]


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["lookup", "lookup+self:24"])  # self:24 drafts wherever lookup finds nothing
def test_bf16_greedy_equals_autoregressive_on_every_example_article(smollm2, smollm2_articles, draft):
    from specdec_cli.tasks import summarize as task

    articles, opts, want = smollm2_articles
    assert len(articles) == 7
    # constant γ: every round drafts (auto may find a 24-layer draft too slow to pay and take plain steps throughout)
    got = task.summarize(smollm2, task.load_draft(draft, smollm2, progress=False), articles,
                         opts.replace(draft=draft, gamma_schedule="constant"))
    assert [s.text for s in got] == want
    assert sum(s.stats.accepted_tokens for s in got) > 0


def test_bench_takes_lookup_as_a_draft(model_dir, tmp_path):
    """`specdec bench --task summarize --draft lookup`: autoregressive and lookup side by side, the same text."""
    from specdec_cli.bench import config, contenders, runners

    article = tmp_path / "a.txt"
    article.write_text(" ".join([ARTICLE] * 2))
    cfg = config.TaskConfig(task="summarize", gammas=[3], modes=["exact"], dtype="float32", schedules=["auto"], options={
        "target": str(model_dir), "draft": "lookup", "inputs": [str(article)], "references": ["w2 w3"],
        "max_new_tokens": 12})
    records = contenders.aggregate(runners.run_task(cfg))
    assert [(r.mode, r.schedule) for r in records] == [("autoregressive", None), ("exact", "auto")]
    assert records[1].new_tokens == records[0].new_tokens and records[1].acceptance_rate is not None
