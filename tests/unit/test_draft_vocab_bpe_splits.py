"""A small draft vocab for a big byte-level BPE target (Qwen3: 151,936 ids, 712 single-token paragraph
breaks): the tokens the exit needs are kept, the breaks the traces never use do not crowd it out."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.common.tokens import token_ids
from pipelines.train_draft.job import exit_vocab
from specexit_core.draft.vocab import build_draft_vocab, draft_vocab_from_counts


def test_unused_preferred_tokens_come_after_every_seen_token():
    counts = np.zeros(100, dtype=np.int64)
    counts[[3, 5, 7, 9]] = [10, 8, 6, 1]  # 9: a paragraph break used once
    d2t, t2d = draft_vocab_from_counts(counts, 6, always=[99], prefer=[9, *range(40, 60)])
    chosen = sorted((d2t + np.arange(6)).tolist())
    assert chosen == sorted([99, 9, 3, 5, 7, 40]) and t2d.sum() == 6  # then an unused break, then others
    d2t, _ = draft_vocab_from_counts(counts, 3, always=[99], prefer=[9])
    assert sorted((d2t + np.arange(3)).tolist()) == [3, 9, 99]  # a used break before more frequent others


def test_more_forced_tokens_than_the_draft_vocab_is_an_error():
    with pytest.raises(ValueError, match="3 tokens must be in the draft vocab"):
        draft_vocab_from_counts(np.ones(10, dtype=np.int64), 2, always=[1, 2, 3])
    with pytest.raises(ValueError, match="must be in the draft vocab"):
        build_draft_vocab([[1, 2]], 10, 2, always=[1, 2, 3])


def test_qwen3_draft_vocab_keeps_think_end_eos_and_every_used_token():
    """The traces stage's 151,936-id target with a 192-id draft vocab: before the fix every one of the
    712 paragraph breaks was forced in, the vocab became the 192 lowest break ids, without `</think>`,
    EOS or a single digit."""
    from specexit_core.teachers import qwen3_like as q3

    tok = q3.load_tokenizer()
    tids = token_ids(tok, think_start="<think>", think_end="</think>")
    assert len(tids.split) > 192
    text = "<think>\n4 + 17 = 21.\n\nThen 21 * 4 = 84:\n\nSo the answer is 84.\n</think>\n\nThe answer is 84.<|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    counts = np.bincount(np.asarray(ids), minlength=q3.FULL_VOCAB_SIZE)
    always, splits = exit_vocab(tids, counts)
    assert tids.think_end in always and set(tids.eos) <= set(always)
    assert splits and set(splits) == {t for t in tids.split if counts[t]}  # ".\n\n", ":\n\n"
    _, t2d = draft_vocab_from_counts(counts, 192, always, prefer=splits)
    assert all(t2d[t] for t in set(ids))  # every used token, </think> and <|im_end|> included
