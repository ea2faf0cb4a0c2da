"""The demo's serving stage: the freshly trained SpecExit draft behind the Ray Serve OpenAI endpoint.

Starts the application of `serve_app/toy_cpu.yaml` (the same builder `serve run` uses) with the
demo's draft, asks `n` test-split problems through the official `openai` client with SpecExit off
and on (per-request `vllm_xargs`), checks that the reasoning comes back separately from the
answer, records `usage.specexit`, and shuts the application down (the evaluation needs the cores).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from specexit_core.typed_config import read_yaml

log = logging.getLogger("specexit.demo")


def app_args(serve_yaml: str, draft: str) -> tuple[dict, dict]:
    """The serve config's HTTP options and its application's arguments, serving `draft`."""
    d = read_yaml(serve_yaml)
    app = d["applications"][0]
    args = json.loads(json.dumps(app["args"]))
    args["model"]["draft"] = draft
    return d.get("http_options", {}), args


def serve_and_query(
    serve_yaml: str,
    *,
    draft: str,
    port: int,
    n: int,
    out: Path,
    max_tokens: int = 400,
    identity: dict | None = None,
) -> dict:
    """Serve, ask, shut down; writes `out` (the summary, `identity`: what the check depended on, and every
    request's row) and returns the summary."""
    from openai import OpenAI
    from ray import serve

    from serve_app.app import build_app
    from specexit_core.toy.task import grade, problems

    http, args = app_args(serve_yaml, draft)
    model = args["model"]["id"]
    host = http.get("host", "127.0.0.1")
    t0 = time.time()
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(args), name="specexit", route_prefix="/", blocking=False)
    _plain_logs()
    client = OpenAI(base_url=f"http://{host}:{port}/v1", api_key="demo", max_retries=0, timeout=300)
    _wait_ready(client, model)
    _plain_logs()
    ready_s = time.time() - t0
    log.info("[demo] endpoint http://%s:%d/v1 serves %s (ready in %.0fs)", host, port, model, ready_s)
    rows = []
    try:
        for p in problems("test", n, seed=4321):
            for on in (False, True):
                t = time.time()
                r = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": p.prompt}],
                    max_tokens=max_tokens,
                    temperature=0,
                    extra_body={"vllm_xargs": {"specexit_enabled": int(on)}},
                )
                msg = r.choices[0].message
                reasoning = getattr(msg, "reasoning_content", None) or getattr(msg, "reasoning", None)
                usage = r.usage.model_dump() if r.usage else {}
                rows.append(
                    {
                        "problem": p.prompt,
                        "gold": p.answer,
                        "specexit": on,
                        "answer": msg.content,
                        "reasoning": reasoning,
                        "correct": grade(msg.content or "", p.answer),
                        "usage_specexit": usage.get("specexit"),
                        "latency_s": round(time.time() - t, 3),
                    }
                )
        reserve = _answer_reserve_pair(client, model, rows[0])
        effort_none = _effort_none(client, model, rows[0]["problem"], max_tokens)
        example = next((r for r in rows if r["specexit"] and (r["usage_specexit"] or {}).get("exited")), rows[-1])
        log.info(
            "[demo] through the endpoint, SpecExit on:\n  reasoning: %s\n  answer: %s\n  usage.specexit: %s",
            (example["reasoning"] or "")[:400].replace("\n\n", " | "),
            example["answer"],
            json.dumps(example["usage_specexit"]),
        )
    finally:
        serve.delete("specexit")
        serve.shutdown()
        _plain_logs()
    think = lambda on: [(r["usage_specexit"] or {}).get("think_tokens") for r in rows if r["specexit"] == on]  # noqa: E731
    mean = lambda xs: None if not xs or None in xs else sum(xs) / len(xs)  # noqa: E731
    res = {
        "endpoint": f"http://{host}:{port}/v1",
        "model": model,
        "ready_s": round(ready_s, 1),
        "requests": len(rows),
        # every request came back in two parts: the reasoning, and an answer free of `</think>` (a
        # thinking that never closed is all reasoning and no answer: not separated)
        "reasoning_separated": all(r["reasoning"] and r["answer"] and "</think>" not in r["answer"] for r in rows),
        "accuracy_off": sum(r["correct"] for r in rows if not r["specexit"]) / n,
        "accuracy_on": sum(r["correct"] for r in rows if r["specexit"]) / n,
        "think_tokens_off": mean(think(False)),
        "think_tokens_on": mean(think(True)),
        "exits": sum(bool((r["usage_specexit"] or {}).get("exited")) for r in rows if r["specexit"]),
        "answer_reserve": reserve,
        "effort_none": effort_none,
        "complete": True,
    }
    out.write_text(json.dumps({**res, "identity": identity, "rows": rows}, indent=2) + "\n")
    return res


def _answer_reserve_pair(client, model: str, first: dict) -> dict:
    """The first problem again with `max_tokens` set so that the reserve's think budget is half its
    thinking (SpecExit off): off, thinking runs into the limit and the answer is empty; at effort `max`
    (no signal exit) the answer reserve closes thinking in time (specexit_core/exit/answer_reserve.py)."""
    from specexit_core.exit import ExitConfig
    from specexit_core.exit.answer_reserve import MARKERS

    think = first["usage_specexit"]["think_tokens"]
    limit = think // 2 + ExitConfig().answer_reserve_tokens + MARKERS
    out = {"max_tokens": limit, "think_tokens_unlimited": think}
    for name, extra in (("off", {"vllm_xargs": {"specexit_enabled": 0}}), ("max", {"reasoning_effort": "max"})):
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": first["problem"]}],
            max_tokens=limit,
            temperature=0,
            extra_body=extra,
        )
        u = r.usage.model_dump().get("specexit") or {}
        out[name] = {
            "answer": r.choices[0].message.content,
            "finish_reason": r.choices[0].finish_reason,
            "think_tokens": u.get("think_tokens"),
            "exit_reason": u.get("exit_reason"),
        }
    return out


def _effort_none(client, model: str, problem: str, max_tokens: int) -> dict:
    """One request at `reasoning_effort: none`: no thinking, whatever the template (one with
    `enable_thinking` closes it in the prompt; an R1-style one gets `</think>` as the first token)."""
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": problem}],
        max_tokens=max_tokens,
        temperature=0,
        reasoning_effort="none",
    )
    msg = r.choices[0].message
    u = r.usage.model_dump()
    return {
        "answer": msg.content,
        "reasoning": getattr(msg, "reasoning_content", None) or getattr(msg, "reasoning", None),
        "think_tokens": (u.get("specexit") or {}).get("think_tokens"),
        "completion_tokens": u.get("completion_tokens"),
    }


def _plain_logs() -> None:
    """Serve reconfigures the driver's root logger to JSON lines; the demo's progress log stays text."""
    logging.basicConfig(
        force=True, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )


def _wait_ready(client, model: str, timeout_s: float = 600) -> None:
    """Serve answers /v1/models once the ingress is up; the engine may still be loading, so poll a
    one-token completion until the model really answers."""
    t0 = time.time()
    last = None
    while time.time() - t0 < timeout_s:
        try:
            client.completions.create(model=model, prompt="1 + 1", max_tokens=1)
            return
        except Exception as e:  # not up yet: connection refused / 404 / 503 while the replica starts
            last = e
            time.sleep(2)
    raise TimeoutError(f"the Serve endpoint did not answer within {timeout_s:.0f}s: {last!r}")
