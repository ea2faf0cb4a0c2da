"""Architecture configs of the hub targets the shipped GPU recipes name, so their memory estimate and
the GPU probe's randomly initialised target need no download (values from each model's
`config.json` on the Hugging Face hub; only shapes matter here)."""

from __future__ import annotations

KNOWN_TARGETS: dict[str, dict] = {
    "Qwen/Qwen3-4B-Thinking-2507": dict(
        model_type="qwen3",
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0},
    ),
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
}


def target_config(name_or_path: str):
    """A transformers config: from the table for the names above, else `AutoConfig.from_pretrained`
    (a local folder, or the hub cache)."""
    from transformers import AutoConfig

    if name_or_path in KNOWN_TARGETS:
        cfg = dict(KNOWN_TARGETS[name_or_path])
        return AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    return AutoConfig.from_pretrained(name_or_path)
