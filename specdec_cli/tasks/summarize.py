"""Summarization: articles in, summaries out, through the speculative decoding loop.

Instruct models (a tokenizer with a chat template) get the template with a summarization instruction;
base models get the paper's prompt  "Article: …\\n\\nSummary:".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_cli import drafts
from specdec_cli.decoding import GenerationStats, SamplingParams, generate, make_schedule
from specdec_cli.drafts.int8 import quantize_draft
from specdec_cli.drafts.layers import self_draft_from_spec
from specdec_cli.drafts.lookup import drafter
from specdec_cli.drafts.lookup import parts as lookup_parts
from specdec_cli.drafts.subset_head import frequent_ids, restrict_head
from specdec_cli.errors import SpecdecError, warn
from specdec_cli.models import LoadedModel, check_compatible
from specdec_cli.models.causal_lm import CAUSAL_LM
from specdec_cli.models.exact_rows import exact_rows
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
    stats: GenerationStats  # the stats of the batch this article ran in


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


def eos_ids(tokenizer, model) -> set[int]:
    ids = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids


def summarize(target: LoadedModel, draft: LoadedModel | None, articles: list[Article],
              options: SummarizeOptions | None = None, *, on_batch=None, on_prefill=None,
              **overrides) -> list[Summary]:
    """Summaries of `articles` in input order. target/draft: LoadedModels from load_pair (draft None for
    autoregressive). options: the SummarizeOptions (default: the CLI's defaults), with `overrides` applied
    (e.g. mode="autoregressive", gamma=6). on_batch(done, total) is called after each batch, on_prefill(done,
    total) while a long prompt is read (progress).

    draft: a model draft, a lookup.Lookup, or a lookup.WithLookup (--draft lookup+DRAFT), as load_pair gives.
    Three things make a model draft cheaper and leave the output exactly the target's: draft_vocab > 0 cuts its
    output layer to the draft_vocab most frequent tokens plus the batch's prompt tokens (drafts/subset_head.py);
    draft_quantized gives it int8 weights on a CPU (drafts/int8.py); draft_stop > 0 ends a round's drafting
    once the draft is less sure than that of its token (decoding.drafter.ModelDrafter).

    The target runs as models.exact_rows makes it in every mode: a pass over a round's tokens gives each the bits
    a one-token step gives, so greedy output is the autoregressive output token for token in bf16 too."""
    opts = (options or SummarizeOptions()).replace(**overrides).validate()
    if opts.speculative and draft is None:
        raise SpecdecError(f"mode {opts.mode!r} needs a draft model")
    lookup, draft = lookup_parts(draft) if opts.speculative else (None, None)  # draft: the model draft, if any
    tok, model = target.tokenizer, target.model
    prompts = encode(tok, model, articles, opts.max_new_tokens, opts.truncate, opts.max_input_tokens)
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos_ids(tok, model)), 0)
    eos = eos_ids(tok, model)
    vocab = None if draft is None else check_compatible(target, draft)  # heads may pad rows past the vocabulary
    params = SamplingParams.of(opts)
    schedule = make_schedule(opts.gamma_schedule, opts.gamma)  # one for the run: what it measured carries over
    out: list[Summary] = []
    for start in range(0, len(articles), opts.batch_size):
        chunk = slice(start, start + opts.batch_size)
        input_ids, attention_mask = left_pad(prompts[chunk], pad)
        if draft is not None and opts.draft_vocab > 0:
            keep = torch.cat([frequent_ids(opts.draft_vocab, draft.output_size), input_ids.flatten(),
                              torch.tensor(sorted(eos))])
            restrict_head(draft.model, keep)
        if draft is not None and opts.draft_quantized:
            quantize_draft(draft)
        result = generate(
            exact_rows(model), drafter(lookup, None if draft is None else draft.model), input_ids.to(target.device),
            attention_mask.to(target.device),
            mode=opts.mode, gamma=opts.gamma, gamma_schedule=schedule, params=params,
            max_new_tokens=opts.max_new_tokens, eos_token_ids=eos, alpha=opts.alpha, beta=opts.beta,
            backend=opts.backend, vocab_size=vocab, draft_stop_below=opts.draft_stop, on_prefill=on_prefill,
        )
        for article, tokens, reason in zip(articles[chunk], result.tokens, result.finish_reasons):
            out.append(Summary(article.name, summary_text(tok, tokens, eos), reason, result.stats))
        if on_batch:
            on_batch(min(start + opts.batch_size, len(articles)), len(articles))
    return out


def summary_text(tokenizer, tokens: list[int], eos: set[int]) -> str:
    """A summary's text from its new tokens (EOS and special tokens dropped)."""
    return tokenizer.decode([t for t in tokens if t not in eos], skip_special_tokens=True).strip()


def load_draft(draft_spec: str, target: LoadedModel, progress: bool = True) -> LoadedModel:
    """The draft for a loaded target: `self:K` shares its first K layers, another model is checked against it."""
    return drafts.load_draft(draft_spec, target, CAUSAL_LM, self_draft=self_draft_from_spec, progress=progress)


def load_pair(opts: SummarizeOptions, progress: bool = True) -> tuple[LoadedModel, LoadedModel | None]:
    """(target, draft) for `opts`; draft is None for autoregressive, `self:K` shares the target's layers,
    another model is checked against the target (models.check_compatible)."""
    return drafts.load_pair(opts, CAUSAL_LM, self_draft=self_draft_from_spec, progress=progress)
