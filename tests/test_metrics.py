"""ROUGE and WER on examples small enough to check by hand."""

import pytest

from specdec_cli.bench.metrics import corpus_rouge, normalize_text, rouge, wer

# ---------------------------------------------------------------------------------------------- WER

def test_wer_one_substitution_in_four_words():
    assert wer("the cat sat down", "the cat sat on") == pytest.approx(0.25)


def test_wer_identical_is_zero():
    assert wer("a quick test of the metric", "a quick test of the metric") == 0.0


def test_wer_ignores_case_and_punctuation():
    assert wer("Hello, World! How are you?", "hello world how are you") == 0.0
    assert wer("It\u2019s fine.", "it's fine") == 0.0  # curly and straight apostrophes agree


def test_wer_deletion_and_insertion():
    # reference 5 words; hypothesis drops one word and adds two -> 3 errors / 5
    assert wer("one two four five six seven", "one two three four five") == pytest.approx(3 / 5)


def test_wer_corpus_sums_errors_over_reference_words():
    # 1 error over 4 words + 1 error over 1 word = 2 / 5 (not the per-utterance mean 0.625)
    hyps = ["the cat sat down", "yes"]
    refs = ["the cat sat on", "no"]
    assert wer(hyps, refs) == pytest.approx(2 / 5)


def test_wer_numbers_left_as_they_are():
    assert wer("3.5 kilometres", "3.5 kilometres") == 0.0
    assert wer("five people", "5 people") == pytest.approx(0.5)  # no spelling-out of digits


def test_wer_empty_hypothesis_and_empty_reference():
    assert wer("", "two words") == pytest.approx(1.0)  # two deletions
    assert wer(["x", ""], ["a b", "c"]) == pytest.approx(1.0)  # (1 sub + 1 del + 1 del) / 3
    assert wer(["a b", "extra"], ["a b", ""]) == pytest.approx(0.5)  # 1 insertion / 2 words
    with pytest.raises(ValueError):
        wer(["anything"], ["  ...  "])  # every reference empty after normalisation
    with pytest.raises(ValueError):
        wer(["a", "b"], ["a"])


def test_normalize_text_rules():
    assert normalize_text("  Hello,   WORLD!! ") == "hello world"
    assert normalize_text("Don't stop [MUSIC] <|endoftext|>") == "dont stop"
    assert normalize_text("1,000 people paid $3.50 (each).") == "1,000 people paid 3.50 each"
    assert normalize_text("well-known end.") == "well known end"
    assert normalize_text("Café au lait") == "café au lait"


# -------------------------------------------------------------------------------------------- ROUGE

def test_rouge_identical_is_one():
    s = rouge("the council approved the plan", "the council approved the plan")
    assert s == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}


def test_rouge_disjoint_is_zero():
    s = rouge("alpha beta gamma", "delta epsilon zeta")
    assert s == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}


def test_rouge_hand_computed_unigram_overlap():
    # prediction "red fox" (2 words), reference "red dog sat down" (4 words): 1 shared unigram
    # P = 1/2, R = 1/4, F1 = 2PR/(P+R) = 1/3
    s = rouge("red fox", "red dog sat down")
    assert s["rouge1"] == pytest.approx(1 / 3)
    assert s["rouge2"] == 0.0


def test_rouge_bigrams_lcs_and_stemming():
    # "runs" and "running" both stem to "run": unigrams red, fox, run shared (3/4);
    # bigrams (red fox), (fox run) shared of 3 each -> 2/3; LCS red fox run = 3 of 4 -> 3/4
    s = rouge("red fox runs fast", "Red fox running slowly")
    assert s["rouge1"] == pytest.approx(3 / 4)
    assert s["rouge2"] == pytest.approx(2 / 3)
    assert s["rougeL"] == pytest.approx(3 / 4)


def test_rouge_empty_prediction_is_zero():
    assert rouge("", "some reference")["rouge1"] == 0.0


def test_corpus_rouge_is_mean():
    preds = ["red fox", "alpha beta"]
    refs = ["red dog sat down", "alpha beta"]
    s = corpus_rouge(preds, refs)
    assert s["rouge1"] == pytest.approx((1 / 3 + 1.0) / 2)
    with pytest.raises(ValueError):
        corpus_rouge(["a"], [])


def test_chi_square_p_is_scipys():
    """The kernels' distribution tests use metrics.chi_square_p (no scipy on a GPU machine): scipy agrees."""
    from scipy.stats import chisquare

    from specdec_cli.bench.metrics import chi_square_p

    for obs, exp in [([10, 20, 30], [20, 20, 20]), ([5, 7, 9, 11, 13], [9, 9, 9, 9, 9]), ([1000, 990], [995, 995]),
                     ([3, 0, 50], [10.0, 10.0, 33.0])]:
        want = chisquare(obs, [e * sum(obs) / sum(exp) for e in exp]).pvalue
        assert chi_square_p(obs, exp) == pytest.approx(want, rel=1e-9, abs=1e-300)
