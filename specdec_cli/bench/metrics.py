"""Quality metrics for the two tasks: ROUGE for summaries, WER for transcripts.

ROUGE is rouge-score's (Porter stemming on, F1 reported); WER is jiwer's, computed on text that both
sides went through `normalize_text` first, so that Whisper's casing and punctuation are not errors.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")


# --------------------------------------------------------------------------------------------- ROUGE


@lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer  # imported lazily: optional dependency of the CLI

    return rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F1 of one prediction against one reference.

    Tokenisation is rouge-score's (lower-case, non-alphanumerics split words) with Porter stemming, so
    "runs" and "running" match. Returns {"rouge1": f, "rouge2": f, "rougeL": f}, each in [0, 1];
    an empty prediction or reference scores 0.
    """
    scores = _scorer().score(reference, prediction)  # rouge-score takes (target, prediction)
    return {k: float(scores[k].fmeasure) for k in ROUGE_KEYS}


def corpus_rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean of the per-document F1 scores (how ROUGE is reported for CNN/DM and XSum)."""
    predictions, references = list(predictions), list(references)
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("corpus_rouge needs at least one prediction/reference pair")
    totals = dict.fromkeys(ROUGE_KEYS, 0.0)
    for pred, ref in zip(predictions, references):
        for k, v in rouge(pred, ref).items():
            totals[k] += v
    return {k: v / len(predictions) for k, v in totals.items()}


# ----------------------------------------------------------------------------------------------- WER

_APOSTROPHES = "'\u2019\u2018\u02bc`"  # ASCII, right/left single quote, modifier letter apostrophe
_ANNOTATION = re.compile(r"\[[^\]]*\]|<[^>]*>")  # [MUSIC], [inaudible], <|endoftext|>, <unk>
_INWORD_APOSTROPHE = re.compile(r"(?<=\w)[" + _APOSTROPHES + r"](?=\w)")
_DIGIT_SEP = re.compile(r"(?<=\d)([.,])(?=\d)")  # 3.5 and 1,000 keep their separator


def normalize_text(text: str) -> str:
    """Normalise a transcript for WER, the same way for hypothesis and reference.

    Rules, in order:
      - Unicode NFKC, then lower-case;
      - bracketed annotations and special tokens ("[MUSIC]", "<|endoftext|>", "<unk>") are removed;
      - an apostrophe inside a word is dropped ("don't" -> "dont", "o'clock" -> "oclock"), so the
        word stays one word whichever apostrophe character was used;
      - "." or "," between two digits is kept ("3.5", "1,000"): numbers are left as they are, in
        particular digits are not spelled out and spelled-out numbers are not turned into digits;
      - every other punctuation or symbol character (Unicode categories P* and S*) becomes a space;
      - whitespace runs collapse to one space; leading/trailing space is stripped.
    """
    text = unicodedata.normalize("NFKC", text).lower()
    text = _ANNOTATION.sub(" ", text)
    text = _INWORD_APOSTROPHE.sub("", text)
    text = _DIGIT_SEP.sub(lambda m: "\0" if m.group(1) == "." else "\1", text)  # protect separators
    text = "".join(" " if unicodedata.category(ch)[0] in "PS" else ch for ch in text)
    text = text.replace("\0", ".").replace("\1", ",")
    return " ".join(text.split())


def wer(hypotheses: str | Sequence[str], references: str | Sequence[str]) -> float:
    """Corpus word error rate: (substitutions + deletions + insertions) / reference words.

    Both sides are normalised with `normalize_text` first. Accepts one string each or two equal-length
    lists (errors and reference words are summed over the corpus, not averaged per utterance).
    An empty reference contributes its hypothesis words as insertions; if every reference is empty
    the WER is undefined and ValueError is raised.
    """
    import jiwer  # imported lazily: optional dependency of the CLI

    if isinstance(hypotheses, str):
        hypotheses = [hypotheses]
    if isinstance(references, str):
        references = [references]
    hyps = [normalize_text(h) for h in hypotheses]
    refs = [normalize_text(r) for r in references]
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    n_ref_words = sum(len(r.split()) for r in refs)
    if n_ref_words == 0:
        raise ValueError("WER is undefined: every reference is empty after normalisation")

    # jiwer handles an empty hypothesis, and an empty reference next to non-empty ones; pairs where
    # both are empty contribute nothing, so they are dropped (jiwer would reject them).
    pairs = [(h, r) for h, r in zip(hyps, refs) if h or r]
    out = jiwer.process_words([r for _, r in pairs], [h for h, _ in pairs])
    errors = out.substitutions + out.deletions + out.insertions
    return errors / n_ref_words


# --------------------------------------------------------------------------------------------- chi-square


def chi_square_p(observed, expected) -> float:
    """Pearson's chi-square test of observed counts against expected ones (rescaled to the same total): the
    p-value, from the chi-square survival function Q(k/2, x/2) with k = cells − 1 (torch's regularized upper
    incomplete gamma; no scipy, which a GPU machine may lack)."""
    import torch

    obs = torch.as_tensor(observed, dtype=torch.float64)
    exp = torch.as_tensor(expected, dtype=torch.float64)
    exp = exp * (obs.sum() / exp.sum())
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = torch.tensor(float(len(obs) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))
