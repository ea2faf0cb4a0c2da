"""Where prompts come from (the traces job's input and the evaluation's problem set): `InputConfig`
and its readers -- the toy generator, JSONL, Parquet, Hugging Face datasets.

Ray Data reads the source; the (small) prompt table then comes back to the driver in input order so
each row gets a stable id (the `id_column` when the data has one, else `row-<index>`), which is what
makes a resubmitted job skip exactly the rows it already wrote. Rows that cannot be prompted
(missing / non-string / empty prompt, unparsable JSON, duplicate id) are kept with an `error`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_serializer, model_validator

from pipelines.common.ray_parquet import read_parquet
from specexit_core.toy.shifts import Shift
from specexit_core.typed_config import ConfigError, StrictModel, resolve_path

log = logging.getLogger("specexit.pipelines")

_MISSING = object()
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _toy_rows(cfg: InputConfig, n: int) -> list[dict]:
    from specexit_core.toy.shifts import shifted_problems
    from specexit_core.toy.task import problems

    if cfg.shift is None:
        probs = problems(cfg.split, n, seed=cfg.seed)  # type: ignore[arg-type]
    else:
        probs = shifted_problems(cfg.shift, cfg.split, n, seed=cfg.seed)  # type: ignore[arg-type, assignment]
    # a shifted problem's id names its shift: the same arithmetic asked another way is another row
    tag = cfg.split if cfg.shift is None else f"{cfg.split}-{cfg.shift}"
    return [{"id": f"toy-{tag}-{p.uid}", "prompt": p.prompt, "gold": str(p.answer)} for p in probs]


def read_dataset(cfg: InputConfig, limit: int | None):
    """The source as a Ray Dataset of raw records (JSONL: one `text` column of raw lines)."""
    import ray

    if cfg.kind == "toy":
        n = min(cfg.n, limit) if limit else cfg.n
        return ray.data.from_items(_toy_rows(cfg, n))
    if cfg.kind == "jsonl":
        # Read raw lines, parse later: Arrow's JSON reader fails the whole file on one row whose
        # prompt has another type, and such rows must become error rows instead.
        return ray.data.read_text(cfg.path)
    if cfg.kind == "parquet":
        return read_parquet(cfg.path)
    import datasets

    if cfg.kind == "hf_disk":
        hf = datasets.load_from_disk(cfg.path)
    else:
        hf = datasets.load_dataset(cfg.path, cfg.hf_config_name, split=cfg.split)
    if isinstance(hf, datasets.DatasetDict):
        hf = hf[cfg.split]
    return ray.data.from_huggingface(hf)


def _py(v: Any) -> Any:
    """numpy scalars / arrays from Ray rows -> plain Python."""
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def normalize(rec: dict, index: int, cfg: InputConfig) -> dict:
    """One raw record -> {id, prompt, gold, error}."""
    if cfg.kind == "jsonl":
        try:
            rec = json.loads(rec["text"])
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            return {"id": f"row-{index:08d}", "prompt": None, "gold": None, "error": f"invalid JSON line: {e}"}
    rec = {k: _py(v) for k, v in rec.items()}
    rid = rec.get(cfg.id_column) if cfg.id_column else None
    rid = f"row-{index:08d}" if rid is None or rid == "" else str(rid)
    prompt = rec.get(cfg.prompt_column, _MISSING)
    gold_col = cfg.gold_column or ("gold" if cfg.kind == "toy" else None)
    gold = rec.get(gold_col) if gold_col else None
    error = None
    if prompt is _MISSING:
        error, prompt = f"no {cfg.prompt_column!r} field", None
    elif not isinstance(prompt, str):
        error, prompt = f"prompt is not a string ({type(prompt).__name__})", None
    elif not prompt.strip():
        error = "empty prompt"
    elif cfg.choices_column:
        choices = rec.get(cfg.choices_column)
        if not isinstance(choices, list) or not choices:
            error = f"{cfg.choices_column!r} is not a non-empty list"
        else:
            prompt = prompt + "\n" + "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
    return {"id": rid, "prompt": prompt, "gold": None if gold is None else str(gold), "error": error}


def dedupe_ids(rows: list[dict]) -> list[dict]:
    """A repeated id becomes `<id>#dup<k>` with an error, so every output id is unique and each
    input row still yields exactly one output row."""
    seen: dict[str, int] = {}
    for r in rows:
        k = seen.get(r["id"], 0)
        seen[r["id"]] = k + 1
        if k:
            r["error"] = r["error"] or f"duplicate id {r['id']!r} in the input"
            r["id"] = f"{r['id']}#dup{k}"
    return rows


def read_prompts(cfg: InputConfig, limit: int | None) -> list[dict]:
    """First `limit` rows of the source, normalized, in input order, ids unique."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    old = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True  # row index -> id must not depend on scheduling
    try:
        ds = read_dataset(cfg, limit)
        if limit:
            ds = ds.limit(limit)
        raw = ds.take_all()
    finally:
        ctx.execution_options.preserve_order = old
    rows = dedupe_ids([normalize(r, i, cfg) for i, r in enumerate(raw)])
    log.info(
        "read %d prompts (%d invalid) from %s",
        len(rows),
        sum(r["error"] is not None for r in rows),
        cfg.path or f"toy:{cfg.split}",
    )
    return rows


class InputConfig(StrictModel):
    """Where prompts come from (traces stage)."""

    kind: Literal["toy", "jsonl", "parquet", "hf_disk", "hf_hub"] = "toy"
    path: str | None = None  # file / folder / glob (jsonl, parquet), folder (hf_disk), dataset name (hf_hub)
    split: str = "train"  # toy split or HF split
    hf_config_name: str | None = None  # HF hub dataset config, e.g. "main" for gsm8k
    n: int = Field(256, ge=1)  # toy: number of problems
    seed: int = 0  # toy: problem stream seed
    id_column: str | None = "id"  # used when the data has it; otherwise ids are row-<index>
    prompt_column: str = "prompt"
    gold_column: str | None = None  # gold answer column (toy: always filled)
    choices_column: str | None = None  # multiple choice: list of options, appended as "A. ..."
    # toy only: a shifted test set (specexit_core/toy/shifts.py), e.g. longer chains than training
    shift: Shift | None = None

    @model_validator(mode="after")
    def _need_path(self):
        if self.kind != "toy" and not self.path:
            raise ValueError(f"input.kind={self.kind!r} needs input.path")
        if self.shift is not None and self.kind != "toy":
            raise ValueError(f"input.shift={self.shift!r} is a toy test set; input.kind is {self.kind!r}")
        if self.shift is not None and self.split not in ("train", "dev", "test"):
            raise ValueError(f"input.shift needs a toy split (train, dev, test), got {self.split!r}")
        return self

    @model_serializer(mode="wrap")
    def _omit_no_shift(self, handler):
        # Without a shift the dump is what it was before `shift` existed, so the run identity
        # (the run identity file) of outputs written then still matches and they can be resumed.
        d = handler(self)
        if self.shift is None:
            d.pop("shift", None)
        return d

    def resolve_paths(self) -> InputConfig:
        if self.path and self.kind != "hf_hub":  # an hf_hub path is a dataset name
            self.path = resolve_path(self.path)
        return self


def input_overrides(path: str | None) -> dict[str, str]:
    """`--input PATH` as `load_config` overrides: the path, and the reader its name implies."""
    return {} if path is None else {"input.path": path, "input.kind": infer_input_kind(path)}


def infer_input_kind(path: str) -> str:
    """`--input` for the traces stage: pick the reader from the path."""
    p = Path(resolve_path(path))
    if p.suffix in (".jsonl", ".json") or p.name.endswith(".jsonl.gz"):
        return "jsonl"
    if p.suffix == ".parquet":
        return "parquet"
    if p.is_dir():
        if (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            return "hf_disk"
        if any(p.glob("*.parquet")):
            return "parquet"
        if any(p.glob("*.jsonl")):
            return "jsonl"
    raise ConfigError(f"cannot tell the input kind of {path!r}; set input.kind in the config")
