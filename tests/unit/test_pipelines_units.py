"""Fast checks of the pipeline building blocks (no Ray cluster, no vLLM engine)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipelines.common import graders
from pipelines.common.config import ConfigError
from pipelines.common.parts import clean_tmp, done_ids, part_files, tally, write_part
from pipelines.common.prompt_source import InputConfig, dedupe_ids, normalize
from pipelines.common.schemas import LABELS, TRACES, empty_row, to_table
from pipelines.common.stage_cli import main, parse_summary
from pipelines.common.tokens import split_token_ids, think_opened, token_ids
from pipelines.common.writer import write_batch
from pipelines.labels.labeler import ProbeLabeler
from pipelines.stages import load_stage_config
from pipelines.traces.config import TracesConfig
from pipelines.traces.job import finalize
from pipelines.train_draft.vocab_counts import count_tokens
from specexit_core.draft.vocab import build_draft_vocab, draft_vocab_from_counts
from specexit_core.labels import label_trace
from specexit_core.toy.task import problems
from specexit_core.toy.tokenizer import build_tokenizer
from specexit_core.toy.traces import make_trace
from specexit_core.training.collate import collate
from support.paths import REPO_ROOT

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*/*.yaml"))


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


# -- configs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_configs_validate(path, monkeypatch):
    """Every recipe in examples/ loads with its own typed loader (unknown keys would be errors)."""
    from pipelines.calibrate.config import CalibrateConfig
    from pipelines.evaluate.config import EvalConfig
    from pipelines.evaluate.generalisation import GeneralisationConfig
    from specexit_app.demo_config import load_demo_config
    from specexit_core.typed_config import load_config

    monkeypatch.setenv("SPECEXIT_ROOT", str(REPO_ROOT))
    stem = path.stem
    if stem == "demo":
        cfg = load_demo_config(path)
        assert Path(cfg.workdir).is_absolute() and all(
            Path(getattr(cfg, s)).exists()
            for s in ("traces", "labels", "train_draft", "calibrate", "serve", "evaluate")
        )
        return
    if stem == "serve":  # a Serve config (as serve_app/toy_cpu.yaml): its app args are the typed part
        from serve_app.config import load_args
        from specexit_core.typed_config import read_yaml

        for app in read_yaml(path)["applications"]:
            load_args(app["args"])
        return
    from pipelines.stages import STAGES

    model = {"evaluate": EvalConfig, "calibrate": CalibrateConfig, "generalisation": GeneralisationConfig}.get(stem)
    # a variant recipe is named after its stage: train_draft_qwen3_layer.yaml is a train_draft config
    stage = next((s for s in STAGES if stem == s or stem.startswith(s + "_")), stem)
    cfg = load_config(model, str(path)) if model else load_stage_config(stage, str(path))
    assert Path(cfg.output).is_absolute()


def test_toy_configs_chain(monkeypatch):
    monkeypatch.setenv("SPECEXIT_ROOT", "/data/x")
    t, lab, d = (
        load_stage_config(s, str(REPO_ROOT / "examples/toy" / f"{s}.yaml")) for s in ("traces", "labels", "train_draft")
    )
    assert t.output == lab.input == "/data/x/runs/toy/traces"
    assert lab.output == d.input == "/data/x/runs/toy/labels"
    assert d.storage_path == "/data/x/runs/ray_train"


def test_gpu_configs_are_real_model_settings(monkeypatch):
    monkeypatch.setenv("SPECEXIT_ROOT", str(REPO_ROOT))
    d = load_stage_config("train_draft", str(REPO_ROOT / "examples/gpu/train_draft.yaml"))
    t = load_stage_config("traces", str(REPO_ROOT / "examples/gpu/traces.yaml"))
    assert d.aux_layer_ids == (2, 18, 33) and d.draft_vocab_size == 32000 and d.use_gpu is True
    assert t.engine.model == "Qwen/Qwen3-4B-Thinking-2507"  # a hub id stays a hub id
    assert t.engine.tensor_parallel_size == 2 and t.engine.accelerator == "gpu"


@pytest.mark.parametrize(
    "stage,patch,key",
    [
        ("traces", {"engin": {}}, "engin"),
        ("traces", {"engine": {"model": "m", "max_model_length": 5}}, "max_model_length"),
        ("traces", {"sampling": {"temprature": 0.1}}, "temprature"),
        ("labels", {"grader": "toy", "probe_tokens": 3}, "probe_tokens"),
        ("train_draft", {"stepz": 3}, "stepz"),
    ],
)
def test_unknown_keys_are_errors(tmp_path, stage, patch, key):
    base = yaml_for(stage)
    for k, v in patch.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps(base))
    with pytest.raises(ConfigError, match=key):
        load_stage_config(stage, str(f))


def yaml_for(stage: str) -> dict:
    eng = {"model": "/nonexistent/model"}
    if stage == "traces":
        return {"output": "o", "engine": eng}
    if stage == "labels":
        return {"input": "i", "output": "o", "engine": eng}
    return {"input": "i", "output": "o", "target": "t", "run_name": "r", "draft_vocab_size": 10}


def test_overrides_and_input_kind_inference(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps(yaml_for("traces")))
    cfg = load_stage_config("traces", str(f), input=str(tmp_path / "p.jsonl"), output=str(tmp_path / "out"), limit=7)
    assert (cfg.input.kind, cfg.input.path, cfg.output, cfg.limit) == (
        "jsonl",
        str(tmp_path / "p.jsonl"),
        str(tmp_path / "out"),
        7,
    )
    pq.write_table(pa.table({"prompt": ["a"]}), tmp_path / "d.parquet")
    assert load_stage_config("traces", str(f), input=str(tmp_path / "d.parquet")).input.kind == "parquet"
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "dataset_info.json").write_text("{}")
    assert load_stage_config("traces", str(f), input=str(tmp_path / "hf")).input.kind == "hf_disk"
    with pytest.raises(ConfigError, match="input.path"):
        load_stage_config("traces", None, raw={**yaml_for("traces"), "input": {"kind": "jsonl"}})


def test_cli_bad_config_exits_2(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text("output: o\nengine: {model: m}\nbogus: 1\n")
    assert main("traces", TracesConfig, lambda cfg: {}, ["--config", str(f)]) == 2
    assert "bogus" in capsys.readouterr().err


def test_summary_line_roundtrip(capsys):
    from pipelines.common.stage_cli import print_summary

    print_summary({"ok": 3, "errors": 1, "complete": True})
    assert parse_summary("noise\n" + capsys.readouterr().out) == {"ok": 3, "errors": 1, "complete": True}


# -- sources -------------------------------------------------------------------------------------
def test_normalize_bad_rows():
    cfg = InputConfig(kind="jsonl", path="x", gold_column="answer")
    rows = [
        normalize({"text": t}, i, cfg)
        for i, t in enumerate(
            [
                '{"id": "a", "prompt": "2 + 2", "answer": 4}',
                '{"prompt": ""}',
                '{"prompt": 5}',
                '{"question": "q"}',
                "not json",
                '["a list"]',
            ]
        )
    ]
    assert rows[0] == {"id": "a", "prompt": "2 + 2", "gold": "4", "error": None}
    assert [r["error"] for r in rows[1:]] == [
        "empty prompt",
        "prompt is not a string (int)",
        "no 'prompt' field",
        rows[4]["error"],
        rows[5]["error"],
    ]
    assert rows[4]["error"].startswith("invalid JSON") and rows[5]["error"].startswith("invalid JSON")
    assert [r["id"] for r in rows[1:]] == [f"row-{i:08d}" for i in range(1, 6)]


def test_multiple_choice_prompt_and_dedupe():
    cfg = InputConfig(kind="parquet", path="x", choices_column="choices", gold_column="label")
    r = normalize({"id": "q1", "prompt": "Pick", "choices": ["red", "blue"], "label": "B"}, 0, cfg)
    assert r["prompt"] == "Pick\nA. red\nB. blue" and r["gold"] == "B"
    rows = dedupe_ids([{"id": "x", "error": None}, {"id": "x", "error": None}, {"id": "y", "error": None}])
    assert [r["id"] for r in rows] == ["x", "x#dup1", "y"] and rows[1]["error"].startswith("duplicate id")


# -- graders -------------------------------------------------------------------------------------
def test_graders():
    assert graders.grade("toy", " The answer is 47 .", "47") == 1.0
    assert graders.reference_answer("numeric", "Natalia sold 48/2 = 24 ... #### 72", None) == "72"
    assert graders.reference_answer("numeric", None, "so it is \\boxed{1,234}.") == "1234"
    assert graders.grade("numeric", "72}$.", "72") == 1.0 and graders.grade("numeric", "7.0", "7") == 1.0
    assert graders.grade("numeric", "no number", "7") == 0.0
    assert graders.reference_answer("multiple_choice", "c", None) == "C"
    assert graders.grade("multiple_choice", "The answer is (B).", "B") == 1.0
    assert graders.grade("multiple_choice", "\\boxed{D}", "B") == 0.0
    assert graders.reference_answer("toy", None, None) is None


# -- tokens ---------------------------------------------------------------------------------------
def test_token_ids_of_toy_tokenizer(tok):
    ids = token_ids(tok, think_start="<think>", think_end="</think>")
    assert ids.split == (tok.convert_tokens_to_ids("\n\n"),)
    assert ids.think_end == tok.convert_tokens_to_ids("</think>") and ids.eos == (tok.eos_token_id,)
    assert split_token_ids(tok, ["\n\n"]) == ids.split
    with pytest.raises(ValueError, match="single token"):
        split_token_ids(tok, ["7 + 5"])
    assert think_opened([1, 5, 9], 5, 6) and not think_opened([5, 6], 5, 6) and not think_opened([1], 5, 6)


# -- parts -----------------------------------------------------------------------------------------
def test_parts_atomic_resume_bookkeeping(tmp_path):
    rows = [empty_row(TRACES, f"r{i}", "x") for i in range(5)]
    write_part(tmp_path, to_table(rows[:3], TRACES))
    (tmp_path / ".tmp-part-dead.parquet").write_bytes(b"half a file")  # a writer killed mid-write
    assert done_ids(tmp_path) == {"r0", "r1", "r2"} and len(part_files(tmp_path)) == 1
    assert clean_tmp(tmp_path) == 1
    expected = [f"r{i}" for i in range(5)]
    t = tally(tmp_path, expected)
    assert (t["missing"], t["complete"]) == (2, False)
    write_part(tmp_path, to_table(rows[3:], TRACES))
    t = tally(tmp_path, expected)
    assert t == {"input_rows": 5, "ok": 0, "errors": 5, "missing": 0, "duplicates": 0, "complete": True}
    write_part(tmp_path, to_table(rows[:1], TRACES))
    assert tally(tmp_path, expected)["duplicates"] == 1


def test_write_batch_casts_to_schema(tmp_path):
    batch = pa.Table.from_pylist(
        [
            {
                "id": "a",
                "status": "ok",
                "error": None,
                "prompt_token_ids": [1, 2],
                "completion_token_ids": [3],
                "finished_think": True,
            }
        ]
    )
    rec = write_batch(batch, folder=str(tmp_path), schema_name="traces")
    assert rec["rows"] == [1] and rec["ok"] == [1]
    t = pq.read_table(tmp_path / rec["part"][0])
    assert t.schema == TRACES and t.column("prompt_token_ids").to_pylist() == [[1, 2]]


# -- traces finalize ------------------------------------------------------------------------------
def test_finalize_splits_reasoning_and_answer(tok):
    p = problems("train", 1)[0]
    tr = make_trace(p, random.Random(0))
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": p.prompt}], tokenize=False, add_generation_prompt=True
    )
    pids = tok(prompt, add_special_tokens=False)["input_ids"]
    comp = tok(tr.completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = token_ids(tok, think_start="<think>", think_end="</think>")
    row = {
        "id": "x",
        "input_prompt": p.prompt,
        "gold": str(p.answer),
        "prompt_token_ids": np.array(pids),
        "generated_tokens": comp,
        "generated_text": tr.completion,
        "__inference_error__": "",
    }
    kw = dict(
        ids={"eos": set(ids.eos), "think_start": ids.think_start, "think_end": ids.think_end},
        think_start_text="<think>",
        think_end_text="</think>",
    )
    out = finalize(row, **kw)
    assert out["status"] == "ok" and out["finish_reason"] == "stop" and out["finished_think"]
    assert out["completion_token_ids"] == comp[:-1] and out["answer"] == tr.answer_text
    assert out["reasoning"] == tr.think_text.strip("\n")
    err = finalize({"id": "y", "input_prompt": "p", "__inference_error__": "VLLMValidationError: too long"}, **kw)
    assert err["status"] == "error" and "too long" in err["error"] and err["completion_token_ids"] is None


# -- labeler logic with a fake engine ----------------------------------------------------------------
class _FakeLabeler(ProbeLabeler):
    """ProbeLabeler minus vLLM: the 'engine' answers right once the prefix contains the answer."""

    def __init__(self, tok, max_len=512):
        self.ids = token_ids(tok, think_start="<think>", think_end="</think>")
        self.close_ids = tok.encode("</think>\n\n", add_special_tokens=False)
        self.max_len, self.grader, self.shift, self.initial = max_len, "toy", "next_step", 0.0
        self.tok = tok

    sampling = None

    def _generate(self, prompts, keys):
        out = []
        for pr, key in zip(prompts, keys):
            think = self.tok.decode(pr).split("<think>")[-1]
            if self.sampling is None:
                out.append([" The answer is 47 ." if "= 47" in think else " The answer is 1 ."])
            else:  # k samples: right once the answer is in the prefix, and 1 in 4 by luck before that
                k = self.sampling["samples"]
                out.append(
                    [" The answer is 47 ." if "= 47" in think or j == 0 else " The answer is 1 ." for j in range(k)]
                )
                self.keys.append(key)
        return out


def test_labeler_batch_labels_and_error_rows(tok):
    from specexit_core.toy.task import Problem

    p = Problem(8, (("*", 7), ("-", 18), ("+", 9)))  # = 47
    tr = make_trace(p, random.Random(1))
    prompt = tok(
        tok.apply_chat_template([{"role": "user", "content": p.prompt}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    comp = tok(tr.completion, add_special_tokens=False)["input_ids"]
    ok = dict(
        id="a",
        status="ok",
        error=None,
        gold="47",
        answer=tr.answer_text,
        prompt_token_ids=prompt,
        completion_token_ids=comp,
    )
    rows = [
        ok,
        dict(ok, id="b", status="error", error="engine: boom", prompt_token_ids=None, completion_token_ids=None),
        dict(ok, id="c", completion_token_ids=comp[:5]),  # never closed </think>
        dict(ok, id="d", gold=None, answer=""),
    ]  # nothing to grade against
    out = _FakeLabeler(tok)(pa.Table.from_pylist(rows)).to_pylist()
    assert [r["status"] for r in out] == ["ok", "error", "error", "error"]
    assert out[1]["error"] == "trace error: engine: boom" and out[2]["error"].startswith("unfinished trace")
    assert out[3]["error"].startswith("no reference answer")
    a = out[0]
    brk = tok.convert_tokens_to_ids("\n\n")
    end = comp.index(tok.convert_tokens_to_ids("</think>"))
    assert a["boundaries"] == [i for i in range(end) if comp[i] == brk]
    want = [1.0 if "= 47" in tok.decode(comp[: b + 1]) else 0.0 for b in a["boundaries"]]
    assert a["probe_outcomes"] == want and a["final_correct"] and a["reference"] == "47"
    ref = label_trace(
        prompt,
        comp,
        want,
        split_ids={brk},
        think_start_id=tok.convert_tokens_to_ids("<think>"),
        think_end_id=tok.convert_tokens_to_ids("</think>"),
    )
    np.testing.assert_allclose(a["confidence"], ref.confidence)
    np.testing.assert_allclose(a["progress"], ref.progress)
    assert a["mask"] == ref.mask.tolist() and len(a["confidence"]) == len(comp)
    assert pa.Table.from_pylist(out, schema=LABELS).num_rows == 4

    # k sampled probes per break (ProbeSampling): the label is the share that answers right
    soft = _FakeLabeler(tok)
    soft.sampling, soft.keys = {"samples": 4}, []
    b = soft(pa.Table.from_pylist(rows[:1])).to_pylist()[0]
    assert b["probe_outcomes"] == [1.0 if w else 0.25 for w in want]
    assert soft.keys == [f"a@{i}" for i in a["boundaries"]]  # what seeds each break's samples
    assert set(np.unique(np.array(b["confidence"])[np.array(b["mask"])])) <= {0.0, 0.25, 1.0}


# -- training inputs --------------------------------------------------------------------------------
def test_draft_vocab_from_counts_matches_core():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50, size=rng.integers(1, 30)).tolist() for _ in range(40)]
    counts = np.bincount(np.concatenate(seqs), minlength=60)
    for always in ([], [59, 3]):
        d2t, t2d = draft_vocab_from_counts(counts, 20, always)
        e_d2t, e_t2d = build_draft_vocab(seqs, 60, 20, always)
        assert torch.equal(d2t, e_d2t) and torch.equal(t2d, e_t2d)
    batch = pa.table({"c": [s for s in seqs]})
    np.testing.assert_array_equal(count_tokens(batch, column="c", vocab_size=60)["counts"][0], counts)


def test_collate_places_labels_on_completion():
    batch = {
        "prompt_token_ids": np.array([np.array([1, 2]), np.array([3])], dtype=object),
        "completion_token_ids": np.array([np.array([4, 5, 6]), np.array([7])], dtype=object),
        "confidence": np.array([np.array([0.0, 1.0, 0.0]), np.array([1.0])], dtype=object),
        "progress": np.array([np.array([0.5, 1.0, 0.0]), np.array([1.0])], dtype=object),
        "log_remaining": np.array([np.array([0.7, 0.0, 0.0]), np.array([0.0])], dtype=object),
        "mask": np.array([np.array([True, True, False]), np.array([True])], dtype=object),
    }
    b = collate(batch["prompt_token_ids"], batch["completion_token_ids"], batch, pad_id=0, eos_id=9)
    assert b.input_ids.tolist() == [[1, 2, 4, 5, 6, 9], [3, 7, 9, 0, 0, 0]]
    assert b.loss_mask.tolist() == [[0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]]
    assert b.confidence[0].tolist() == [0, 0, 0, 1, 0, 0] and b.think_mask[1].tolist() == [0, 1, 0, 0, 0, 0]
    t = collate(batch["prompt_token_ids"], batch["completion_token_ids"], batch, pad_id=0, eos_id=9, max_len=3)
    assert t.input_ids.shape == (2, 3) and t.progress[0].tolist() == [0, 0, 0.5]


def test_init_draft_stock_gets_signal_rows_and_keeps_vocab(tmp_path):
    """`init_draft`: fine-tuning starts from a published (stock) EAGLE-3 head: zero signal rows are
    added, its draft vocab is kept, and a vocab without the exit's tokens is refused."""
    import torch
    from safetensors.torch import load_file

    from pipelines.train_draft.config import TrainDraftConfig
    from pipelines.train_draft.job import prepare_init_draft
    from specexit_core.draft.checkpoint import convert, load_draft, read_config
    from specexit_core.toy.paths import DRAFT_DIR

    stock = convert(DRAFT_DIR, tmp_path / "stock", add_signals=False)
    assert not read_config(stock).signals
    cfg = TrainDraftConfig(input="x", output="y", target="t", run_name="r", init_draft=str(stock))
    assert cfg.draft_vocab_size is None  # taken from the init draft
    init, d2t, t2d = prepare_init_draft(cfg, tmp_path / "run", must_keep=[])
    d = load_draft(init, expect_signals=True)
    H = d.cfg.hidden_size
    assert d.fc.weight.shape[0] == H + 3 and torch.count_nonzero(d.fc.weight[H:]) == 0  # fresh signal rows
    ref = load_file(str(DRAFT_DIR / "model.safetensors"))
    assert torch.equal(d2t, ref["d2t"].long()) and torch.equal(t2d, ref["t2d"].to(torch.bool))
    unused = int((~t2d).nonzero()[0])
    with pytest.raises(SystemExit, match="lacks token ids"):
        prepare_init_draft(cfg, tmp_path / "run2", must_keep=[unused])
    with pytest.raises(ValueError, match="draft_vocab_size .* or init_draft"):
        TrainDraftConfig(input="x", output="y", target="t", run_name="r")
