"""The one place the Serve app reaches into Ray's private modules (`ray.llm._internal`,
`ray.serve._private`, `ray._common`).

Read against Ray 2.60.0 (the version pinned in pyproject.toml and cluster/Dockerfile). These names
have no public equivalent there, and private modules move between Ray releases: on a Ray upgrade,
check this file first (and the private methods the subclasses override, listed below).

Public Ray Serve LLM API the app uses directly (not here): `ray.serve.llm` (`LLMConfig`,
`build_llm_deployment`), `ray.serve.llm.ingress` (`OpenAiIngress`, `make_fastapi_ingress`),
`ray.serve.llm.deployment` (`LLMServer`).

Why each private name is needed:
* `init_fastapi` (`core.ingress.ingress.init`): the FastAPI app stock Serve LLM builds (metrics
  lifespan, exception, CORS, request-id middleware). `build_openai_app` creates it internally and
  offers no hook; the app needs it in hand to add the API-key middleware (serve_app/app.py) before
  `make_fastapi_ingress` mounts the routes.
* `to_model_metadata` (`core.configs.openai_api_models`): the model cards `/v1/models` lists, built
  exactly as `build_openai_app` builds them.
* `ErrorResponse` (`core.configs.openai_api_models`): the class of the error chunks the engine
  replica yields. The public `ray.serve.llm.openai_api_models.ErrorResponse` is a subclass, so an
  `isinstance` check against it misses them (serve_app/ingress.py).
* `NON_STREAMING_RESPONSE_TYPES`, `openai_json_wrapper` (`_openai_json_wrapper`),
  `peek_at_generator` (`_peek_at_generator`) (`core.ingress.utils`): the stock response framing
  that `SpecExitIngress._process_llm_request` reuses; it overrides that private method of
  `OpenAiIngress` (and calls its `_get_response`) to add overload, failure and deadline answers.
  It also overrides `OpenAiIngress._get_configured_serve_handle` (wrapping the handle it returns) to
  keep each engine-replica call, so that a deadline can cancel it.
* `sanitize_messages` (`core.ingress.utils._sanitize_chat_completion_request`): turns the lazy
  `content` iterators pydantic leaves in parsed messages into lists, so the request can be pickled
  to the engine replica. Stock applies it to chat requests only; an embeddings request with
  `messages` then fails to pickle in the ingress (a 500, found by the fuzzer), so
  `SpecExitIngress._get_response` applies it to every request that has messages.
* `VLLMEngine` (`engines.vllm.vllm_engine`): the engine class `LLMServer` runs; SpecExitVLLMEngine
  wraps its `chat` / `completions` for `usage.specexit` and uses its `_engine_client`
  (serve_app/engine.py). `LLMServer._default_engine_cls` is how the replica picks it.
* `CallbackBase` (`ray.llm._internal.common.callbacks.base`), `is_remote_path`
  (`ray.llm._internal.common.utils.cloud_utils`): `VLLMEngine.start` first runs a Ray task on every
  node of the replica's placement group to "download" the model; with no mirror config and a model
  that is not an `s3://`/`gs://` path that task returns the model id unchanged, yet it starts a worker
  process that imports torch and vLLM (7.8 s of a toy replica's 27.7 s start on 2 idle cores: docs/testing.md).
  `node_init_is_noop` / `skip_noop_node_init` (below) turn it off in exactly that case, and only
  under the stock callback.
* `import_attr` (`ray._common.utils`), `call_user_app_builder_with_args_if_necessary`
  (`ray.serve._private.api`), `build_app` (`ray.serve._private.build_app`): what `serve run` /
  `serve deploy` / KubeRay do with one `applications` entry (import the builder, call it with its
  `args`, flatten the application), in `build_like_serve_run`; the KubeRay test builds
  serveConfigV2 this way, without a cluster. Imported on call: the app itself never needs them.
* The controller's `get_serve_instance_details` (what `serve status` shows), `RequestMetadata`
  (`ray.serve._private.common`) and a replica actor's `handle_request` (what `ray.llm`'s `broadcast`
  sends): `call_every_replica` calls a method on every running replica of a deployment (per-replica
  `specexit_stats`, e.g. where prefix routing sent requests; a handle call reaches one replica of the
  router's choosing). Imported on call. It uses no handle: the routed handle call it made first (for
  `broadcast`'s sake) once waited forever in a CI run (the node-loss drill, under load), every replica
  alive and the router's event loop idle; the cause inside Ray was not found.
"""

from __future__ import annotations

from ray.llm._internal.common.callbacks.base import CallbackBase
from ray.llm._internal.common.utils.cloud_utils import is_remote_path
from ray.llm._internal.serve.core.configs.openai_api_models import ErrorResponse, to_model_metadata
from ray.llm._internal.serve.core.ingress.ingress import init as init_fastapi
from ray.llm._internal.serve.core.ingress.utils import NON_STREAMING_RESPONSE_TYPES
from ray.llm._internal.serve.core.ingress.utils import _openai_json_wrapper as openai_json_wrapper
from ray.llm._internal.serve.core.ingress.utils import _peek_at_generator as peek_at_generator
from ray.llm._internal.serve.core.ingress.utils import _sanitize_chat_completion_request as sanitize_messages
from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine

RAY_VERSION_READ = "2.60.0"

__all__ = [
    "ErrorResponse",
    "NON_STREAMING_RESPONSE_TYPES",
    "RAY_VERSION_READ",
    "VLLMEngine",
    "build_like_serve_run",
    "call_every_replica",
    "init_fastapi",
    "node_init_is_noop",
    "openai_json_wrapper",
    "peek_at_generator",
    "sanitize_messages",
    "skip_noop_node_init",
    "to_model_metadata",
]


def node_init_is_noop(llm_config) -> bool:
    """Whether `VLLMEngine.start`'s per-node model download would do nothing: no `mirror_config`, a
    model id that is not a remote (`s3://`, `gs://`) path, and the stock callback (a user's callback
    may act in its download hooks; a class named by string counts as the user's)."""
    engine_config = llm_config.get_engine_config()
    if engine_config.mirror_config is not None or is_remote_path(engine_config.actual_hf_model_id):
        return False
    return llm_config.callback_config.callback_class is CallbackBase


def skip_noop_node_init(llm_config) -> bool:
    """Turn that download off when it would do nothing (`node_init_is_noop`); returns whether it did.
    Call inside the replica: creating the callback creates the replica's placement group context."""
    if not node_init_is_noop(llm_config):
        return False
    llm_config.get_or_create_callback().ctx.run_init_node = False
    import os

    import torch

    # the one side effect the skipped task has besides returning the id (a torch workaround there)
    os.makedirs(os.path.join(torch.hub._get_torch_home(), "kernels"), exist_ok=True)
    return True


def build_like_serve_run(app_cfg: dict):
    """What `serve run` / `serve deploy` / KubeRay do with one `applications` entry (`import_path`,
    `args`, `name`): import the builder, call it with `args` (the app's typed validation runs here)
    and flatten the application into its deployments (`BuiltApplication`). No cluster needed."""
    from ray._common.utils import import_attr
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve._private.build_app import build_app as build_serve_app

    app = call_user_app_builder_with_args_if_necessary(import_attr(app_cfg["import_path"]), app_cfg.get("args"))
    return build_serve_app(app, name=app_cfg["name"])


def call_every_replica(deployment: str, app: str, method: str, timeout_s: float = 60) -> list:
    """`method()` of every running replica of one deployment of a running Serve app, one answer per
    replica (as Ray Serve LLM's `broadcast`), within `timeout_s` (`ray.exceptions.GetTimeoutError` past
    it). Running: as the Serve controller lists them (`serve status`); a replica lost with its node a
    moment ago may still be listed, and its call fails (`RayActorError`). Needs `ray.init` to that
    cluster."""
    import pickle
    import uuid

    import ray
    from ray.serve._private.common import RequestMetadata
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    details = ray.get(controller.get_serve_instance_details.remote(), timeout=timeout_s)
    replicas = details["applications"][app]["deployments"][deployment]["replicas"]
    refs = []
    for name in [r["actor_name"] for r in replicas if r["state"] == "RUNNING"]:
        try:
            actor = ray.get_actor(name, namespace=SERVE_NAMESPACE)
        except ValueError:  # gone since it was listed
            continue
        request_id = f"call-every-replica-{uuid.uuid4()}"
        meta = RequestMetadata(request_id=request_id, internal_request_id=request_id, call_method=method)
        refs.append(actor.handle_request.remote(pickle.dumps(meta)))
    return ray.get(refs, timeout=timeout_s)
