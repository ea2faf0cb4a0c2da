import collections
import random
import statistics

from specexit_core.toy.task import is_hard, problems
from specexit_core.toy.traces import BREAK, TraceStyle, make_trace

DEFAULT_STYLE = TraceStyle()


def _traces(n=2000, style=DEFAULT_STYLE, seed=0):
    rng = random.Random(seed)
    return [make_trace(p, rng, style) for p in problems("train", n)]


def test_trace_format():
    t = _traces(50)[7]
    assert t.completion.startswith(t.paragraphs[0])
    think, answer = t.completion.split("</think>")
    assert think.endswith(BREAK) and answer == BREAK + t.answer_text
    assert all(BREAK not in p and "\n" not in p for p in t.paragraphs)
    assert t.answer_text == f"The answer is {t.problem.answer} ."


def test_slips_are_corrected_and_prefer_hard_steps():
    traces = _traces(3000)
    slips = hard = 0
    for t in traces:
        for i, k in enumerate(t.kinds):
            if k == "slip":
                assert t.kinds[i + 1] == "correction"
                assert t.paragraphs[i + 1].startswith("Wait , ")
                a, op, b = t.paragraphs[i].split()[:3]
                slips += 1
                hard += is_hard(int(a), op, int(b))
    assert slips > 100
    assert hard / slips > 0.8  # slips concentrate on carries / borrows / big products


def test_recheck_counts_vary_and_depend_on_the_problem():
    traces = _traces(3000)
    counts = collections.Counter(t.n_rechecks for t in traces)
    assert set(counts) == set(range(7))  # 0..6, including traces that close right after the last step
    assert counts[0] > 0.05 * len(traces)

    def hard_steps(t):
        v = t.problem.values()
        return sum(is_hard(v[i], op, b) for i, (op, b) in enumerate(t.problem.steps))

    easy = [t.n_rechecks for t in traces if hard_steps(t) == 0 and t.n_slips == 0]
    tough = [t.n_rechecks for t in traces if hard_steps(t) >= 3]
    assert statistics.mean(tough) > statistics.mean(easy) + 1.5


def _ratio(t):
    def ntok(s):  # word-level token count incl. breaks
        return len(s.replace(BREAK, " @ ").split())

    after = sum(ntok(p) + 1 for p in t.paragraphs[t.answer_known_after + 1 :])
    return after / (ntok(t.think_text))


def test_text_level_overthinking_ratio_in_target_band():
    data = statistics.mean(_ratio(t) for t in _traces(2000))
    noiseless = TraceStyle(slip_prob_hard=0, slip_prob_easy=0, recheck_noise=0, p_no_recheck=0)
    greedy_like = statistics.mean(_ratio(t) for t in _traces(2000, noiseless))
    assert 0.55 <= data <= 0.75, data
    assert 0.55 <= greedy_like <= 0.75, greedy_like
