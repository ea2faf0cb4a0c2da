"""Typed config of the draft, and its mapping to/from the `config.json` vLLM's Eagle3 drafter reads."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

from specexit_core.draft.formats import flat_config
from specexit_core.exit import SIGNALS, ExitConfig
from specexit_core.signals import ACTIVATIONS

# vLLM picks the drafter class by this name; the SpecExit plugin registers its own classes (a name
# must start or end with "Eagle3", or vLLM renames it).
STOCK_ARCH = "LlamaForCausalLMEagle3"
SPECEXIT_ARCH = "SpecExitLlamaForCausalLMEagle3"
STOCK_QWEN3_ARCH = "Eagle3Qwen3ForCausalLM"
SPECEXIT_QWEN3_ARCH = "SpecExitQwen3ForCausalLMEagle3"
# The draft's decoder layer -> (the stock architecture we write, the SpecExit one). "llama": vLLM's
# `llama_eagle3.Eagle3LlamaForCausalLM` (the EAGLE-3 paper's layer); "qwen3": `qwen3_eagle3.
# Eagle3Qwen3ForCausalLM` (Qwen3's layer: per-head RMSNorm of q and k before RoPE).
ARCHES = {"llama": (STOCK_ARCH, SPECEXIT_ARCH), "qwen3": (STOCK_QWEN3_ARCH, SPECEXIT_QWEN3_ARCH)}
LAYERS = tuple(ARCHES)
SPECEXIT_ARCHES = frozenset(spec for _, spec in ARCHES.values())
# Names published heads carry for each layer, as vLLM 0.32's model registry maps them (a plain
# "LlamaForCausalLM" becomes "Eagle3LlamaForCausalLM" in vllm/transformers_utils/configs/eagle.py, a
# "Qwen3ForCausalLM" "Eagle3Qwen3ForCausalLM"). Most Qwen3-target heads (SpecForge, AngelSlim,
# Tengyunw) have a Llama layer; vLLM's speculators reader maps `model_type: qwen3` to the Qwen3 layer.
LLAMA_LAYER_ARCHES = frozenset({STOCK_ARCH, SPECEXIT_ARCH, "Eagle3LlamaForCausalLM", "LlamaForCausalLM"})
QWEN3_LAYER_ARCHES = frozenset({STOCK_QWEN3_ARCH, SPECEXIT_QWEN3_ARCH, "Qwen3ForCausalLM"})
# The layer variants vLLM's llama/qwen3 eagle3 models honour, each a config flag (default False in the
# flat format; the speculators reader defaults norm_before_residual to True: draft/formats.py):
#   norm_before_residual: the residual is hidden_norm(h) instead of h
#   norm_before_fc: one RMSNorm over the 3 fused target layers before fc (weight `input_norm`)
#   fc_norm: an RMSNorm per fused target layer before fc (weights `fc_norm.{0,1,2}`)
#   norm_output: the hidden carried to the next draft step is the final norm's output, not its input
LAYER_OPTIONS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# Config keys that change the drafter's math in vLLM's eagle3 models that SpecExitDraft implements
# only at the value here, so another value is refused, not ignored.
_FIXED_OPTIONS = {
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "num_hidden_layers": 1,
}

log = logging.getLogger(__name__)


def vllm_default_aux_layer_ids(target_num_layers: int) -> tuple[int, int, int]:
    """The target layers vLLM 0.32 feeds an EAGLE-3 drafter whose config names none: `(2, L // 2, L - 3)`
    for a target of L decoder layers (`SupportsEagle3.get_eagle3_default_aux_hidden_state_layers` in
    vllm/model_executor/models/interfaces.py, used by `_setup_eagle3_aux_hidden_state_outputs` in
    vllm/v1/worker/gpu_model_runner.py and by vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py).
    Same index convention as `aux_layer_ids` (i = the input of target layer i)."""
    ids = (2, target_num_layers // 2, target_num_layers - 3)
    if len(set(ids)) != 3 or min(ids) < 0:  # a target under 7 layers: vLLM would repeat a layer
        raise ValueError(
            f"vLLM's default EAGLE-3 layers {ids} are invalid for a {target_num_layers}-layer target; "
            "name the layers (aux_layer_ids / eagle_aux_hidden_state_layer_ids)"
        )
    return ids


def aux_layer_ids_in(d: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The aux layer ids a draft `config.json` (either layout) names, looked up in vLLM's order (top-level
    key first, then `eagle_config`); None when it names none (vLLM then uses `vllm_default_aux_layer_ids`)."""
    d = flat_config(d)
    ids = d.get("eagle_aux_hidden_state_layer_ids") or (d.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    return tuple(int(i) for i in ids) if ids else None


def check_layer(layer: str) -> str:
    """`layer` if it is one of `LAYERS`; else ValueError naming the choices (the one home of that rule)."""
    if layer not in LAYERS:
        raise ValueError(f"layer must be one of {list(LAYERS)}, got {layer!r}")
    return layer


def draft_layer(d: Mapping[str, Any]) -> str:
    """The decoder layer a flat draft `config.json` names (`LAYERS`), from its architectures as vLLM 0.32
    maps them; any other drafter is refused, naming the key."""
    arches = set(d.get("architectures") or [STOCK_ARCH])
    for layer, names in (("llama", LLAMA_LAYER_ARCHES), ("qwen3", QWEN3_LAYER_ARCHES)):
        if arches & names:
            return layer
    raise ValueError(
        f"draft architectures {sorted(arches)}: only EAGLE-3 drafters with a Llama layer "
        f"({sorted(LLAMA_LAYER_ARCHES)}) or a Qwen3 layer ({sorted(QWEN3_LAYER_ARCHES)}) are supported"
    )


def layer_options(d: Mapping[str, Any]) -> dict[str, bool]:
    """`LAYER_OPTIONS` of a flat draft `config.json`, read where and as vLLM 0.32's eagle3 models read
    them: `norm_before_fc` from `eagle_config` first, then the top level; the others at the top level;
    absent = False."""
    eagle = d.get("eagle_config") or {}
    out = {k: bool(d.get(k) or False) for k in LAYER_OPTIONS}
    out["norm_before_fc"] = bool(eagle.get("norm_before_fc", d.get("norm_before_fc")) or False)
    return out


def check_supported_draft(d: Mapping[str, Any]) -> str:
    """Refuse draft configs SpecExitDraft (and the SpecExit drafters in vLLM) do not compute, naming the
    key: another drafter, EAGLE-1 style (no fc), biases, activations, several layers, RoPE scaling,
    sliding windows. Returns the layer (`draft_layer`)."""
    layer = draft_layer(d)
    eagle = d.get("eagle_config") or {}
    if eagle.get("use_aux_hidden_state", True) is not True:
        raise ValueError("draft eagle_config.use_aux_hidden_state is false: an EAGLE-1 style head, not EAGLE-3")
    for key, want in _FIXED_OPTIONS.items():
        got = eagle.get(key, d.get(key, want))
        if got is not None and got != want:
            raise ValueError(f"draft config {key} = {got!r}: SpecExitDraft implements only {want!r}")
    for key in ("rope_scaling", "rope_parameters"):  # transformers 4 / 5 spelling
        rope = d.get(key) or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"draft config {key} {rope!r}: SpecExitDraft implements plain RoPE only")
    if d.get("use_sliding_window") or "sliding_attention" in (d.get("layer_types") or []):
        raise ValueError("draft config use_sliding_window / layer_types: SpecExitDraft implements full attention only")
    return layer


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...]  # target hidden-state indices (0 = embeddings, i = after layer i-1)
    target_hidden_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    signals: tuple[str, ...] = SIGNALS  # () for a stock EAGLE-3 drafter
    # target-tokenizer ids the exit needs: {"think_start": id, "think_end": id, "split": [ids]}
    token_ids: dict | None = None
    # ExitConfig overrides the vLLM plugin starts from (e.g. the calibrated setting); None: the paper's
    exit_defaults: dict | None = None
    # per sampling profile (a calibrated file's `by_profile`: specexit_core/exit/profiles.py); a request
    # sampled as one of them starts from its exit instead of `exit_defaults`
    exit_profiles: dict | None = None
    # per reasoning effort level (a calibrated file's `efforts`: specexit_core/exit/efforts.py)
    exit_efforts: dict | None = None
    layer: str = "llama"  # the decoder layer (LAYERS)
    norm_before_residual: bool = False  # the layer variants (LAYER_OPTIONS)
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False

    def __post_init__(self):
        check_layer(self.layer)
        if self.token_ids is not None and set(self.token_ids) != {"think_start", "think_end", "split"}:
            raise ValueError(f"token_ids needs keys think_start, think_end, split; got {sorted(self.token_ids)}")
        if self.exit_defaults is not None:
            try:
                ExitConfig.from_dict(self.exit_defaults)
            except ValueError as e:
                raise ValueError(f"exit_defaults: {e}") from None
        if self.exit_profiles is not None:
            from specexit_core.exit.profiles import parse_profiles

            parse_profiles({"exit": {}, "by_profile": self.exit_profiles}, "exit_profiles")
        if self.exit_efforts is not None:
            from specexit_core.exit.profiles import parse_profiles

            parse_profiles({"exit": {}, "efforts": self.exit_efforts}, "exit_efforts")
        if len(self.aux_layer_ids) != 3:
            raise ValueError(f"EAGLE-3 fuses 3 target layers, got aux_layer_ids={self.aux_layer_ids}")
        if len(set(self.aux_layer_ids)) != 3 or min(self.aux_layer_ids) < 0:
            raise ValueError(f"aux_layer_ids must be 3 distinct non-negative ids, got {self.aux_layer_ids}")
        if self.signals not in ((), SIGNALS):
            raise ValueError(f"signals must be {SIGNALS} or (), got {self.signals}")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} not in 1..{self.vocab_size}")

    @property
    def n_signals(self) -> int:
        return len(self.signals)

    @property
    def fc_out(self) -> int:
        return self.hidden_size + self.n_signals

    @classmethod
    def for_target(
        cls,
        target_cfg,
        *,
        aux_layer_ids,
        draft_vocab_size,
        signals=SIGNALS,
        token_ids: dict | None = None,
        layer: str = "llama",
    ) -> DraftConfig:
        """A one-layer drafter shaped like the target (same hidden size, heads and head dim), with the
        decoder layer `layer` (LAYERS) and its options at their defaults."""
        return cls(
            layer=layer,
            hidden_size=target_cfg.hidden_size,
            num_attention_heads=target_cfg.num_attention_heads,
            num_key_value_heads=target_cfg.num_key_value_heads,
            head_dim=getattr(target_cfg, "head_dim", None) or target_cfg.hidden_size // target_cfg.num_attention_heads,
            intermediate_size=target_cfg.intermediate_size,
            vocab_size=target_cfg.vocab_size,
            draft_vocab_size=draft_vocab_size,
            aux_layer_ids=tuple(int(i) for i in aux_layer_ids),
            target_hidden_size=target_cfg.hidden_size,
            rms_norm_eps=target_cfg.rms_norm_eps,
            rope_theta=float(
                getattr(target_cfg, "rope_theta", None)
                or (getattr(target_cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
            ),
            max_position_embeddings=target_cfg.max_position_embeddings,
            signals=tuple(signals),
            token_ids=token_ids,
        )

    def to_hf_json(self) -> dict:
        """`config.json` for vLLM: a one-layer Llama with the Eagle3 fields, plus a `specexit` block."""
        stock, spec = ARCHES[self.layer]
        d = {
            "architectures": [spec if self.signals else stock],
            "model_type": self.layer,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            # vLLM's V1 runner reads the nested key, the V2 runner (GPU default) the top-level one
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                "use_aux_hidden_state": True,
            },
            # explicit, so no reader's default decides them (the speculators one differs)
            **{k: getattr(self, k) for k in LAYER_OPTIONS},
        }
        if self.signals:
            d["specexit"] = {
                "signals": list(self.signals),
                "activations": [ACTIVATIONS[s] for s in self.signals],
                "fc_signal_rows": [self.hidden_size, self.hidden_size + len(self.signals)],
            }
            if self.token_ids:
                d["specexit"]["token_ids"] = dict(self.token_ids)
            if self.exit_defaults is not None:
                d["specexit"]["exit_defaults"] = dict(self.exit_defaults)
            if self.exit_profiles is not None:
                d["specexit"]["exit_profiles"] = dict(self.exit_profiles)
            if self.exit_efforts is not None:
                d["specexit"]["exit_efforts"] = dict(self.exit_efforts)
        return d

    @classmethod
    def from_hf_json(cls, d: dict, *, target_num_layers: int | None = None) -> DraftConfig:
        """Ours or a published head's `config.json`, in either layout (draft/formats.py). Without aux
        layer ids (many published heads name none) the layers are vLLM's default for the target, so
        its layer count is needed."""
        d = flat_config(d)
        layer = check_supported_draft(d)
        for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
            if not isinstance(d.get(key), int) or d[key] < 1:
                raise ValueError(f"draft config.json {key} = {d.get(key)!r}: a positive integer is needed")
        ids = aux_layer_ids_in(d)
        if ids is None:
            if target_num_layers is None:
                raise ValueError(
                    "draft config.json names no eagle_aux_hidden_state_layer_ids: vLLM then feeds the "
                    "drafter its default target layers (2, L // 2, L - 3), so the target is needed to "
                    "know them (`specexit draft convert --target TARGET_DIR`)"
                )
            ids = vllm_default_aux_layer_ids(target_num_layers)
            log.info(
                "draft config names no aux layers: vLLM's default for a %d-layer target, %s", target_num_layers, ids
            )
        spec = read_specexit_fields(d)
        return cls(
            hidden_size=d["hidden_size"],
            num_attention_heads=d["num_attention_heads"],
            num_key_value_heads=d.get("num_key_value_heads", d["num_attention_heads"]),
            head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
            intermediate_size=d["intermediate_size"],
            vocab_size=d["vocab_size"],
            draft_vocab_size=d.get("draft_vocab_size") or d["vocab_size"],
            aux_layer_ids=ids,
            target_hidden_size=d.get("target_hidden_size") or d["hidden_size"],
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta", 10000.0),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            signals=spec.signals,
            token_ids=spec.token_ids,
            exit_defaults=spec.exit_defaults,
            exit_profiles=spec.exit_profiles,
            exit_efforts=spec.exit_efforts,
            layer=layer,
            **layer_options(d),
        )

    def to_json(self) -> dict:
        return asdict(self)

    def replace(self, **kw) -> DraftConfig:
        known = {f.name for f in fields(self)}
        bad = set(kw) - known
        if bad:
            raise ValueError(f"unknown DraftConfig fields {sorted(bad)}")
        return DraftConfig(**{**asdict(self), **kw})


class SpecExitFields(NamedTuple):
    """What a draft config says about SpecExit (its `specexit` block); empty for a stock EAGLE-3 draft."""

    signals: tuple[str, ...]
    token_ids: dict | None
    exit_defaults: dict | None
    exit_profiles: dict | None = None
    exit_efforts: dict | None = None


def read_specexit_fields(config: Mapping[str, Any] | Any) -> SpecExitFields:
    """The `specexit` block of a draft config: a `config.json` mapping, or the transformers config
    object vLLM loaded from it. The one reader of that block (`DraftConfig.from_hf_json` uses it;
    the vLLM plugin, which only has vLLM's config object, too)."""
    if isinstance(config, Mapping):
        config = flat_config(config)
    block = config.get("specexit") if isinstance(config, Mapping) else getattr(config, "specexit", None)
    block = block or {}
    return SpecExitFields(
        signals=tuple(block.get("signals", ())),
        token_ids=block.get("token_ids"),
        exit_defaults=block.get("exit_defaults"),
        exit_profiles=block.get("exit_profiles"),
        exit_efforts=block.get("exit_efforts"),
    )
