"""Prefix-aware routing of requests to engine replicas (`routing.policy: prefix_aware`).

Ray Serve LLM's PrefixCacheAffinityRouter (public, `ray.serve.llm.request_router`, read against Ray
2.60.0) runs in the ingress, where the handle to the engine replicas lives. It reads the prompt text of
each call to the engine replica (`messages` of a chat request, `prompt` of a completions or tokenize
request: the request object is the call's first argument, as the ingress sends it), keeps a prefix
tree of the texts each replica was sent, and sends a prompt to the replica holding its longest prefix,
where that prefix's KV blocks are (with `enable_prefix_caching`).

Two things are changed.

Where the prefix tree lives. Stock creates it as a detached actor (`PrefixTreeActor`) with Ray's
default placement: on whatever node the scheduler picks, a worker node on a cluster whose head has no
CPUs. When that node is lost, every routing decision of every request waits on a dead actor: Serve's
routing task fails and retries the request until its deadline, so after the loss each request got 503
after `request_timeout_s`, for good (tests/integration/test_node_loss.py, before this change). Here
the tree goes to the head node, where Serve's controller is (no CPU asked, so a head without CPUs
takes it; a hard node affinity: with a soft one Ray placed it on a worker node in 1 of 2 tries on the
drill's cluster). Whichever router creates it first (the ingress's, or a driver's handle), a lost
worker node never takes it; losing the head loses Serve's control plane anyway. And
should a tree call fail all the same, the request is routed as Serve's default router would, never
left waiting.

The other, because the stock router cannot route every request this endpoint sends to the
engine replica. Stock raises for a call whose request has neither `messages` nor `prompt`
(`/detokenize`, `/v1/embeddings` with `input`, `/v1/score`), and divides by zero for an empty text (a
chat message with empty content, a completions prompt of token ids). Either error ends Serve's routing
task, which retries the same request forever: the client waited for its deadline (503). Here such a
request has no text: it is routed as Serve's default router would (power of two), and nothing is
inserted into the tree for it.
"""

from __future__ import annotations

import logging

from ray.exceptions import RayActorError
from ray.serve.llm.request_router import PrefixCacheAffinityRouter

ROUTER_PATH = "serve_app.routing:SpecExitPrefixRouter"
TREE_ACTOR = "LlmPrefixTreeActor"  # stock's name, per app and deployment namespace

log = logging.getLogger("specexit.serve.routing")


def tree_namespace(deployment_id) -> str:
    """Stock's namespace for the tree of one deployment (`serve::<app>::<deployment>`)."""
    from ray.serve._private.constants import SERVE_NAMESPACE

    parts = [SERVE_NAMESPACE]
    if deployment_id is not None:
        parts += [p for p in (deployment_id.app_name, deployment_id.name) if p]
    return "::".join(parts)


class SpecExitPrefixRouter(PrefixCacheAffinityRouter):
    def initialize_state(self, tree_actor=None, **kwargs):
        """Stock's state, with the prefix tree created here: on the head node."""
        if tree_actor is None:
            tree_actor = self._head_tree_actor()
        super().initialize_state(tree_actor=tree_actor, **kwargs)

    def _head_tree_actor(self):
        import ray
        from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        head = next(
            (n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"]),
            ray.get_runtime_context().get_node_id(),  # no head known (a client connection): this node
        )
        actor = PrefixTreeActor.options(
            name=TREE_ACTOR,
            namespace=tree_namespace(self._deployment_id),
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,  # bookkeeping only; a CPU request would push it off a head node with no CPUs
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=head, soft=False),
        ).remote()
        # as stock does: serve.shutdown() removes it
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        ray.get(controller._register_shutdown_cleanup_actor.remote(actor))
        return actor

    async def _prefix_match_best_replicas(self, pending_request, candidate_replicas):
        """Stock's choice; if the prefix tree cannot answer (its actor died), no preference: the caller
        then routes as Serve's default router does."""
        try:
            return await super()._prefix_match_best_replicas(pending_request, candidate_replicas)
        except RayActorError as e:
            log.warning("prefix tree unavailable (%s); routing by load", type(e).__name__)
            return [[]]

    def _extract_text_from_request(self, pending_request) -> str | None:
        """The prompt text, or None when the request has none to match (the stock router's callers,
        `_prefix_match_best_replicas` and `on_request_routed`, skip prefix logic on None)."""
        try:
            text = super()._extract_text_from_request(pending_request)
        except ValueError:  # neither `messages` nor `prompt`
            return None
        return text or None

    def on_request_routed(self, pending_request, replica_id, result):
        """Stock's tree update; a tree that cannot take it costs the affinity of this prompt only."""
        try:
            super().on_request_routed(pending_request, replica_id, result)
        except RayActorError as e:
            log.warning("prefix tree unavailable (%s); prompt not recorded", type(e).__name__)
