"""Routing and cache counters of the Serve app, without Ray or an engine: the `routing` args become the
engine deployment's request router, every shipped multi-replica config routes by prefix, the router finds
the prompt text of the requests the ingress sends (and routes the ones without text instead of looping),
and the prefix-cache / preemption counters count vLLM's scheduler statistics. The real thing:
tests/integration/test_serve_prefix_routing.py."""

import asyncio
import types

import pytest
import yaml

from serve_app.config import load_args
from specexit_core.typed_config import ConfigError
from support.paths import REPO_ROOT

TOY = {"model": {"id": "m", "source": "toy:teacher", "draft": "toy:draft", "accelerator": "cpu"}}
PREFIX = {"policy": "prefix_aware", "imbalanced_threshold": 8, "match_rate_threshold": 0.2}


@pytest.fixture
def no_runtime_context(monkeypatch):
    """ray.llm's get_deployment_options reads the driver's runtime env, which would start Ray."""
    import ray

    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(runtime_env={}))


# -- config -> deployment --------------------------------------------------------------------------------
def test_default_keeps_serves_router():
    from serve_app.app import llm_config

    a = load_args(TOY)
    assert a.routing.policy == "power_of_two" and a.routing.router_kwargs() == {}
    assert "request_router_config" not in llm_config(a).deployment_config


def test_prefix_aware_becomes_the_engine_deployments_request_router(no_runtime_context):
    from serve_app.app import llm_config
    from serve_app.ray_llm import build_like_serve_run
    from serve_app.routing import ROUTER_PATH, SpecExitPrefixRouter

    args = {**TOY, "routing": PREFIX, "autoscaling": {"min_replicas": 2, "max_replicas": 2}}
    rrc = llm_config(load_args(args)).deployment_config["request_router_config"]
    assert rrc == {
        "request_router_class": ROUTER_PATH,
        "request_router_kwargs": {"imbalanced_threshold": 8, "match_rate_threshold": 0.2},
    }
    # as `serve run` builds it: Ray's RequestRouterConfig, the class importable and a prefix router
    built = build_like_serve_run({"name": "t", "import_path": "serve_app.app:build_app", "args": args})
    routers = {d.name: d._deployment_config.request_router_config for d in built.deployments}
    engine = routers.pop("SpecExitLLMServer:m")
    assert engine.request_router_class == ROUTER_PATH
    assert engine.request_router_kwargs == rrc["request_router_kwargs"]
    assert engine.get_request_router_class().__name__ == SpecExitPrefixRouter.__name__
    (ingress,) = routers.values()  # the ingress itself keeps Serve's default
    assert ingress.is_default_request_router()


@pytest.mark.parametrize(
    "routing,needle",
    [
        ({"polcy": "prefix_aware"}, "polcy"),
        ({"policy": "round_robin"}, "policy"),
        ({"policy": "prefix_aware", "imbalance_threshold": 3}, "imbalance_threshold"),
        ({"policy": "prefix_aware", "match_rate_threshold": 1.5}, "match_rate_threshold"),
        ({"imbalanced_threshold": 3}, "prefix_aware only"),
        (
            {"policy": "prefix_aware", "eviction_threshold_chars": 10, "eviction_target_chars": 20},
            "eviction_target_chars",
        ),
    ],
)
def test_bad_routing_fails_early(routing, needle):
    with pytest.raises(ConfigError, match=needle):
        load_args({**TOY, "routing": routing})


def _shipped_apps():
    for pattern in ("serve_app/*.yaml", "serve_app/profiles/*.yaml", "cluster/serve/*.yaml"):
        for path in sorted(REPO_ROOT.glob(pattern)):
            for app in yaml.safe_load(path.read_text())["applications"]:
                yield pytest.param(app["args"], id=f"{path.relative_to(REPO_ROOT)}:{app['name']}")


@pytest.mark.parametrize("args", list(_shipped_apps()))
def test_shipped_multi_replica_configs_route_by_prefix_with_prefix_caching(args):
    a = load_args(args)
    if a.autoscaling.max_replicas > 1:
        assert a.routing.policy == "prefix_aware"
        assert a.model.engine_kwargs.get("enable_prefix_caching") is True  # else affinity buys nothing
    else:
        assert a.routing.policy == "power_of_two"


# -- the router reads our requests' text -------------------------------------------------------------------
def _pending(body):
    return types.SimpleNamespace(args=(body, None), metadata=None)  # (request, raw_request_info), as the ingress calls


def _bodies():
    from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

    from serve_app.ray_llm import sanitize_messages

    chat = ChatCompletionRequest(
        model="m",
        messages=[
            {"role": "system", "content": "You add. "},
            {"role": "user", "content": [{"type": "text", "text": "7 + 5"}]},
        ],
    )
    return {
        "chat": sanitize_messages(chat),  # what the ingress sends on
        "completion": CompletionRequest(model="m", prompt="Compute : 7 + 5"),
        "empty_chat": sanitize_messages(ChatCompletionRequest(model="m", messages=[{"role": "user", "content": ""}])),
        "token_ids": CompletionRequest(model="m", prompt=[5, 6, 7]),
        "detokenize": types.SimpleNamespace(model="m", tokens=[5, 6, 7]),  # DetokenizeRequest's fields
    }


def test_the_prefix_router_reads_chat_and_completion_text_and_skips_requests_without_text():
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter

    from serve_app.routing import SpecExitPrefixRouter

    router = object.__new__(SpecExitPrefixRouter)  # no Serve: only the text logic
    bodies = _bodies()
    text = {k: router._extract_text_from_request(_pending(b)) for k, b in bodies.items()}
    assert text == {
        "chat": "You add. 7 + 5",
        "completion": "Compute : 7 + 5",
        "empty_chat": None,
        "token_ids": None,
        "detokenize": None,
    }
    # why the subclass exists: stock raises (no messages/prompt) or returns "" (then divides by it)
    stock = object.__new__(PrefixCacheAffinityRouter)
    with pytest.raises(ValueError):
        stock._extract_text_from_request(_pending(bodies["detokenize"]))
    assert stock._extract_text_from_request(_pending(bodies["token_ids"])) == ""
    # without text: no prefix choice (Serve's power of two decides), nothing sent to the tree actor
    # (this router has no tree actor: touching it would raise)
    assert asyncio.run(router._prefix_match_best_replicas(_pending(bodies["detokenize"]), [])) == [[]]
    router.on_request_routed(_pending(bodies["empty_chat"]), replica_id=None, result=None)


# -- prefix-cache and preemption counters --------------------------------------------------------------
class _Sink:
    def __init__(self):
        self.adds = []

    def add(self, field, value):
        self.adds.append((field, value))


def _scheduler_stats(queries, hits, external=None):
    from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats

    s = SchedulerStats(prefix_cache_stats=PrefixCacheStats(requests=1, queries=queries, hits=hits))
    if external is not None:
        s.connector_prefix_cache_stats = PrefixCacheStats(requests=1, queries=external[0], hits=external[1])
    return s


def _iteration(preempted):
    from vllm.v1.metrics.stats import IterationStats

    it = IterationStats()
    it.num_preempted_reqs = preempted
    return it


def test_cache_counters_count_scheduler_and_iteration_stats():
    from vllm.v1.metrics.loggers import AggregateStatLoggerBase

    from serve_app.cache_metrics import CacheStatLogger

    sink = _Sink()
    c = CacheStatLogger(sink)
    assert isinstance(c, AggregateStatLoggerBase)  # the interface vLLM's StatLoggerManager calls
    c.record(_scheduler_stats(320, 0), _iteration(0), engine_idx=0)  # a cold prompt
    c.record(_scheduler_stats(330, 256), None)  # the same prefix again: 2 blocks hit
    c.record(_scheduler_stats(300, 128, external=(172, 96)), _iteration(2))  # a connector supplies more
    c.record(None, _iteration(1))  # an output batch without scheduler stats
    assert c.snapshot() == {
        "queries": 950,
        "hits": 384,
        "external_queries": 172,
        "external_hits": 96,
        "preemptions": 3,
    }
    assert sum(v for f, v in sink.adds if f == "hits") == 384 and all(v > 0 for _, v in sink.adds)  # Ray refuses 0
    c.record_admission_rejection("full")  # the manager calls these on every logger
    c.log()
    c.record_sleep_state(0, 0)


def test_a_failing_sink_never_breaks_the_engines_output_loop():
    from serve_app.cache_metrics import CacheStatLogger

    class Broken:
        def add(self, field, value):
            raise RuntimeError("metrics agent gone")

    c = CacheStatLogger(Broken())
    c.record(_scheduler_stats(64, 32), _iteration(1))
    assert c.snapshot()["hits"] == 32 and c.snapshot()["preemptions"] == 1


def test_attach_to_the_engines_logger_manager_or_report_none():
    from serve_app.cache_metrics import CacheStatLogger, attach

    manager = types.SimpleNamespace(stat_loggers=["vllm's own"])
    c = attach(types.SimpleNamespace(logger_manager=manager), None)
    assert isinstance(c, CacheStatLogger) and manager.stat_loggers == ["vllm's own", c]
    assert attach(types.SimpleNamespace(logger_manager=None), None) is None  # disable_log_stats: nothing to count


def test_ray_counters_are_named_and_tagged_by_model_and_replica(monkeypatch):
    import ray.util.metrics

    from serve_app.cache_metrics import METRICS, RayCounters

    made = {}

    class FakeCounter:
        def __init__(self, name, description, tag_keys):
            made[name] = self
            self.tag_keys, self.incs = tag_keys, []

        def inc(self, value, tags):
            self.incs.append((value, tags))

    monkeypatch.setattr(ray.util.metrics, "Counter", FakeCounter)
    rc = RayCounters("m", "r1")
    rc.add("hits", 128)
    assert set(made) == set(METRICS) and all(c.tag_keys == ("model", "replica") for c in made.values())
    assert made["specexit_prefix_cache_hits"].incs == [(128, {"model": "m", "replica": "r1"})]


def test_a_lost_prefix_tree_routes_by_load_instead_of_stalling(monkeypatch):
    """The prefix tree's actor dead (its node lost): the router gives no preference, so Serve routes the
    request by load (power of two), and a routed request's tree update is skipped, never raised into
    Serve's routing task (which would retry the request until its deadline). The real loss:
    tests/integration/test_node_loss.py."""
    from ray.exceptions import RayActorError
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter

    from serve_app.routing import SpecExitPrefixRouter, tree_namespace

    async def dead_match(self, pending_request, candidate_replicas):
        raise RayActorError()

    def dead_insert(self, pending_request, replica_id, result):
        raise RayActorError()

    monkeypatch.setattr(PrefixCacheAffinityRouter, "_prefix_match_best_replicas", dead_match)
    monkeypatch.setattr(PrefixCacheAffinityRouter, "on_request_routed", dead_insert)
    router = object.__new__(SpecExitPrefixRouter)  # no Serve around it: only the two overrides run
    assert asyncio.run(router._prefix_match_best_replicas(None, ["r1", "r2"])) == [[]]
    router.on_request_routed(None, "r1", None)  # no exception
    dep = types.SimpleNamespace(app_name="drill", name="SpecExitLLMServer:m")
    assert tree_namespace(dep) == "serve::drill::SpecExitLLMServer:m" and tree_namespace(None) == "serve"
