"""The full checkpoint of a compactly shipped teacher: a folder transformers and vLLM load as they are.

`restricted_vocab.py` explains why the expansion is exact: the compact embedding rows go to their
ids, every other row is zero (tied embeddings, so the LM head is the same matrix). The folder gets
`config.json` (the teacher's architecture, e.g. ["Qwen3ForCausalLM"], and its full vocabulary),
`model.safetensors` (bf16, as shipped), `generation_config.json` and the tokenizer files. A folder
already made from the same shipped weights is reused (`source.json` holds their sha256).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from specexit_core.teachers.build import BUILD_CONFIG, COMPACT_WEIGHTS, TEACHER_META, hf_config, load_build_config
from specexit_core.teachers.registry import get_teacher
from specexit_core.teachers.restricted_vocab import RestrictedVocab
from specexit_core.teachers.spec import TeacherSpec

SOURCE_FILE = "source.json"
CACHE_ENV = "SPECEXIT_TEACHERS_DIR"  # where materialised teachers go (default ~/.cache/specexit/teachers)


def default_dir(name: str = "qwen3-like") -> Path:
    """`$SPECEXIT_TEACHERS_DIR/NAME`, else `~/.cache/specexit/teachers/NAME`."""
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


def _source(spec: TeacherSpec, assets: Path) -> dict:
    """What a materialised folder was made from (kept in its `source.json`)."""
    return {"weights_sha256": _sha256(assets / COMPACT_WEIGHTS), "tokenizer": str(spec.tokenizer_dir.name)}


def is_up_to_date(spec: TeacherSpec, out: Path, assets: Path | None = None) -> bool:
    """`out` is a whole folder made from the compact weights in `assets` (default: the shipped ones)."""
    marker = Path(out) / SOURCE_FILE
    if not (marker.exists() and (Path(out) / "config.json").exists()):
        return False
    return json.loads(marker.read_text()) == _source(spec, Path(assets) if assets is not None else spec.assets_dir)


def materialize(
    teacher: TeacherSpec | str = "qwen3-like",
    assets: Path | None = None,
    out: Path | None = None,
    *,
    force: bool = False,
) -> Path:
    """Expand the compact `teacher` in `assets` (default: its shipped folder) into `out` (default:
    `default_dir(name)`); returns `out`."""
    from safetensors.torch import load_file, save_file
    from transformers import GenerationConfig

    spec = get_teacher(teacher) if isinstance(teacher, str) else teacher
    assets = Path(assets) if assets is not None else spec.assets_dir
    out = Path(out) if out is not None else default_dir(spec.name)
    source = _source(spec, assets)
    if not force and is_up_to_date(spec, out, assets):
        return out
    vocab = load_vocab(assets)
    if vocab.full_size != spec.full_vocab_size:
        raise ValueError(f"{assets} holds a {vocab.full_size}-row teacher, not {spec.name} ({spec.full_vocab_size})")
    cfg = load_build_config(spec, json.loads((assets / BUILD_CONFIG).read_text()))
    tok = spec.load_tokenizer()
    compact = load_file(str(assets / COMPACT_WEIGHTS))
    full = dict(compact)
    full["model.embed_tokens.weight"] = vocab.expand_rows(compact["model.embed_tokens.weight"])
    out.mkdir(parents=True, exist_ok=True)
    save_file(full, str(out / "model.safetensors"), metadata={"format": "pt"})
    hcfg = hf_config(spec, cfg.arch, tok)
    hcfg.dtype = "bfloat16"
    hcfg.save_pretrained(out)
    GenerationConfig(
        bos_token_id=hcfg.bos_token_id, eos_token_id=hcfg.eos_token_id, pad_token_id=hcfg.pad_token_id, do_sample=False
    ).save_pretrained(out)
    for f in spec.tokenizer_dir.glob("*.json"):
        shutil.copyfile(f, out / f.name)
    (out / SOURCE_FILE).write_text(json.dumps(source) + "\n")
    return out
