"""`specexit bench longgen`: long generation, plain decoding vs EAGLE-3, the faithful TokenSwift engine and the
in-vLLM long mode (issue 14 item 5).

Methods (`method`, `backend`), all on the same target, EOS ignored, a fixed number of generated tokens
(`length`), as TokenSwift measures:
  plain       torch  `longgen.plain.plain_decode`: one forward per token through the engine's own target forward
  tokenswift  torch  `longgen.engine.LongGenEngine` (heads + n-grams, tree, partial KV, contextual penalty)
  plain       vllm   vLLM without speculative decoding (penalty on: `bench/plain_penalty.py`, the same windowed
                     penalty as a V1 logits processor: vLLM's own repetition penalty has no window)
  eagle3      vllm   the EAGLE-3 engine (the model set's draft), `extra_args={"specexit": False}`; penalty on:
                     the long mode's penalty with n-grams off (`{"long": {"ngram": False, "penalty": ...}}`)
  vllm_long   vllm   the same engine, `{"specexit": False, "long": {"ngram": True, ...}}` (+ the penalty)
Every method's `speedup_vs_plain` is against the plain row of ITS OWN backend (same length, temperature,
penalty): the torch engine against torch plain decoding, the vLLM methods against plain vLLM; `vllm_long` also
carries `speedup_vs_eagle3`. Ratios come from one run: per prompt (and repeat) all methods run back to back
in a rotating order (bench/methods.rotated), so background load hits them alike; a method's time per prompt
is the fastest of `repeats` runs by wall time (torch rows also report CPU time).

Per row: `wall_s` (summed over prompts), `tokens_per_forward` (committed tokens per verification forward:
1 + accepted / verify steps; plain 1.0), `acceptance` (accepted / drafted positions: TokenSwift's gamma + 1
positions per round; vLLM's draft tokens), `distinct_n` (mean Distinct-1..4 of the generated tokens, averaged
over prompts), `identical_to_plain` (greedy rows: every prompt's tokens equal its own backend's plain; sampled
rows: null), `drafter_kv_positions` (the most KV positions per layer and KV head the drafter attends to:
TokenSwift's partial cache, measured; EAGLE-3's own one-layer cache holds every position of the sequence,
derived as prompt + length, not measured). Greedy plain vllm rows add `torch_vllm_plain_agree`.

Model sets (`--model-set`): `toy` (the shipped teacher, its EAGLE-3/SpecExit draft, heads trained in-process
unless `--heads`; 512 positions, so lengths stop below that) and `long-writer` (the 16K long-writing teacher of
`specexit_core/teachers/long_writer.py` with its shipped heads and EAGLE-3 draft, `specexit long-writer heads|draft`;
without a draft its eagle3 / vllm_long rows are skipped with the reason recorded, or give `--draft`). `--json` ends with one line `{"rows": [...], ...}`.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from specexit_app.bench.longgen_rows import Runner, RunResult, measure, print_table, targets
from specexit_app.bench.longgen_toy import DEMO_PENALTY, TOY_KV, train_toy_heads
from specexit_core.longgen.partial_kv import PartialKVConfig
from specexit_core.longgen.penalty import PenaltyConfig
from specexit_core.longgen.tree import TreeConfig
from specexit_core.typed_config import ConfigError, StrictModel

log = logging.getLogger("specexit.bench.longgen")

METHODS = ("plain", "eagle3", "tokenswift", "vllm_long")
BACKENDS = {"tokenswift": ("torch",), "eagle3": ("vllm",), "vllm_long": ("vllm",), "plain": ("torch", "vllm")}
SLACK = 8  # positions beyond prompt + length a run may touch (a round's drafts past the last token)
DEFAULT_LENGTHS = {"toy": (128, 256, 448), "long-writer": (1024, 4096, 16384)}  # the toy has 512 positions
DRAFTER_KV_NOTE = (
    "tokenswift: the most positions per layer and KV head its draft forward attended to (partial KV, measured); "
    "eagle3 / vllm_long: EAGLE-3's drafter has its own one-layer KV cache over every position of the sequence, "
    "so prompt + length (derived, not measured); plain: 0"
)


class LongGenBenchConfig(StrictModel):
    """`specexit bench longgen` settings, validated before any model loads."""

    model_set: Literal["toy", "long-writer"] = "toy"
    target: str | None = None  # override the model set's target folder
    draft: str | None = None  # EAGLE-3 (SpecExit) draft folder for the vLLM rows (override)
    heads: str | None = None  # TokenSwift heads folder (`longgen.heads.load_heads`); toy: trained if absent
    heads_out: str | None = "runs/longgen/toy_heads"  # where in-process trained heads are saved (None: not saved)
    lengths: list[int] = Field(default_factory=lambda: list(DEFAULT_LENGTHS["toy"]))  # default: the model set's
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.6])
    penalties: list[Literal["off", "on"]] = Field(default_factory=lambda: ["off", "on"])
    penalty: PenaltyConfig | None = None  # the "on" setting; None: `default_penalty(model_set)`
    prompts: int = Field(2, ge=1)  # test prompts per row
    repeats: int = Field(1, ge=1)  # a method's time per prompt: the fastest of this many runs
    methods: list[Literal["plain", "eagle3", "tokenswift", "vllm_long"]] = Field(default_factory=lambda: list(METHODS))
    # which backends run: ["torch"] where vLLM is not installed (the lent GPU image: scripts/gpu_longgen.py)
    backends: list[Literal["torch", "vllm"]] = Field(default_factory=lambda: ["torch", "vllm"], min_length=1)
    num_speculative_tokens: int = Field(3, ge=1)  # EAGLE-3's k
    ngram_min: int = Field(2, ge=1)
    ngram_max: int = Field(8, ge=1)
    ngram_policy: Literal["adaptive", "always"] = "adaptive"  # vllm_long's (long_controls.LongConfig)
    tree: TreeConfig = TreeConfig()  # TokenSwift's 1-3-3-3 + 20 n-gram branches
    partial_kv: PartialKVConfig | None = None  # None: the model set's (toy: budget 128)
    train_steps: int = Field(300, ge=1)  # toy heads trained in-process (as longgen_demo.py)
    train_seqs: int = Field(64, ge=2)
    seed: int = 0
    torch_threads: int = Field(1, ge=1)  # single-stream decoding: one thread, as longgen_demo.py
    torch_device: str = "cpu"  # where the torch rows run ("cuda" on a GPU machine)
    gpu_memory_utilization: float = Field(0.4, gt=0, lt=1)  # per vLLM engine on a GPU (two engines share it)

    @model_validator(mode="before")
    @classmethod
    def _model_set_lengths(cls, data):
        if isinstance(data, dict) and data.get("lengths") is None and data.get("model_set") in DEFAULT_LENGTHS:
            data = {**data, "lengths": list(DEFAULT_LENGTHS[data["model_set"]])}
        return data

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, v: list[int]) -> list[int]:
        if not v or any(n < 1 for n in v):
            raise ValueError(f"lengths must be positive token counts, got {v}")
        return sorted(set(v))

    @field_validator("temperatures")
    @classmethod
    def _temps(cls, v: list[float]) -> list[float]:
        if not v or any(t < 0 or t > 5 for t in v):
            raise ValueError(f"temperatures must be in [0, 5], got {v}")
        return list(dict.fromkeys(v))

    @field_validator("penalties", "methods")
    @classmethod
    def _nonempty(cls, v: list) -> list:
        if not v:
            raise ValueError("must not be empty")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _consistent(self):
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) > ngram_max ({self.ngram_max})")
        if "on" in self.penalties and self.penalty is not None and not self.penalty.enabled:
            raise ValueError(f"penalty 'on' needs theta != 1 and window > 0, got {self.penalty}")
        return self

    def penalty_on(self) -> PenaltyConfig:
        return self.penalty if self.penalty is not None else default_penalty(self.model_set)


def default_penalty(model_set: str) -> PenaltyConfig:
    """The "on" penalty when none is given: TokenSwift's theta 1.2 over W = 1024, W scaled to 64 on the toy."""
    return DEMO_PENALTY if model_set == "toy" else PenaltyConfig()  # the class's defaults are TokenSwift's


# ------------------------------------------------------------------ model sets
@dataclass
class ModelSet:
    name: str
    target: Path
    draft: Path | None
    heads: Path | None  # None: train in-process (toy only) or skip tokenswift
    max_positions: int
    partial_kv: PartialKVConfig
    train_heads: bool  # no heads folder: train them on the teacher (toy)
    skipped: dict[str, str] = field(default_factory=dict)  # method -> why its rows are missing


def max_positions(target: Path) -> int:
    cfg = json.loads((Path(target) / "config.json").read_text())
    return int(cfg.get("max_position_embeddings") or cfg.get("n_positions") or 0)


def resolve_model_set(cfg: LongGenBenchConfig) -> ModelSet:
    """The folders of the configured model set (overrides applied), and which methods cannot run on it."""
    if cfg.model_set == "toy":
        from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR

        target, draft, heads, kv, train = TEACHER_DIR, DRAFT_DIR, None, TOY_KV, True
    else:
        try:  # imported by name: the long-writing teacher is built in a separate step and may not exist yet
            lw = importlib.import_module("specexit_core.teachers.long_writer")
        except ImportError as e:
            raise ConfigError(
                f"model set long-writer: specexit_core.teachers.long_writer not available ({e})"
            ) from None
        target, draft = Path(lw.LONG_WRITER_DIR), getattr(lw, "LONG_WRITER_DRAFT_DIR", None)
        heads, kv, train = Path(lw.LONG_WRITER_HEADS_DIR), PartialKVConfig(), False
    target = Path(cfg.target) if cfg.target else Path(target)
    draft = Path(cfg.draft) if cfg.draft else (Path(draft) if draft else None)
    heads = Path(cfg.heads) if cfg.heads else heads
    if not (target / "config.json").exists():
        raise ConfigError(f"model set {cfg.model_set}: no model at {target}")
    ms = ModelSet(cfg.model_set, target, draft, heads, max_positions(target), cfg.partial_kv or kv, train)
    if heads is not None and not Path(heads).exists():
        if cfg.heads:
            raise ConfigError(f"--heads {heads}: no such folder")
        ms.heads, ms.train_heads = None, False
        ms.skipped["tokenswift"] = (
            f"no TokenSwift heads at {heads} (train them: python -m pipelines.train_heads, or specexit long-writer heads)"
        )
    if "vllm" not in cfg.backends:
        ms.skipped.update({m: "backend vllm not asked for (--backends)" for m in ("eagle3", "vllm_long")})
    elif draft is None or not (Path(draft) / "config.json").exists():
        why = f"no EAGLE-3 draft for model set {cfg.model_set}" + (f" at {draft}" if draft else "") + " (--draft DIR)"
        ms.skipped.update({"eagle3": why, "vllm_long": why})
    if "torch" not in cfg.backends:
        ms.skipped["tokenswift"] = "backend torch not asked for (--backends)"
    return ms


def bench_prompts(model_set: str, tok, n: int) -> list[list[int]]:
    """The prompts' token ids: the toy's test problems (bench/methods.toy_prompts' draw), or the long writer's
    test walks (tokenized as its build does: `long_writer_build.window`, no special tokens)."""
    if model_set == "toy":
        from specexit_app.bench.methods import toy_prompts

        return toy_prompts(tok, n)[0]
    task = importlib.import_module("specexit_core.teachers.long_writer_task")
    return [tok(p.text, add_special_tokens=False)["input_ids"] for p in task.prompts("test", n, seed=1234)]


def check_lengths(lengths: Sequence[int], prompt_lens: Sequence[int], max_pos: int, model_set: str) -> None:
    """Fail before anything runs when the longest prompt + a length (+ a round's drafts) passes the model's
    positions (the toy has 512)."""
    room = max_pos - max(prompt_lens) - SLACK
    too_long = [n for n in lengths if n > room]
    if too_long:
        raise ConfigError(
            f"lengths {too_long} exceed model set {model_set}'s positions: {max_pos} positions - longest prompt "
            f"{max(prompt_lens)} - {SLACK} spare = at most {room} generated tokens"
            + (" (the 16K rows need the long-writing teacher: --model-set long-writer)" if model_set == "toy" else "")
        )


# ------------------------------------------------------------------ real runners
def torch_runners(model, heads, cfg: LongGenBenchConfig, ms: ModelSet) -> dict[tuple[str, str], Runner]:
    from specexit_core.longgen.engine import LongGenConfig, LongGenEngine
    from specexit_core.longgen.plain import NO_PENALTY, plain_decode

    eng = LongGenEngine(model, heads, LongGenConfig(tree=cfg.tree, partial_kv=ms.partial_kv))
    pen_on = cfg.penalty_on()

    def plain(p, n, t, seed, pen):
        r = plain_decode(eng.target, p, n, temperature=t, seed=seed, penalty=pen_on if pen else NO_PENALTY)
        return RunResult(r.token_ids, r.wall_s, r.cpu_s)

    def tokenswift(p, n, t, seed, pen):
        r = eng.generate(p, n, temperature=t, seed=seed, penalty=pen_on if pen else NO_PENALTY)
        s = r.stats
        return RunResult(
            r.token_ids,
            s.wall_s,
            s.cpu_s,
            verify_steps=s.rounds,
            drafted=s.rounds * s.max_depth,
            accepted=s.accepted,
            drafter_kv_positions=s.draft_kv_max,
            extra={"draft_forwards": s.draft_forwards, "tree_nodes": s.tree_nodes, "kv_selections": s.selections},
        )

    out: dict[tuple[str, str], Runner] = {}
    if "torch" in cfg.backends and ("plain" in cfg.methods or "tokenswift" in cfg.methods):
        out[("plain", "torch")] = plain
    if "tokenswift" in cfg.methods and "tokenswift" not in ms.skipped:
        out[("tokenswift", "torch")] = tokenswift
    return out


def vllm_extra_args(method: str, cfg: LongGenBenchConfig, penalty: bool) -> dict | None:
    """The request's extra_args per vLLM method (the module docstring lists them)."""
    pen = cfg.penalty_on()
    pen_d = {"theta": pen.theta, "window": pen.window}
    if method == "plain":
        from specexit_app.bench.plain_penalty import KEY

        return {KEY: pen_d} if penalty else None
    if method == "eagle3":
        return {"specexit": False, "long": {"ngram": False, "penalty": pen_d}} if penalty else {"specexit": False}
    long = {"ngram": True, "ngram_min": cfg.ngram_min, "ngram_max": cfg.ngram_max, "ngram_policy": cfg.ngram_policy}
    if penalty:
        long["penalty"] = pen_d
    return {"specexit": False, "long": long}


def vllm_runner(llm, method: str, cfg: LongGenBenchConfig, counters) -> Runner:
    from vllm import SamplingParams

    def run(p, n, t, seed, pen):
        sp = SamplingParams(
            max_tokens=n,
            temperature=t,
            seed=seed if t > 0 else None,
            ignore_eos=True,
            extra_args=vllm_extra_args(method, cfg, pen),
        )
        c0 = (counters.drafts, counters.draft_tokens, counters.accepted) if counters else (0, 0, 0)
        l0 = _long_counters(llm) if method == "vllm_long" else {}
        t0 = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t0
        c1 = (counters.drafts, counters.draft_tokens, counters.accepted) if counters else (0, 0, 0)
        extra = {}
        if method == "vllm_long":
            l1 = _long_counters(llm)
            for k in ("ngram_drafted_tokens", "ngram_accepted_tokens", "eagle_drafted_tokens", "eagle_accepted_tokens"):
                extra[k] = l1.get(f"long_{k}", 0) - l0.get(f"long_{k}", 0)
        toks = list(out.outputs[0].token_ids)
        return RunResult(
            toks,
            wall,
            None,
            verify_steps=c1[0] - c0[0],
            drafted=c1[1] - c0[1],
            accepted=c1[2] - c0[2],
            drafter_kv_positions=len(p) + len(toks) if method != "plain" else 0,
            extra=extra,
        )

    return run


def _long_counters(llm) -> dict:
    return llm.collective_rpc("specexit_counters")[0]


def vllm_engines(cfg: LongGenBenchConfig, ms: ModelSet, max_len: int):
    """(plain engine, EAGLE-3 engine or None), built only for the methods asked for."""
    from vllm import LLM

    from specexit_app.bench.plain_penalty import WindowedPenaltyLogitsProcessor
    from specexit_core.vllm_env import is_cpu_build, toy_llm_kwargs

    want = set(cfg.methods) - set(ms.skipped)
    base = {"max_model_len": max_len, "disable_log_stats": False}
    if not is_cpu_build():  # two engines on one GPU: each takes a share of its memory
        base["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    plain = None
    if want & {"plain", "eagle3", "vllm_long"}:
        plain = LLM(**toy_llm_kwargs(str(ms.target), logits_processors=[WindowedPenaltyLogitsProcessor], **base))
    spec = None
    if want & {"eagle3", "vllm_long"}:
        sc = {"method": "eagle3", "model": str(ms.draft), "num_speculative_tokens": cfg.num_speculative_tokens}
        spec = LLM(**toy_llm_kwargs(str(ms.target), speculative_config=sc, **base))
    return plain, spec


def run_bench(cfg: LongGenBenchConfig, print_fn=print) -> dict:
    import os

    import torch

    from specexit_core.longgen.heads import load_heads
    from specexit_core.toy.hf_generate import load_teacher
    from specexit_core.vllm_env import apply_cpu_defaults, is_cpu_build

    ms = resolve_model_set(cfg)
    model, tok = load_teacher(ms.target)  # float32 (parity with vLLM's float32 engine); on the CPU until trained
    prompts = bench_prompts(ms.name, tok, cfg.prompts)
    check_lengths(cfg.lengths, [len(p) for p in prompts], ms.max_positions, ms.name)
    torch.set_num_threads(cfg.torch_threads)
    heads, heads_info = None, None
    if "tokenswift" in cfg.methods and "tokenswift" not in ms.skipped:
        from specexit_core.longgen.target import Target

        if ms.heads is not None:
            heads, heads_info = load_heads(ms.heads, dtype=Target(model).dtype), {"loaded": str(ms.heads)}
        else:
            heads, heads_info = train_toy_heads(
                model,
                tok,
                Target(model),
                length=max(cfg.lengths),
                seqs=cfg.train_seqs,
                steps=cfg.train_steps,
                out=cfg.heads_out,
            )
        print_fn(f"heads: {json.dumps(heads_info)}")
        heads = heads.to(cfg.torch_device)
    model = model.to(cfg.torch_device)
    runners = torch_runners(model, heads, cfg, ms)
    want_vllm = (
        (set(cfg.methods) - set(ms.skipped)) & {"plain", "eagle3", "vllm_long"} if "vllm" in cfg.backends else set()
    )
    engines: list = []
    if want_vllm:
        if is_cpu_build():
            apply_cpu_defaults()
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the table and the JSON
        from specexit_app.bench.spec_counters import attach

        max_len = min(ms.max_positions, max(len(p) for p in prompts) + max(cfg.lengths) + SLACK)
        plain_llm, spec_llm = vllm_engines(cfg, ms, max_len)
        engines = [e for e in (plain_llm, spec_llm) if e is not None]
        runners[("plain", "vllm")] = vllm_runner(plain_llm, "plain", cfg, None)
        if spec_llm is not None:
            counters = attach(spec_llm)
            for m in ("eagle3", "vllm_long"):
                if m in cfg.methods and m not in ms.skipped:
                    runners[(m, "vllm")] = vllm_runner(spec_llm, m, cfg, counters)
    try:
        for r in runners.values():  # warm-up: first requests pay one-off costs (compilation, allocations)
            r(prompts[0], 8, 0.0, 0, False)
        t0 = time.perf_counter()
        rows = measure(cfg, runners, prompts)
        elapsed = time.perf_counter() - t0
    finally:
        for e in engines:
            e.llm_engine.engine_core.shutdown()
    rows = [r for r in rows if r["method"] in cfg.methods]
    return {
        "rows": rows,
        "targets": targets(rows),
        "skipped": ms.skipped,
        "model_set": {
            "name": ms.name,
            "target": str(ms.target),
            "draft": str(ms.draft) if ms.draft else None,
            "heads": heads_info,
            "max_positions": ms.max_positions,
            "partial_kv": ms.partial_kv.model_dump(),
        },
        "config": cfg.model_dump(),
        "penalty_on": cfg.penalty_on().model_dump(),
        "prompt_tokens": [len(p) for p in prompts],
        "measure_s": elapsed,
        "notes": {
            "speedup_vs_plain": "wall time of this backend's plain row / this row's (torch: plain_decode; vllm: "
            "vLLM without speculative decoding)",
            "plain_vllm_penalty": "penalty on: plain vLLM applies the same windowed penalty through a V1 logits "
            "processor (bench/plain_penalty.py)",
            "eagle3_penalty": "penalty on: the EAGLE-3 engine's long mode with n-grams off (penalty only)",
            "drafter_kv_positions": DRAFTER_KV_NOTE,
            "wall_s": "summed over prompts; per prompt the fastest of `repeats` runs",
        },
    }


def main(cfg: LongGenBenchConfig, as_json: bool, extra: dict | None = None) -> int:
    res = run_bench(cfg)
    print_table(res["rows"], res["skipped"])
    for name, t in res["targets"].items():
        print(f"target {name}: {json.dumps(t)}")
    if as_json:
        print(json.dumps({**res, **(extra or {})}))  # one line, the last on stdout
    greedy = [r for r in res["rows"] if r["identical_to_plain"] is not None]
    return 0 if all(r["identical_to_plain"] for r in greedy) else 1
