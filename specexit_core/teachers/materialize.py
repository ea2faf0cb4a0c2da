"""The full checkpoint of a compactly shipped teacher: a folder transformers and vLLM load as they are.

`restricted_vocab.py` explains why the expansion is exact: the compact embedding rows go to their
ids, every other row is zero (tied embeddings, so the LM head is the same matrix). The folder gets
`config.json` (architectures ["Qwen3ForCausalLM"], the full vocabulary), `model.safetensors`
(bf16, as shipped), `generation_config.json` and the tokenizer files. A folder already made from
the same shipped weights is reused (`source.json` holds their sha256).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from specexit_core.teachers import qwen3_like as q3
from specexit_core.teachers.qwen3_like_build import (
    BUILD_CONFIG,
    COMPACT_WEIGHTS,
    TEACHER_META,
    Qwen3LikeBuildConfig,
    hf_config,
)
from specexit_core.teachers.restricted_vocab import RestrictedVocab

SOURCE_FILE = "source.json"
CACHE_ENV = "SPECEXIT_TEACHERS_DIR"  # where materialised teachers go (default ~/.cache/specexit/teachers)


def default_dir(name: str = q3.NAME) -> Path:
    root = (
        os.environ.get(CACHE_ENV)
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specexit" / "teachers"
    )
    return Path(root) / name


def load_vocab(assets: Path) -> RestrictedVocab:
    meta = json.loads((assets / TEACHER_META).read_text())
    return RestrictedVocab(tuple(meta["used_ids"]), int(meta["full_vocab_size"]))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def materialize(assets: Path = q3.ASSETS_DIR, out: Path | None = None, *, force: bool = False) -> Path:
    """Expand the compact teacher in `assets` into `out` (default: `default_dir()`); returns `out`."""
    from safetensors.torch import load_file, save_file
    from transformers import GenerationConfig

    assets = Path(assets)
    out = Path(out) if out is not None else default_dir()
    source = {"weights_sha256": _sha256(assets / COMPACT_WEIGHTS), "tokenizer": str(q3.TOKENIZER_DIR.name)}
    if not force and (out / SOURCE_FILE).exists() and json.loads((out / SOURCE_FILE).read_text()) == source:
        return out
    vocab = load_vocab(assets)
    cfg = Qwen3LikeBuildConfig.from_json(json.loads((assets / BUILD_CONFIG).read_text()))
    tok = q3.load_tokenizer()
    compact = load_file(str(assets / COMPACT_WEIGHTS))
    full = dict(compact)
    full["model.embed_tokens.weight"] = vocab.expand_rows(compact["model.embed_tokens.weight"])
    out.mkdir(parents=True, exist_ok=True)
    save_file(full, str(out / "model.safetensors"), metadata={"format": "pt"})
    hcfg = hf_config(cfg.arch, tok)
    hcfg.dtype = "bfloat16"
    hcfg.save_pretrained(out)
    GenerationConfig(
        bos_token_id=hcfg.bos_token_id, eos_token_id=hcfg.eos_token_id, pad_token_id=hcfg.pad_token_id, do_sample=False
    ).save_pretrained(out)
    for f in q3.TOKENIZER_DIR.glob("*.json"):
        shutil.copyfile(f, out / f.name)
    (out / SOURCE_FILE).write_text(json.dumps(source) + "\n")
    return out
