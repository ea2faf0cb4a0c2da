"""Typed config of the draft, and its mapping to/from the `config.json` vLLM's Eagle3 drafter reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

from specexit_core.exit import SIGNALS, ExitConfig
from specexit_core.signals import ACTIVATIONS

# vLLM picks the drafter class by this name; the SpecExit plugin registers its own class (the name
# must start or end with "Eagle3", or vLLM renames it).
STOCK_ARCH = "LlamaForCausalLMEagle3"
SPECEXIT_ARCH = "SpecExitLlamaForCausalLMEagle3"


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

    def __post_init__(self):
        if self.token_ids is not None and set(self.token_ids) != {"think_start", "think_end", "split"}:
            raise ValueError(f"token_ids needs keys think_start, think_end, split; got {sorted(self.token_ids)}")
        if self.exit_defaults is not None:
            try:
                ExitConfig.from_dict(self.exit_defaults)
            except ValueError as e:
                raise ValueError(f"exit_defaults: {e}") from None
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
        cls, target_cfg, *, aux_layer_ids, draft_vocab_size, signals=SIGNALS, token_ids: dict | None = None
    ) -> DraftConfig:
        """A one-layer drafter shaped like the target (same hidden size, heads and head dim)."""
        return cls(
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
        d = {
            "architectures": [SPECEXIT_ARCH if self.signals else STOCK_ARCH],
            "model_type": "llama",
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
        return d

    @classmethod
    def from_hf_json(cls, d: dict) -> DraftConfig:
        eagle = d.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") or d.get("eagle_aux_hidden_state_layer_ids")
        if not ids:
            raise ValueError("draft config.json has no eagle_aux_hidden_state_layer_ids")
        spec = read_specexit_fields(d)
        return cls(
            hidden_size=d["hidden_size"],
            num_attention_heads=d["num_attention_heads"],
            num_key_value_heads=d.get("num_key_value_heads", d["num_attention_heads"]),
            head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
            intermediate_size=d["intermediate_size"],
            vocab_size=d["vocab_size"],
            draft_vocab_size=d.get("draft_vocab_size") or d["vocab_size"],
            aux_layer_ids=tuple(ids),
            target_hidden_size=d.get("target_hidden_size", d["hidden_size"]),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta", 10000.0),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            signals=spec.signals,
            token_ids=spec.token_ids,
            exit_defaults=spec.exit_defaults,
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


def read_specexit_fields(config: Mapping[str, Any] | Any) -> SpecExitFields:
    """The `specexit` block of a draft config: a `config.json` mapping, or the transformers config
    object vLLM loaded from it. The one reader of that block (`DraftConfig.from_hf_json` uses it;
    the vLLM plugin, which only has vLLM's config object, too)."""
    block = config.get("specexit") if isinstance(config, Mapping) else getattr(config, "specexit", None)
    block = block or {}
    return SpecExitFields(
        signals=tuple(block.get("signals", ())),
        token_ids=block.get("token_ids"),
        exit_defaults=block.get("exit_defaults"),
    )
