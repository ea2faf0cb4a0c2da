"""Ray Serve LLM's per-node model download is skipped only when it would do nothing
(serve_app/ray_llm.py `node_init_is_noop`): it costs a worker process importing torch and vLLM per
replica start. Anything it would fetch (a mirror, an s3:// or gs:// source) or a user's callback keeps it."""

import pytest
from ray.llm._internal.common.callbacks.base import CallbackBase
from ray.serve.llm import LLMConfig

from serve_app.ray_llm import node_init_is_noop


class _UserCallback(CallbackBase):
    pass


def _cfg(source, **kw) -> LLMConfig:
    return LLMConfig(model_loading_config={"model_id": "m", "model_source": source}, **kw)


@pytest.mark.parametrize("source", ["/models/qwen3", "Qwen/Qwen3-8B"])
def test_a_local_folder_or_hub_id_without_mirror_needs_no_node_init(source):
    assert node_init_is_noop(_cfg(source))


@pytest.mark.parametrize("source", ["s3://bucket/qwen3", "gs://bucket/qwen3", {"bucket_uri": "s3://bucket/qwen3"}])
def test_a_remote_source_or_mirror_keeps_the_download(source):
    assert not node_init_is_noop(_cfg(source))


def test_a_users_callback_keeps_it():
    assert not node_init_is_noop(_cfg("/models/qwen3", callback_config={"callback_class": _UserCallback}))
    dotted = f"{CallbackBase.__module__}.CallbackBase"  # named by string: counted as the user's
    assert not node_init_is_noop(_cfg("/models/qwen3", callback_config={"callback_class": dotted}))
