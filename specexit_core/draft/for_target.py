"""What a published EAGLE-3 head needs from its target to become a deployable SpecExit draft.

A head names its target only implicitly (vocab and hidden sizes). Two facts come from the target
folder: its decoder layer count (the aux layers vLLM feeds a head whose config names none, see
`vllm_default_aux_layer_ids`) and, from its tokenizer, the token ids the exit needs
(`specexit.token_ids`: think_start, think_end, split), without which the vLLM plugin refuses to load
the draft. `specexit draft convert` is `convert_for_target`.
"""

from __future__ import annotations

import json
from pathlib import Path

from specexit_core.draft.checkpoint import convert
from specexit_core.draft.config import DraftConfig, aux_layer_ids_in, read_specexit_fields
from specexit_core.draft.formats import FLAT
from specexit_core.exit.split_tokens import single_token_id, split_token_ids

THINK_START, THINK_END = "<think>", "</think>"


def target_num_layers(target: str | Path) -> int:
    """Decoder layers of the target model (its `config.json`; the text model's for a multimodal one)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(target))
    return int(cfg.get_text_config().num_hidden_layers)


def layers_for_head(head: str | Path, target: str | Path | None) -> int | None:
    """The target's layer count if the head at `head` names no aux layers (then it is needed), else None."""
    if aux_layer_ids_in(json.loads((Path(head) / "config.json").read_text())) is not None or target is None:
        return None
    return target_num_layers(target)


def exit_token_ids(
    tokenizer, *, think_start: str = THINK_START, think_end: str = THINK_END, split_tokens: list[str] | None = None
) -> dict:
    """`specexit.token_ids` from the target's tokenizer: the think markers (each one token) and the
    paragraph-break tokens (`split_token_ids`: every blank-line token unless `split_tokens` names them)."""
    return {
        "think_start": single_token_id(tokenizer, think_start, "think_start"),
        "think_end": single_token_id(tokenizer, think_end, "think_end"),
        "split": list(split_token_ids(tokenizer, split_tokens)),
    }


def convert_for_target(
    src: str | Path,
    dst: str | Path,
    *,
    add_signals: bool,
    target: str | Path | None = None,
    token_ids: dict | None = None,
    think_start: str = THINK_START,
    think_end: str = THINK_END,
    split_tokens: list[str] | None = None,
    fmt: str = FLAT,
) -> Path:
    """`convert` with the target's facts filled in. Adding signals needs token ids: `token_ids` as
    given, else those `src` already carries, else the target tokenizer's (`target`); none of these
    is an error, since the result could not be served. In the speculators layout (`fmt`) the target
    is the verifier `vllm serve DST` serves."""
    layers = layers_for_head(src, target)
    src_json = json.loads((Path(src) / "config.json").read_text())
    # a head we cannot use (e.g. no aux layers for a target under 7 layers) is refused before the
    # target's tokenizer is read (a 152k-token vocabulary scan for the split ids)
    DraftConfig.from_hf_json(src_json, target_num_layers=layers)
    if add_signals and token_ids is None:
        carried = read_specexit_fields(src_json).token_ids
        if carried is None:
            if target is None:
                raise ValueError(
                    "--add-signals needs the exit's token ids: give --target TARGET_DIR (its tokenizer has "
                    'them) or --token-ids \'{"think_start": ID, "think_end": ID, "split": [IDS]}\''
                )
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(target))
            token_ids = exit_token_ids(tok, think_start=think_start, think_end=think_end, split_tokens=split_tokens)
    verifier = verifier_archs = None
    if target is not None:
        verifier = str(Path(target).resolve())
        verifier_archs = json.loads((Path(target) / "config.json").read_text()).get("architectures")
    return convert(
        src,
        dst,
        add_signals=add_signals,
        token_ids=token_ids,
        target_num_layers=layers,
        fmt=fmt,
        verifier=verifier,
        verifier_architectures=verifier_archs,
    )
