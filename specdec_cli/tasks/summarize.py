"""Summarization: articles in, summaries out, through the speculative decoding loop.

Instruct models (a tokenizer with a chat template) get the template with a summarization instruction;
base models get the paper's prompt  "Article: …\\n\\nSummary:".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec_cli import drafts
from specdec_cli.decoding import (
    Batch,
    Draft,
    GenerationStats,
    SamplingParams,
    Threads,
    generate,
    make_schedule,
    rows_share,
)
from specdec_cli.errors import SpecdecError, warn
from specdec_cli.models import LoadedModel
from specdec_cli.models.causal_lm import CAUSAL_LM, eos_ids
from specdec_cli.options import SummarizeOptions

INSTRUCTION = "Summarize the following news article in two or three sentences. Reply with the summary only."


@dataclass
class Article:
    name: str  # the path as given, or "-" for stdin
    text: str


@dataclass
class Summary:
    input: str
    text: str
    finish_reason: str  # "eos" | "length"
    stats: GenerationStats  # its own share of its batch's (decoding.stats.rows_share); at batch 1 the run's
    weights: dict = field(default_factory=dict)  # how the models' weights were held (weights_of)


def read_article(path: str) -> Article:
    """One article from a UTF-8 text file, or stdin for "-". Refuses what cannot be an article."""
    if path == "-":
        if sys.stdin is None or sys.stdin.closed:
            raise SpecdecError("-: standard input is closed: nothing to summarize")
        try:
            data = sys.stdin.buffer.read()
        except (OSError, ValueError) as e:
            raise SpecdecError(f"-: cannot read standard input ({e})") from None
    else:
        p = Path(path)
        if not p.exists():
            raise SpecdecError(f"{path}: no such file")
        if p.is_dir():
            raise SpecdecError(f"{path}: is a directory, not a text file")
        try:
            data = p.read_bytes()
        except OSError as e:
            raise SpecdecError(f"{path}: cannot read: {e.strerror}") from None
    if b"\x00" in data:
        raise SpecdecError(f"{path}: looks like a binary file, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SpecdecError(f"{path}: is not UTF-8 text") from None
    if not text.strip():
        raise SpecdecError(f"{path}: is empty")
    return Article(path, text.strip())


def build_prompt(tokenizer, article: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": f"{INSTRUCTION}\n\n{article}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"Article: {article}\n\nSummary:"


def context_limit(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def encode(tokenizer, model, articles: list[Article], max_new_tokens: int, truncate: bool,
           max_input_tokens: int | None = None) -> list[list[int]]:
    """Token ids of each prompt. An article too long for the model's context is refused; with `truncate` it is
    cut to fit the input budget, max_input_tokens (and the context), and a warning says how much was cut."""
    limit = context_limit(model)
    room = None if limit is None else limit - max_new_tokens  # prompt tokens the context leaves
    budget = min(b for b in (room, max_input_tokens if truncate else None, 10**12) if b is not None)
    prompts = []
    for a in articles:
        ids = tokenizer(build_prompt(tokenizer, a.text), add_special_tokens=False)["input_ids"]
        if len(ids) > budget:
            if not truncate:
                raise SpecdecError(
                    f"{a.name}: {len(ids)} prompt tokens + {max_new_tokens} new tokens exceed the model's "
                    f"context of {limit}; pass --truncate to cut the article"
                )
            ids = _cut(tokenizer, a, budget, max_new_tokens, full=len(ids))
        prompts.append(ids)
    return prompts


def _cut(tokenizer, article: Article, budget: int, max_new_tokens: int, full: int) -> list[int]:
    """The prompt of `article` cut at its end to at most `budget` tokens; warns how much was cut."""
    overhead = len(tokenizer(build_prompt(tokenizer, ""), add_special_tokens=False)["input_ids"])
    words = tokenizer(article.text, add_special_tokens=False)["input_ids"]
    keep = budget - overhead
    while keep > 0:
        ids = tokenizer(build_prompt(tokenizer, tokenizer.decode(words[:keep])), add_special_tokens=False)["input_ids"]
        if len(ids) <= budget:  # re-tokenizing can merge differently at the cut: shrink until it fits
            warn(f"{article.name}: cut to {len(ids)} of its {full} prompt tokens (--max-input-tokens {budget})")
            return ids
        keep -= max(1, len(ids) - budget)
    raise SpecdecError(f"{article.name}: --max-new-tokens {max_new_tokens} leaves no room for the article")


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [B, T] and attention_mask [B, T], padded on the left."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r) :] = torch.tensor(r)
        mask[i, T - len(r) :] = 1
    return ids, mask


def summarize(target: LoadedModel, draft: Draft | None, articles: list[Article],
              options: SummarizeOptions | None = None, *, on_batch=None, on_prefill=None, schedule=None,
              **overrides) -> list[Summary]:
    """Summaries of `articles` in input order. target/draft: from load_pair (draft None for autoregressive).
    options: the SummarizeOptions (default: the CLI's defaults), with `overrides` applied (e.g.
    mode="autoregressive", gamma=6). on_batch(done, total) is called after each batch, on_prefill(done, total)
    while a long prompt is read (progress). schedule: a γ schedule of an earlier call (decoding.make_schedule for
    these options), to carry what it measured over (one actor of a corpus run); default: a new one.

    The draft is fitted to each batch (Draft.fit): a model draft's output layer then scores the frequent ids
    plus the batch's prompt ids (drafts/causal.py). The target runs as decoding.exact_rows makes it (generate) in every
    mode: a pass over a round's tokens gives each the bits a one-token step gives, so greedy output is the
    autoregressive output token for token in bf16 too."""
    opts = (options or SummarizeOptions()).replace(**overrides).validate()
    if opts.speculative and draft is None:
        raise SpecdecError(f"mode {opts.mode!r} needs a draft model")
    tok, model = target.tokenizer, target.model
    prompts = encode(tok, model, articles, opts.max_new_tokens, opts.truncate, opts.max_input_tokens)
    eos = eos_ids(target)
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos), 0)
    params = SamplingParams.of(opts)
    schedule = schedule or make_schedule(opts.gamma_schedule, opts.gamma)  # one for the run: what it measured carries over
    out: list[Summary] = []
    weights = weights_of(target, draft)
    with Threads(opts.threads) as threads:
        for start in range(0, len(articles), opts.batch_size):
            chunk = slice(start, start + opts.batch_size)
            input_ids, attention_mask = left_pad(prompts[chunk], pad)
            fitted = draft.fit(Batch(input_ids)) if opts.speculative and draft is not None else None
            result = generate(
                model, fitted, input_ids.to(target.device), attention_mask.to(target.device),
                mode=opts.mode, gamma=opts.gamma, gamma_schedule=schedule, params=params,
                max_new_tokens=opts.max_new_tokens, eos_token_ids=eos, alpha=opts.alpha, beta=opts.beta,
                backend=opts.backend, draft_stop_below=opts.draft_stop, on_prefill=on_prefill,
                threads=threads,
            )
            for k, (article, tokens, reason) in enumerate(zip(articles[chunk], result.tokens, result.finish_reasons)):
                out.append(Summary(article.name, summary_text(tok, tokens, eos), reason, rows_share(result, [k]), weights))
            if on_batch:
                on_batch(min(start + opts.batch_size, len(articles)), len(articles))
    return out


def weights_of(target: LoadedModel, draft: Draft | None) -> dict:
    """{"target": gguf | int8 | int4 | none, "draft": the same (a draft model's), "qmatmul": the kernel's path when
    a model runs on blocks} (models/weights.py), for --json."""
    model = drafts.model_draft(draft)
    loaded = getattr(model, "loaded", None)
    out = {"target": target.weights} | ({"draft": loaded.weights} if loaded is not None else {})
    if any(form != "none" for form in out.values()):
        from specdec_cli.kernels import qmatmul

        out["qmatmul"] = qmatmul.backend_line()
    return out


def summary_text(tokenizer, tokens: list[int], eos: set[int]) -> str:
    """A summary's text from its new tokens (EOS and special tokens dropped)."""
    return tokenizer.decode([t for t in tokens if t not in eos], skip_special_tokens=True).strip()


def load_draft(draft_spec: str, target: LoadedModel, options: SummarizeOptions | None = None, *,
               progress: bool = True, **overrides) -> Draft:
    """The draft `draft_spec` names for a loaded target (drafts.build): `self:K` shares its first K layers, another
    model is checked against it. options (default: the CLI's) with `overrides` say its output layer and weights."""
    opts = (options or SummarizeOptions()).replace(**overrides)
    return drafts.build(draft_spec, target, CAUSAL_LM, opts, progress=progress)


def load_pair(opts: SummarizeOptions, progress: bool = True) -> tuple[LoadedModel, Draft | None]:
    """(target, draft) for `opts`; draft is None for autoregressive (drafts.load_pair)."""
    return drafts.load_pair(opts, CAUSAL_LM, progress=progress)
