"""The `specexit` command. Subcommands grow with the project; each is a thin shell over a module."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def cmd_toy_build(args: argparse.Namespace) -> int:
    from specexit_core.toy.build import BuildConfig, build
    from specexit_core.toy.paths import TEACHER_DIR

    cfg = BuildConfig()
    if args.config:
        cfg = BuildConfig.from_json(json.loads(Path(args.config).read_text()))
    if args.steps is not None:
        cfg = BuildConfig.from_json({**cfg.to_json(), "steps": args.steps})
    build(cfg, Path(args.out or TEACHER_DIR))
    return 0


def cmd_teacher_build(args: argparse.Namespace) -> int:
    from specexit_core.teachers.build import build, load_build_config
    from specexit_core.teachers.registry import get_teacher

    spec = get_teacher(args.name)
    d = json.loads(Path(args.config).read_text()) if args.config else {}
    if args.steps is not None:
        d["steps"] = args.steps
    build(spec, load_build_config(spec, d), Path(args.out or spec.assets_dir))
    return 0


def cmd_teacher_materialize(args: argparse.Namespace) -> int:
    from specexit_core.teachers.materialize import materialize

    out = materialize(args.name, args.assets and Path(args.assets), args.out and Path(args.out), force=args.force)
    print(out)
    return 0


def cmd_teacher_check(args: argparse.Namespace) -> int:
    from specexit_core.teachers.check import check
    from specexit_core.teachers.materialize import materialize
    from specexit_core.teachers.registry import get_teacher

    spec = get_teacher(args.name)
    res, _ = check(spec, args.model or materialize(spec), n=args.n, seed=args.seed, split=args.split)
    print(json.dumps(res.to_json(), indent=2))
    return 0


def cmd_toy_eval(args: argparse.Namespace) -> int:
    from specexit_core.toy.paths import TEACHER_DIR
    from specexit_core.toy.teacher_eval import evaluate

    res = evaluate(args.model or TEACHER_DIR, n=args.n, seed=args.seed, split=args.split)
    if args.json:
        print(json.dumps(res.to_json(), indent=2))
    else:
        for k, v in res.to_json().items():
            print(f"{k:28s} {v:.4f}" if isinstance(v, float) else f"{k:28s} {v}")
    return 0


def cmd_toy_demo(args: argparse.Namespace) -> int:
    from specexit_core.toy.showcase import run_demo

    return run_demo(n=args.n, json_out=args.json)


def cmd_toy_train_draft(args: argparse.Namespace) -> int:
    from specexit_core.toy.draft_build import DraftTrainConfig, train_toy_draft
    from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR

    d = json.loads(Path(args.config).read_text()) if args.config else {}
    if args.steps is not None:
        d["steps"] = args.steps
    cfg = DraftTrainConfig.from_json(d)
    meta = train_toy_draft(cfg, Path(args.teacher or TEACHER_DIR), Path(args.out or DRAFT_DIR))
    print(json.dumps(meta["heldout"], indent=2))
    return 0


def cmd_draft_convert(args: argparse.Namespace) -> int:
    from specexit_core.draft.for_target import convert_for_target

    try:
        out = convert_for_target(
            args.src,
            args.dst,
            add_signals=args.add_signals,
            target=args.target,
            token_ids=json.loads(args.token_ids) if args.token_ids else None,
            think_start=args.think_start,
            think_end=args.think_end,
            split_tokens=args.split_token,
            fmt=args.format,
        )
    except (ValueError, FileNotFoundError) as e:  # CheckpointMismatch is a ValueError
        print(f"specexit draft convert: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def cmd_bench_vllm(args: argparse.Namespace) -> int:
    from specexit_app.bench.vllm_bench import main as bench_main

    return bench_main(n=args.n, as_json=args.json, exit_config=args.exit_config)


def cmd_bench_reference(args: argparse.Namespace) -> int:
    from specexit_app.bench.reference_bench import main as bench_main

    return bench_main(n=args.n, as_json=args.json, exit_config=args.exit_config)


def cmd_bench_hook(args: argparse.Namespace) -> int:
    from specexit_app.bench.hook_bench import main as bench_main

    return bench_main(sizes=tuple(args.sizes), steps=args.steps, as_json=args.json)


def kv_bench_config(args: argparse.Namespace):
    """The `bench kv` options given on the command line over KVBenchConfig's defaults."""
    from specexit_app.bench.kv_bench import KVBenchConfig

    fields = KVBenchConfig.model_fields
    return KVBenchConfig(**{k: v for k, v in vars(args).items() if k in fields and v is not None})


def cmd_bench_kv(args: argparse.Namespace) -> int:
    from pipelines.common.provenance import provenance
    from specexit_app.bench.kv_bench import main as bench_main

    return bench_main(kv_bench_config(args), as_json=args.json, extra=provenance())


def csv(v: str | None, conv) -> list | None:
    """A comma-separated option as a list (None stays None)."""
    return None if v is None else [conv(x) for x in v.split(",") if x.strip()]


def longgen_bench_config(args: argparse.Namespace):
    """The `bench longgen` options given on the command line over LongGenBenchConfig's defaults."""
    from specexit_app.bench.longgen_bench import LongGenBenchConfig
    from specexit_core.typed_config import load_config

    over = {
        "model_set": args.model_set,
        "target": args.target,
        "draft": args.draft,
        "heads": args.heads,
        "heads_out": args.heads_out,
        "lengths": csv(args.lengths, int),
        "temperatures": csv(args.temperatures, float),
        "penalties": csv(args.penalties, str.strip),
        "methods": csv(args.methods, str.strip),
        "backends": csv(args.backends, str.strip),
        "prompts": args.prompts,
        "repeats": args.repeats,
        "num_speculative_tokens": args.k,
        "train_steps": args.train_steps,
        "train_seqs": args.train_seqs,
        "penalty.theta": args.theta,
        "penalty.window": args.window,
        "tree.widths": csv(args.tree_widths, int),
        "tree.ngram_top_k": args.ngram_branches,
        "torch_device": args.torch_device,
        "ngram_policy": args.ngram_policy,
    }
    if (args.theta is None) != (args.window is None):  # the other one from the model set's penalty
        from specexit_app.bench.longgen_bench import default_penalty

        pen = default_penalty(args.model_set or "toy")
        over["penalty.theta"] = pen.theta if args.theta is None else args.theta
        over["penalty.window"] = pen.window if args.window is None else args.window
    return load_config(LongGenBenchConfig, raw={}, overrides=over, what="bench longgen")


def cmd_bench_longgen(args: argparse.Namespace) -> int:
    from pipelines.common.provenance import provenance
    from specexit_app.bench.longgen_bench import main as bench_main
    from specexit_core.typed_config import ConfigError

    try:
        cfg = longgen_bench_config(args)
        return bench_main(cfg, as_json=args.json, extra=provenance())
    except ConfigError as e:
        print(f"specexit bench longgen: {e}", file=sys.stderr)
        return 2


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from pipelines.common.provenance import provenance
    from serve_app.serve_bench_run import ServeBenchConfig
    from serve_app.serve_bench_run import main as bench_main

    cfg = ServeBenchConfig(
        model_set=args.model_set,
        concurrency=tuple(csv(args.concurrency, int)),
        requests=tuple(csv(args.requests, int)),
        max_tokens=args.max_tokens,
        num_cpus=args.num_cpus,
        rounds=args.rounds,
        serve_variants=tuple(
            (name, tuple(tuple(kv.split("=", 1)) for kv in envs.split(",") if kv))
            for name, _, envs in (v.partition(":") for v in args.serve_variant or ["default:"])
        ),
    )
    return bench_main(cfg, as_json=args.json, extra=provenance(), output=args.output)


def soak_config(args: argparse.Namespace):
    """The `bench soak` options given on the command line over SoakConfig's defaults (validated here,
    before any cluster starts)."""
    from serve_app.soak import SoakConfig
    from specexit_core.typed_config import load_config

    fields = SoakConfig.model_fields
    over = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    if args.kinds is not None:
        over["kinds"] = csv(args.kinds, str.strip)
    return load_config(SoakConfig, raw={}, overrides=over, what="bench soak")


def cmd_bench_soak(args: argparse.Namespace) -> int:
    from pipelines.common.provenance import provenance
    from specexit_core.typed_config import ConfigError

    try:
        cfg = soak_config(args)
    except ConfigError as e:
        print(f"specexit bench soak: {e}", file=sys.stderr)
        return 2
    from serve_app.soak_run import main as bench_main

    return bench_main(cfg, as_json=args.json, extra=provenance(), output=args.output)


def cmd_long_writer_build(args: argparse.Namespace) -> int:
    from specexit_core.teachers.long_writer import LONG_WRITER_DIR
    from specexit_core.teachers.long_writer_build import build, build_shipped, load_recipe

    if not args.config:  # the shipped model: all its stages
        if args.steps is not None or args.init_from:
            raise SystemExit("--steps and --init-from apply to one stage: give its recipe with --config")
        build_shipped(Path(args.out or LONG_WRITER_DIR))
        return 0
    cfg = load_recipe(json.loads(Path(args.config).read_text()))
    overrides = {"steps": args.steps, "init_from": args.init_from}
    cfg = load_recipe({**cfg.to_json(), **{k: v for k, v in overrides.items() if v is not None}})
    build(cfg, Path(args.out or LONG_WRITER_DIR))
    return 0


def _config_from_args(cls, args: argparse.Namespace):
    """A typed config from the options `add_config_options` made: the ones given, the rest the class's defaults."""
    return cls(**{k: getattr(args, k) for k in cls.model_fields if getattr(args, k, None) is not None})


def add_config_options(parser: argparse.ArgumentParser, cls) -> None:
    """One option per field of `cls` (`--seq-len` for `seq_len`), typed and described by the field; no default
    here, so the class stays the one home of its defaults (validated when the config is built)."""
    for name, f in cls.model_fields.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=f.annotation, help=f"{f.description} (default {f.default})"
        )


def cmd_long_writer_heads(args: argparse.Namespace) -> int:
    from specexit_core.teachers.long_writer import LONG_WRITER_HEADS_DIR
    from specexit_core.teachers.long_writer_drafters import LongWriterHeadsConfig
    from specexit_core.teachers.long_writer_heads import train_long_writer_heads

    cfg = _config_from_args(LongWriterHeadsConfig, args)
    print(json.dumps(train_long_writer_heads(cfg, Path(args.out or LONG_WRITER_HEADS_DIR))))
    return 0


def cmd_long_writer_draft(args: argparse.Namespace) -> int:
    from specexit_core.teachers.long_writer import LONG_WRITER_DRAFT_DIR
    from specexit_core.teachers.long_writer_draft import train_long_writer_draft
    from specexit_core.teachers.long_writer_drafters import LongWriterDraftConfig

    cfg = _config_from_args(LongWriterDraftConfig, args)
    print(json.dumps(train_long_writer_draft(Path(args.out or LONG_WRITER_DRAFT_DIR), cfg)))
    return 0


def cmd_long_writer_check(args: argparse.Namespace) -> int:
    from specexit_core.teachers.long_writer import LONG_WRITER_DIR
    from specexit_core.teachers.long_writer_check import check, meets_target

    model = args.model or str(LONG_WRITER_DIR)
    if args.engine == "vllm":
        from specexit_app.long_writer_vllm import make_long_writer_llm, vllm_check

        res = vllm_check(make_long_writer_llm(model), length=args.length, n_prompts=args.prompts, seed=args.seed)
        for r in res["prompts"]:
            r.pop("token_ids")
    else:
        res = check(model, length=args.length, n_prompts=args.prompts, seed=args.seed, threads=args.threads)
    if args.output or args.record:
        from pipelines.common.provenance import provenance
        from specexit_core.teachers.long_writer_check import record

        res = {**res, **provenance()}  # the one home of command, commit, machine and date
        if args.output:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(json.dumps(res, indent=2) + "\n")
        if args.record:
            record(Path(model), res)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for r in res["prompts"]:
            buckets = "  ".join(f"{k}: {b['correct']:.4f} ({b['steps']})" for k, b in r["buckets"].items())
            print(f"{r['prompt']}: {r['tokens']} tokens, {r['correct']:.4f} of {r['steps']} steps correct  [{buckets}]")
    return 0 if meets_target(res) else 1


def served_profile_flags(serve_config: str, app: str | None) -> dict:
    """`--serve-config FILE [--app NAME]`: the sampling the deployment serves a request that names none
    with (serve_app.config.served_sampling), as calibrate's temperatures (greedy first) / top_p / top_k."""
    from serve_app.config import load_args, served_sampling
    from specexit_core.typed_config import ConfigError, read_yaml

    apps = read_yaml(serve_config).get("applications") or []
    chosen = [a for a in apps if app is None or a.get("name") == app]
    if len(chosen) != 1:
        names = [a.get("name") for a in apps]
        raise ConfigError(f"--serve-config {serve_config}: name one application with --app (it has {names})")
    prof = served_sampling(load_args(chosen[0].get("args")))
    temps = [0.0] if prof.temperature == 0 else [0.0, prof.temperature]
    logging.getLogger("specexit.calibrate").info("the deployment serves %s: calibrating at %s", prof.name, temps)
    return {"temperatures": temps, "top_p": prof.top_p, "top_k": prof.top_k}


def cmd_calibrate(args: argparse.Namespace) -> int:
    from pipelines.calibrate.job import main as calibrate_main
    from specexit_core.typed_config import ConfigError

    try:
        sampling = {"temperatures": csv(args.temperatures, float), "top_p": args.top_p, "top_k": args.top_k}
        if args.serve_config:  # the flags given on the command line win over the Serve config's
            served = served_profile_flags(args.serve_config, args.app)
            sampling = {k: served[k] if v is None else v for k, v in sampling.items()}
        elif args.app:
            raise ConfigError("--app goes with --serve-config FILE")
        return calibrate_main(
            args.config,
            output=args.output,
            limit=args.n,
            as_json=args.json,
            prompts=args.prompts,
            prompt_column=args.prompt_column,
            samples=args.samples,
            **sampling,
        )
    except (ConfigError, ValueError) as e:  # ValueError: --temperatures that are not numbers
        print(f"specexit calibrate: {e}", file=sys.stderr)
        return 2


def cmd_signals(args: argparse.Namespace) -> int:
    from pipelines.calibrate.signal_quality import measure
    from specexit_core.typed_config import ConfigError

    try:
        res = measure(args.eval_dir, args.draft, config=args.config, temperatures=csv(args.temperatures, float))
    except (ConfigError, ValueError, OSError) as e:
        print(f"specexit signals: {e}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    for t, r in res["by_temperature"].items():
        c, g, h = r["confidence"], r["regression"], r["headroom"]
        auroc = "n/a" if c["auroc"] is None else f"{c['auroc']:.3f}"
        print(
            f"T={t}: {r['traces']} traces; confidence AUROC {auroc} over {c['breaks']} probed breaks ({c['right']} right)"
        )
        if g["tokens"]:
            print(
                f"  progress MAE {g['progress_mae']:.3f}, remaining MAE {g['remaining_mae_tokens']:.1f} tokens "
                f"({g['remaining_mae_log1p']:.2f} in log1p) over {g['tokens']} think tokens"
            )
        e, o = h["eagle3"], h["oracle"]
        print(
            f"  eagle3 {e['accuracy']:.3f} at {e['think_tokens']:.1f} think tokens; oracle {o['accuracy']:.3f} at {o['think_tokens']:.1f}"
        )
        for p in h["front"]:
            print(f"  front: {p['accuracy']:.3f} at {p['think_tokens']:.1f} think tokens  {json.dumps(p['exit'])}")
    if args.json:
        print(json.dumps(res))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from specexit_app.demo import print_table, run_demo
    from specexit_app.demo_config import load_demo_config
    from specexit_core.typed_config import ConfigError

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the table / the JSON
    try:
        cfg = load_demo_config(
            args.config, quick=args.quick, workdir=args.workdir, port=args.port, teacher=args.teacher
        )
    except (ConfigError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 2
    summary = run_demo(cfg, fresh=args.fresh)
    from pipelines.common.runtime import stop_ray_quietly

    # Ray down before the summary: at interpreter exit its workers' multiprocessing resource_tracker
    # children print KeyError tracebacks, which the still-running log monitor streams after our output
    stop_ray_quietly()
    # the last stderr line is ours: actor log lines Ray streamed while the report was written (e.g.
    # resource_tracker warnings of exiting vLLM workers) all came before Ray stopped
    logging.getLogger("specexit.demo").info("[demo] done in %.0fs; Ray stopped", summary["seconds"])
    if args.json:
        print(json.dumps(summary))
    else:
        print_table(summary)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specexit", description="SpecExit on Ray + vLLM")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)

    dm = sub.add_parser(
        "demo",
        help="the whole loop on the toy: traces -> labels -> draft -> calibration -> "
        "Ray Serve endpoint -> evaluation of every method -> report",
    )
    dm.add_argument(
        "--teacher",
        default="toy",
        help="the teacher: toy (default; examples/toy/demo.yaml) or a built-in one (qwen3-like: "
        "examples/qwen3_like/demo.yaml); --config wins",
    )
    dm.add_argument("--config", help="DemoConfig YAML (default: the --teacher's demo.yaml)")
    dm.add_argument("--quick", action="store_true", help="a smoke run of every stage (the config's `quick` block)")
    dm.add_argument("--json", action="store_true", help="end with one JSON line: the per-method summary")
    dm.add_argument("--workdir", help="work folder (default: the config's)")
    dm.add_argument("--port", type=int, help="HTTP port of the Serve endpoint (default: the config's)")
    dm.add_argument("--fresh", action="store_true", help="delete the work folder first instead of resuming")
    dm.set_defaults(func=cmd_demo)

    toy = sub.add_parser("toy", help="the built-in tiny reasoning teacher").add_subparsers(
        dest="toy_cmd", required=True
    )
    b = toy.add_parser("build", help="train the toy teacher from scratch (fixed seed, ~14 min on 2 cores)")
    b.add_argument("--out", help="output folder (default: the shipped teacher folder)")
    b.add_argument("--config", help="BuildConfig JSON (default: the shipped recipe)")
    b.add_argument("--steps", type=int, help="override the number of training steps")
    b.set_defaults(func=cmd_toy_build)

    e = toy.add_parser("eval", help="accuracy, think length and overthinking of the teacher")
    e.add_argument("--n", type=int, default=200, help="number of held-out problems")
    e.add_argument("--model", help="teacher folder (default: the shipped one)")
    e.add_argument("--split", default="test", choices=["train", "dev", "test"])
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=cmd_toy_eval)

    d = toy.add_parser("demo", help="show the teacher thinking in transformers and vLLM, then evaluate it")
    d.add_argument("--n", type=int, default=100)
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_toy_demo)
    t = toy.add_parser("train-draft", help="train the SpecExit draft (EAGLE-3 + signal rows) on teacher traces")
    t.add_argument("--teacher", help="teacher folder (default: the shipped one)")
    t.add_argument("--out", help="output folder (default: the shipped draft folder)")
    t.add_argument("--config", help="DraftTrainConfig JSON (unknown keys are errors)")
    t.add_argument("--steps", type=int)
    t.set_defaults(func=cmd_toy_train_draft)

    te = sub.add_parser("teacher", help="built-in teachers with real vocabularies (issue #13)").add_subparsers(
        dest="teacher_cmd", required=True
    )
    from specexit_core.teachers.registry import TEACHERS

    names = sorted(TEACHERS)
    tb = te.add_parser("build", help="train a teacher from scratch (fixed seed; default recipe: ~30 min on 2 cores)")
    tb.add_argument("name", choices=names)
    tb.add_argument("--out", help="output folder of the compact weights (default: the shipped one)")
    tb.add_argument("--config", help="build config JSON over the teacher's defaults (unknown keys are errors)")
    tb.add_argument("--steps", type=int, help="override the number of training steps")
    tb.set_defaults(func=cmd_teacher_build)
    tm = te.add_parser("materialize", help="expand the shipped compact teacher into a full checkpoint folder")
    tm.add_argument("name", choices=names)
    tm.add_argument("--assets", help="compact teacher folder (default: the shipped one)")
    tm.add_argument(
        "--out", help="output folder (default: $SPECEXIT_TEACHERS_DIR/NAME or ~/.cache/specexit/teachers/NAME)"
    )
    tm.add_argument("--force", action="store_true", help="rewrite even if the folder is up to date")
    tm.set_defaults(func=cmd_teacher_materialize)
    tc = te.add_parser("check", help="greedy transformers check: format, accuracy, think lengths")
    tc.add_argument("name", choices=names)
    tc.add_argument("--model", help="full checkpoint folder (default: materialise the shipped one)")
    tc.add_argument("--n", type=int, default=100)
    tc.add_argument("--split", default="test", choices=["train", "dev", "test"])
    tc.add_argument("--seed", type=int, default=0)
    tc.set_defaults(func=cmd_teacher_check)

    dr = sub.add_parser("draft", help="draft checkpoints").add_subparsers(dest="draft_cmd", required=True)
    c = dr.add_parser("convert", help="stock EAGLE-3 <-> SpecExit checkpoint (adds zero signal rows / strips them)")
    c.add_argument("src")
    c.add_argument("dst")
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--add-signals", action="store_true", dest="add_signals")
    g.add_argument("--strip-signals", action="store_false", dest="add_signals")
    c.add_argument("--target", help="target model folder: its layer count (a head naming no aux layers) and tokenizer")
    c.add_argument("--token-ids", help='JSON {"think_start": ID, "think_end": ID, "split": [IDS]} instead of --target')
    c.add_argument("--think-start", default="<think>", help="think-start text in the target tokenizer")
    c.add_argument("--think-end", default="</think>", help="think-end text in the target tokenizer")
    c.add_argument(
        "--split-token", action="append", help="paragraph-break text (repeat; default: all blank-line tokens)"
    )
    c.add_argument(
        "--format",
        default="flat",  # checked by the converter (specexit_core/draft/formats.py: FORMATS)
        help="layout of DST's config.json (docs/draft_formats.md): flat (default) or speculators "
        "(`vllm serve DST` serves --target with DST as its draft)",
    )
    c.set_defaults(func=cmd_draft_convert)

    be = sub.add_parser("bench", help="benchmarks (methods side by side, one run)").add_subparsers(
        dest="bench_cmd", required=True
    )
    bv = be.add_parser("vllm", help="EAGLE-3 only vs SpecExit inside vLLM on the toy test split")
    bv.add_argument("--n", type=int, default=50)
    bv.add_argument("--json", action="store_true")
    bv.add_argument(
        "--exit-config",
        help="calibrated exit JSON for the specexit method (e.g. examples/toy/calibrated.json); "
        "default: the draft's defaults",
    )
    bv.set_defaults(func=cmd_bench_vllm)
    br = be.add_parser(
        "reference", help="the `bench vllm` methods on the reference PyTorch engine (same JSON keys; one line)"
    )
    br.add_argument("--n", type=int, default=50)
    br.add_argument("--json", action="store_true", help="print the result as one JSON line (the last line)")
    br.add_argument("--exit-config", help="calibrated exit JSON for the specexit method (as in `bench vllm`)")
    br.set_defaults(func=cmd_bench_reference)
    bh = be.add_parser("hook", help="microseconds the SpecExit vLLM hook adds per engine step (synthetic runner state)")
    bh.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64, 256], help="running requests per step")
    bh.add_argument("--steps", type=int, default=40, help="timed steps per size")
    bh.add_argument("--json", action="store_true", help="only the JSON lines (the last one holds the numbers)")
    bh.set_defaults(func=cmd_bench_hook)
    bk = be.add_parser(
        "kv",
        help="KV on the toy: a long prompt re-sent after an engine restart (tiered connector vs none), and "
        "concurrent long requests at a tight KV budget (SpecExit vs EAGLE-3: preemptions, block-seconds)",
    )
    # unset options keep KVBenchConfig's defaults (specexit_app/bench/kv_bench.py: their one home)
    bk.add_argument("--json", action="store_true", help="print the result as one JSON line (the last line)")
    bk.add_argument("--restart-prompts", type=int, help="long prompts re-sent after the restart")
    bk.add_argument("--history-tokens", type=int, help="a restart prompt's length at most")
    bk.add_argument("--restart-max-tokens", type=int, help="greedy tokens compared after the restart")
    bk.add_argument("--num-blocks", type=int, help="KV pool under pressure, in blocks of 32 tokens")
    bk.add_argument("--max-concurrency", type=int, help="the concurrency sweep's upper end")
    bk.add_argument("--pressure-requests", type=int, help="requests in the pressure wave (default: max concurrency)")
    bk.add_argument("--max-tokens", type=int, help="tokens per pressure request at most")
    bk.add_argument("--exit-config", help="calibrated exit JSON for specexit (default: the draft's defaults)")
    bk.set_defaults(func=cmd_bench_kv)
    bl = be.add_parser(
        "longgen",
        help="long generation: plain vs EAGLE-3, the TokenSwift engine and the in-vLLM long mode, per length, "
        "temperature and penalty (tokens per forward, acceptance, Distinct-n, drafter KV, speed-up vs plain)",
    )
    # unset options keep LongGenBenchConfig's defaults (specexit_app/bench/longgen_bench.py: their one home)
    bl.add_argument("--json", action="store_true", help='end with one JSON line {"rows": [...], ...}')
    bl.add_argument("--model-set", choices=["toy", "long-writer"], help="target + EAGLE-3 draft + heads (default: toy)")
    bl.add_argument("--target", help="target model folder (overrides the model set's)")
    bl.add_argument("--draft", help="EAGLE-3 (SpecExit) draft folder for the vLLM rows")
    bl.add_argument("--heads", help="TokenSwift heads folder (default toy: trained in-process)")
    bl.add_argument("--heads-out", help="where in-process trained heads are saved")
    bl.add_argument(
        "--lengths",
        help="generated tokens, comma-separated (default toy 128,256,448 (at most ~470); long-writer 1024,4096,16384)",
    )
    bl.add_argument("--temperatures", help="comma-separated; 0 = greedy (default 0,0.6)")
    bl.add_argument("--penalties", help="off,on (default both)")
    bl.add_argument("--theta", type=float, help="contextual penalty theta when on (toy default 1.2)")
    bl.add_argument("--window", type=int, help="contextual penalty window when on (toy default 64)")
    bl.add_argument("--methods", help="comma-separated subset of plain,eagle3,tokenswift,vllm_long")
    bl.add_argument("--backends", help="torch,vllm (default both; torch alone where vLLM is not installed)")
    bl.add_argument("--prompts", type=int, help="test prompts per row")
    bl.add_argument("--repeats", type=int, help="runs per prompt and method (the fastest counts)")
    bl.add_argument("--k", type=int, help="EAGLE-3 draft tokens per step")
    bl.add_argument("--tree-widths", help="TokenSwift tree top-k per depth, e.g. 1,3,3,3")
    bl.add_argument("--ngram-branches", type=int, help="TokenSwift n-gram branches per depth-1 token")
    bl.add_argument("--train-steps", type=int, help="in-process heads training steps (toy)")
    bl.add_argument("--train-seqs", type=int, help="in-process heads training sequences (toy)")
    bl.add_argument("--torch-device", help="device of the torch rows (default cpu; cuda on a GPU machine)")
    bl.add_argument(
        "--ngram-policy", choices=["adaptive", "always"], help="vllm_long's n-gram policy (default adaptive)"
    )
    bl.set_defaults(func=cmd_bench_longgen)
    bs = be.add_parser(
        "serve",
        help="the Serve endpoint (openai client over HTTP) vs vLLM AsyncLLM in-process, same requests: "
        "throughput ratio, engine ms per request, CPU-ms per request outside the engine",
    )
    bs.add_argument("--json", action="store_true", help='end with one JSON line {"rows": [...], ...}')
    bs.add_argument("--model-set", choices=["toy", "long-writer"], default="long-writer")
    bs.add_argument("--concurrency", default="1,16", help="comma-separated levels")
    bs.add_argument("--requests", default="8,64", help="requests per level, comma-separated")
    bs.add_argument("--max-tokens", type=int, help="tokens every request generates (default: the model set's)")
    bs.add_argument("--num-cpus", type=int, default=8, help="logical CPUs of the local Ray cluster")
    bs.add_argument("--rounds", type=int, default=2, help="direct then Serve, this many times (rows pool them)")
    bs.add_argument(
        "--serve-variant",
        action="append",
        help="NAME:KEY=VALUE,... env vars of the Serve path's Ray cluster, one Serve run each (repeat; "
        "default: one run, 'default:', with none)",
    )
    bs.add_argument("--output", help="also write the raw JSON (with command, commit, machine, date) here")
    bs.set_defaults(func=cmd_bench_serve)
    bo = be.add_parser(
        "soak",
        help="the Serve app (toy, 2 replicas) under mixed traffic for N minutes: memory growth after warm-up, "
        "p99 latency drift, 5xx, telemetry folder size (serve_app/soak.py: the verdicts)",
    )
    # unset options keep SoakConfig's defaults (serve_app/soak.py: their one home)
    bo.add_argument("--minutes", type=float, required=True, help="traffic time, fractions allowed (CI: 0.5)")
    bo.add_argument("--json", action="store_true", help="end with one JSON line {pass, memory_growth, p99_ratio, ...}")
    bo.add_argument("--concurrency", type=int, help="clients sending one request after the other (default 8)")
    bo.add_argument("--replicas", type=int, help="engine replicas, autoscaling min = max (default 2)")
    bo.add_argument("--max-tokens", type=int, help="tokens per request at most (default 300)")
    bo.add_argument("--sample-s", type=float, help="memory / telemetry sampling interval (default T/60 in [0.5, 5] s)")
    bo.add_argument("--telemetry-segment-bytes", type=int, help="the app's telemetry segment cap (default 16384)")
    bo.add_argument("--num-cpus", type=int, help="logical CPUs of the local Ray cluster (default 8)")
    bo.add_argument("--kinds", help="comma-separated subset of the traffic kinds (default all, serve_app/soak.py)")
    bo.add_argument("--output", help="also write the JSON (indented, with command, commit, machine, date) here")
    bo.set_defaults(func=cmd_bench_soak)

    lw = sub.add_parser("long-writer", help="the built-in teacher that writes 16K+ checkable tokens").add_subparsers(
        dest="long_writer_cmd", required=True
    )
    lb = lw.add_parser(
        "build",
        help="train it from scratch (fixed seeds, ~40 min on 2 cores): PoSE windows, then sliding-window stages",
    )
    lb.add_argument("--out", help="output folder (default: the shipped one)")
    lb.add_argument(
        "--config", help="one stage's recipe JSON, or a shipped build_config.json (default: all the shipped stages)"
    )
    lb.add_argument("--steps", type=int, help="override the stage's number of training steps (with --config)")
    lb.add_argument("--init-from", help="continue from this built folder (with --config)")
    lb.set_defaults(func=cmd_long_writer_build)
    from specexit_core.teachers.long_writer_drafters import LongWriterDraftConfig, LongWriterHeadsConfig

    lh = lw.add_parser("heads", help="train its TokenSwift draft heads on its own continuations (target frozen)")
    lh.add_argument("--out", help="output folder (default: the shipped heads folder)")
    add_config_options(lh, LongWriterHeadsConfig)
    lh.set_defaults(func=cmd_long_writer_heads)
    ld = lw.add_parser("draft", help="train its EAGLE-3 draft (vLLM's eagle3 / long-mode rows) on its own walks")
    ld.add_argument("--out", help="output folder (default: the shipped draft folder)")
    add_config_options(ld, LongWriterDraftConfig)
    ld.set_defaults(func=cmd_long_writer_draft)
    lc = lw.add_parser("check", help="greedy outputs of --length tokens on test prompts, every step scored")
    lc.add_argument("--model", help="model folder (default: the shipped one)")
    lc.add_argument("--length", type=int, default=16384)
    lc.add_argument("--prompts", type=int, default=3)
    lc.add_argument("--seed", type=int, default=0)
    lc.add_argument("--threads", type=int, default=1)
    lc.add_argument("--engine", choices=["target", "vllm"], default="target")
    lc.add_argument("--json", action="store_true")
    lc.add_argument("--output", help="also write the raw JSON (with command, commit, machine, date) here")
    lc.add_argument("--record", action="store_true", help="add the per-bucket results to the model's build_config.json")
    lc.set_defaults(func=cmd_long_writer_check)

    ca = sub.add_parser("calibrate", help="pick exit thresholds on a dev split (fastest within an accuracy tolerance)")
    ca.add_argument("--config", default="examples/toy/calibrate.yaml", help="CalibrateConfig YAML")
    ca.add_argument("--output", help="calibrated JSON (default: the config's output)")
    ca.add_argument("--n", type=int, help="number of dev problems (default: the config's)")
    ca.add_argument(
        "--prompts",
        metavar="FILE",
        help="calibrate on your own prompts (JSONL or Parquet, no answers): the certified exit under the "
        "gold-free disagreement loss; dev traces go to <output>-dev/",
    )
    ca.add_argument("--prompt-column", help="the prompts' column (default: prompt; with --prompts)")
    # the sampling the deployment serves with: each temperature is a sampling profile with its own exit
    ca.add_argument(
        "--temperatures",
        metavar="T,...",
        help="temperatures to calibrate at, greedy first, e.g. 0,0.6 (default: the config's)",
    )
    ca.add_argument("--top-p", type=float, help="nucleus top-p of every sampled request (default: the config's)")
    ca.add_argument("--top-k", type=int, help="top-k of every sampled request, 0 = off (default: the config's)")
    ca.add_argument(
        "--serve-config",
        metavar="FILE",
        help="a Serve config (e.g. examples/qwen3_like/serve.yaml): calibrate at the sampling it serves a "
        "request that names none with (its model's generation_config.json as vLLM applies it), greedy too; "
        "--temperatures / --top-p / --top-k given win",
    )
    ca.add_argument("--app", help="the application of --serve-config to read (default: its only one)")
    ca.add_argument(
        "--samples",
        type=int,
        metavar="K",
        help="samples per prompt at each sampled temperature; the certificate takes each prompt's mean loss "
        "(default: the config's)",
    )
    ca.add_argument("--json", action="store_true", help="print the result as one JSON line (the last line)")
    ca.set_defaults(func=cmd_calibrate)

    sg = sub.add_parser(
        "signals",
        help="how good the exit signals are on a run's traces: confidence AUROC and reliability at the "
        "probed breaks, progress / remaining error by position, the best exits the calibration grid allows",
    )
    sg.add_argument("eval_dir", help="a calibration dev run or an evaluation output (eagle3 + oracle rows)")
    sg.add_argument("--draft", required=True, help="the SpecExit draft of the run (its token ids)")
    sg.add_argument("--config", help="CalibrateConfig YAML whose grid to replay (default: the toy's)")
    sg.add_argument("--temperatures", default="0", help="comma-separated (default 0)")
    sg.add_argument("--out", help="write the JSON here")
    sg.add_argument("--json", action="store_true", help="print the result as one JSON line (the last line)")
    sg.set_defaults(func=cmd_signals)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
