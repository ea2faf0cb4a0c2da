"""The GPU acceptance check: what CPU CI cannot see, in one run of under ten minutes, written as JSON.

    bash scripts/gpu_check.sh --out gpu_check.json              # a CUDA machine with the GPU stack
    bash scripts/gpu_check.sh --smoke --out /tmp/gpu_check.json # the same flow on the CPU build (CI)

On a GPU vLLM 0.32 turns on what the CPU build turns off, and each stage runs with those defaults:
CUDA graphs (no `enforce_eager`), async scheduling (vLLM's default for EAGLE-3), the V2 model runner
wherever SpecExit does not pin V1, bf16 and tensor parallelism.

1. `parity`: the toy teacher + its SpecExit draft (fp32, so tokens are comparable), CUDA graphs and
   async scheduling on: vLLM's exits and tokens against the reference PyTorch engine on the same
   prompts (the CPU CI test, tests/integration/test_vllm_plugin.py, under GPU engine modes).
2. `real_shape`: a randomly initialised target with Qwen3-4B's real shape and vocabulary (151,936;
   the shipped Qwen3 tokenizer), a SpecExit draft of its shape with a 32K draft vocabulary, bf16,
   tensor parallel over up to 2 GPUs: the hook at real size must never fall back or fail, and its
   time cost is SpecExit-on vs -off on the same engine (every request runs to `max_tokens`: random
   weights never stop, so both sides generate the same number of tokens).
3. `serve`: the Serve application (serve_app.app:build_app) with the toy on up to 2 GPUs, bf16,
   through the `openai` client: reasoning separated by the `qwen3` parser, `usage.specexit` filled.

Each stage records `ok` and its figures; the script exits 1 if any stage failed. `--smoke` shrinks
the shapes and runs on the CPU build (fp32, eager, TP 1, toy-sized target) so CI runs this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN3_4B = "Qwen/Qwen3-4B-Thinking-2507"
# head_dim 64: the CPU build's attention kernels support only some head sizes (not 16)
SMOKE_SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=64)


@dataclasses.dataclass(frozen=True)
class CheckSettings:
    smoke: bool  # CPU build, tiny shapes
    tp: int  # tensor parallel size of the real-shape and serve stages
    layers: int  # target layers of the real-shape stage (Qwen3-4B: 36)
    n_parity: int
    n_real: int
    real_max_tokens: int

    @property
    def device(self) -> str:
        return "cpu" if self.smoke else "cuda"


def engine_modes(llm) -> dict:
    """What this engine actually runs with (the point of the check)."""
    vc = llm.llm_engine.vllm_config
    comp = vc.compilation_config
    return {
        "async_scheduling": bool(getattr(vc.scheduler_config, "async_scheduling", False)),
        "cudagraph_mode": str(getattr(comp, "cudagraph_mode", None)),
        "enforce_eager": bool(vc.model_config.enforce_eager),
        "v2_model_runner": bool(getattr(vc, "use_v2_model_runner", False)),
        "dtype": str(vc.model_config.dtype),
        "tensor_parallel_size": vc.parallel_config.tensor_parallel_size,
    }


def counters(llm) -> dict:
    """SpecExit hook counters summed over the engine's workers."""
    total: dict = {}
    for c in llm.collective_rpc("specexit_counters"):
        for k, v in c.items():
            if isinstance(v, (int, float)):
                total[k] = total.get(k, 0) + v
    return total


def shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()


# -- 1. parity with the reference engine -------------------------------------------------------------
def check_parity(s: CheckSettings) -> dict:
    from vllm import LLM, SamplingParams

    from specexit_core.draft.checkpoint import load_draft
    from specexit_core.engine.reference import ReferenceEngine
    from specexit_core.engine.types import GenerationRequest
    from specexit_core.toy.hf_generate import load_teacher
    from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
    from specexit_core.toy.task import problems
    from specexit_core.toy.teacher_eval import prompt_ids
    from specexit_core.vllm_env import toy_llm_kwargs

    model, tok = load_teacher(TEACHER_DIR)
    prompts = [prompt_ids(tok, p) for p in problems("test", s.n_parity, seed=21)]
    spec = {"method": "eagle3", "model": str(DRAFT_DIR), "num_speculative_tokens": 3}
    llm = LLM(**toy_llm_kwargs(str(TEACHER_DIR), speculative_config=spec, enforce_eager=s.smoke))
    try:
        modes = engine_modes(llm)
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            SamplingParams(max_tokens=400, temperature=0),
            use_tqdm=False,
        )
        hook = counters(llm)
    finally:
        shutdown(llm)
    ref = ReferenceEngine(model, tok, load_draft(DRAFT_DIR), num_speculative_tokens=3)
    want = ref.generate([GenerationRequest(p, max_tokens=400) for p in prompts])
    eos = tok.eos_token_id
    got = [list(o.outputs[0].token_ids) for o in outs]
    got = [g[:-1] if g and g[-1] == eos else g for g in got]
    same = sum(g == w.token_ids for g, w in zip(got, want))
    exits = sum(w.exited for w in want)
    return {
        "ok": same >= 0.95 * len(prompts) and exits > 0 and not hook.get("hook_errors") and not hook.get("fallbacks"),
        "identical": same,
        "prompts": len(prompts),
        "reference_exits": exits,
        "hook": hook,
        "engine": modes,
    }


# -- 2. the hook at real size -------------------------------------------------------------------------
def steer_output(target, token_ids: list[int]) -> None:
    """Make a random target write paragraph breaks. With random weights greedy decoding picks one of
    151,936 tokens almost uniformly (a break, 712 of them, every ~200 tokens), so the exit would have
    nowhere to fire. The output rows of `token_ids` (paragraph breaks) get unit scale, all others
    1/50 of init scale: the largest logit is then one of theirs (all 16 negative: p = 2^-16), and the
    target writes breaks. Input embeddings shrink too, which changes nothing the model computes (its
    first op is an RMSNorm), and the step's cost is untouched (same shapes, same kernels)."""
    import torch

    w = target.get_output_embeddings().weight
    with torch.no_grad():
        w.mul_(0.02)
        g = torch.Generator(device="cpu").manual_seed(1)
        w[token_ids] = torch.randn(len(token_ids), w.shape[1], generator=g).to(w)


def build_real_shape(s: CheckSettings, work: Path) -> tuple[Path, Path]:
    """A random-weight Qwen3 target (real shape unless smoke) with the real tokenizer, and a random
    SpecExit draft for it whose exit fires at the first paragraph break after 8 think tokens."""
    import torch
    from transformers import AutoTokenizer

    from specexit_core.draft.checkpoint import save_draft
    from specexit_core.draft.config import vllm_default_aux_layer_ids
    from specexit_core.exit.split_tokens import split_token_ids
    from specexit_core.tokenizers import QWEN3_TOKENIZER_DIR
    from specexit_core.training.known_targets import KNOWN_TARGETS
    from specexit_core.training.synthetic import random_draft, random_target

    shape = dict(KNOWN_TARGETS[QWEN3_4B], num_hidden_layers=s.layers, max_position_embeddings=4096)
    if s.smoke:
        shape.update(SMOKE_SHAPE)
    dtype = torch.float32 if s.smoke else torch.bfloat16
    torch.manual_seed(0)
    target = random_target(shape, dtype=dtype, device=s.device)
    tok = AutoTokenizer.from_pretrained(QWEN3_TOKENIZER_DIR)
    splits = list(split_token_ids(tok))
    steer_output(target, splits[:16])
    target_dir, draft_dir = work / "target", work / "draft"
    target.save_pretrained(target_dir)
    for f in QWEN3_TOKENIZER_DIR.glob("*.json"):
        shutil.copy(f, target_dir / f.name)
    draft = random_draft(
        target, aux_layer_ids=vllm_default_aux_layer_ids(s.layers), draft_vocab_size=1000 if s.smoke else 32000
    )
    draft.cfg = dataclasses.replace(
        draft.cfg,
        token_ids={
            "think_start": tok.convert_tokens_to_ids("<think>"),
            "think_end": tok.convert_tokens_to_ids("</think>"),
            "split": splits,
        },
        exit_defaults={"method": "confidence", "confidence_threshold": 0.0, "min_think_tokens": 8},
    )
    save_draft(draft.to(dtype), draft_dir)
    del target, draft
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return target_dir, draft_dir


def check_real_shape(s: CheckSettings, work: Path) -> dict:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    t0 = time.time()
    target_dir, draft_dir = build_real_shape(s, work)
    build_s = time.time() - t0
    tok = AutoTokenizer.from_pretrained(target_dir)
    msgs = [[{"role": "user", "content": f"What is {i} + {2 * i + 1}? Think step by step."}] for i in range(s.n_real)]
    # Thinking-2507 style: the generation prompt opens the think block
    texts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) + "<think>\n" for m in msgs]
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    llm = LLM(
        model=str(target_dir),
        dtype="float32" if s.smoke else "bfloat16",
        tensor_parallel_size=s.tp,
        enforce_eager=s.smoke,
        max_model_len=2048,
        max_num_seqs=max(s.n_real, 1),
        seed=0,
        speculative_config={"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": 3},
    )
    try:
        modes = engine_modes(llm)
        runs = {}
        for name, on in (("warmup", False), ("eagle3", False), ("specexit", True), ("eagle3_again", False)):
            sp = SamplingParams(max_tokens=s.real_max_tokens, temperature=0, ignore_eos=True,
                                extra_args={"specexit": on})  # fmt: skip
            t = time.time()
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
            runs[name] = {"wall_s": round(time.time() - t, 3), "tokens": sum(len(o.outputs[0].token_ids) for o in outs)}
        close = tok.convert_tokens_to_ids("</think>")
        exited = sum(close in o.outputs[0].token_ids for o in outs)  # the last run: SpecExit off
        hook = counters(llm)
    finally:
        shutdown(llm)
    off = min(runs["eagle3"]["wall_s"], runs["eagle3_again"]["wall_s"])
    return {
        "ok": not hook.get("hook_errors") and not hook.get("fallbacks") and hook.get("exits", 0) > 0,
        "target": {"shape": "smoke" if s.smoke else QWEN3_4B, "layers": s.layers, "vocab": 151936},
        "build_s": round(build_s, 1),
        "runs": runs,
        "specexit_over_eagle3_time": round(runs["specexit"]["wall_s"] / off, 3),
        "think_end_without_exit": exited,
        "hook": hook,
        "engine": modes,
    }


# -- 3. the Serve endpoint ----------------------------------------------------------------------------
def check_serve(s: CheckSettings) -> dict:
    import ray
    from openai import OpenAI
    from ray import serve

    from serve_app.app import build_app
    from serve_app.proxy_readiness import patient_proxy_readiness
    from specexit_core.toy.task import problems
    from specexit_core.typed_config import read_yaml

    args = read_yaml(ROOT / "serve_app" / "toy_cpu.yaml")["applications"][0]["args"]
    if not s.smoke:
        args["model"].update(accelerator="gpu", tensor_parallel_size=s.tp, dtype="bfloat16", enforce_eager=False)
        args["model"].pop("cpu", None)
    port = 8000 + os.getpid() % 1000
    patient_proxy_readiness()
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(args), name="specexit", route_prefix="/", blocking=False)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="check", max_retries=0, timeout=120)
        t0 = time.time()
        while True:
            try:
                client.models.list()
                break
            except Exception:
                if time.time() - t0 > 400:
                    raise
                time.sleep(3)
        rows = []
        for p in problems("test", 8, seed=4321):
            r = client.chat.completions.create(
                model=args["model"]["id"], messages=[{"role": "user", "content": p.prompt}], max_tokens=400,
                temperature=0, extra_body={"vllm_xargs": {"specexit_enabled": 1}},
            )  # fmt: skip
            msg = r.choices[0].message
            usage = r.usage.model_dump() if r.usage else {}
            rows.append(
                {
                    "reasoning": bool(getattr(msg, "reasoning_content", None) or getattr(msg, "reasoning", None)),
                    "answer_clean": "</think>" not in (msg.content or ""),
                    "usage_specexit": usage.get("specexit"),
                }
            )
    finally:
        serve.shutdown()
        ray.shutdown()
    return {
        "ok": all(r["reasoning"] and r["answer_clean"] and r["usage_specexit"] for r in rows),
        "requests": len(rows),
        "exits": sum(bool((r["usage_specexit"] or {}).get("exited")) for r in rows),
        "ready_s": round(time.time() - t0, 1),
        "model": args["model"],
    }


def environment() -> dict:
    import torch
    import vllm

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"gpus": gpus, "vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where the JSON goes")
    ap.add_argument("--smoke", action="store_true", help="CPU build, tiny shapes (CI)")
    ap.add_argument("--stages", default="parity,real_shape,serve", help="comma-separated subset")
    ap.add_argument("--layers", type=int, default=None, help="target layers of real_shape (default 36; smoke 8)")
    a = ap.parse_args(argv)
    import torch

    if not a.smoke and not torch.cuda.is_available():
        ap.error("no CUDA device visible (use --smoke on the CPU build)")
    s = CheckSettings(
        smoke=a.smoke,
        tp=1 if a.smoke else min(2, torch.cuda.device_count()),
        layers=a.layers or (8 if a.smoke else 36),  # vLLM's default aux layers (2, L//2, L-3) are distinct from 8
        n_parity=8 if a.smoke else 64,
        n_real=4 if a.smoke else 64,
        real_max_tokens=48 if a.smoke else 256,
    )
    stages = {"parity": check_parity, "real_shape": check_real_shape, "serve": check_serve}
    unknown = set(a.stages.split(",")) - set(stages)
    if unknown:
        ap.error(f"unknown stages {sorted(unknown)}; choose from {sorted(stages)}")
    if a.smoke:
        from specexit_core.vllm_env import apply_cpu_defaults

        apply_cpu_defaults()  # the KV cache size the CPU build needs (its memory check fails otherwise)
    res: dict = {"when": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "settings": dataclasses.asdict(s)}
    res["environment"] = environment()
    with tempfile.TemporaryDirectory(prefix="specexit-gpu-check-") as work:
        for name in a.stages.split(","):
            t = time.time()
            print(f"[gpu_check] {name} ...", file=sys.stderr, flush=True)
            try:
                fn = stages[name]
                out = fn(s, Path(work)) if name == "real_shape" else fn(s)
            except Exception as e:  # one failed stage must not hide the others' figures
                out = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
            out["seconds"] = round(time.time() - t, 1)
            res[name] = out
            print(f"[gpu_check] {name}: {'ok' if out['ok'] else 'FAILED'} ({out['seconds']}s)", file=sys.stderr)
    res["ok"] = all(res[n]["ok"] for n in a.stages.split(","))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({n: res[n]["ok"] for n in a.stages.split(",")}))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
