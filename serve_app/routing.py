"""Prefix-aware routing of requests to engine replicas (`routing.policy: prefix_aware`).

Ray Serve LLM's PrefixCacheAffinityRouter (public, `ray.serve.llm.request_router`, read against Ray
2.60.0) runs in the ingress, where the handle to the engine replicas lives. It reads the prompt text of
each call to the engine replica (`messages` of a chat request, `prompt` of a completions or tokenize
request: the request object is the call's first argument, as the ingress sends it), keeps a prefix
tree of the texts each replica was sent, and sends a prompt to the replica holding its longest prefix,
where that prefix's KV blocks are (with `enable_prefix_caching`).

One thing is changed, because the stock router cannot route every request this endpoint sends to the
engine replica. Stock raises for a call whose request has neither `messages` nor `prompt`
(`/detokenize`, `/v1/embeddings` with `input`, `/v1/score`), and divides by zero for an empty text (a
chat message with empty content, a completions prompt of token ids). Either error ends Serve's routing
task, which retries the same request forever: the client waited for its deadline (503). Here such a
request has no text: it is routed as Serve's default router would (power of two), and nothing is
inserted into the tree for it.
"""

from __future__ import annotations

from ray.serve.llm.request_router import PrefixCacheAffinityRouter

ROUTER_PATH = "serve_app.routing:SpecExitPrefixRouter"


class SpecExitPrefixRouter(PrefixCacheAffinityRouter):
    def _extract_text_from_request(self, pending_request) -> str | None:
        """The prompt text, or None when the request has none to match (the stock router's callers,
        `_prefix_match_best_replicas` and `on_request_routed`, skip prefix logic on None)."""
        try:
            text = super()._extract_text_from_request(pending_request)
        except ValueError:  # neither `messages` nor `prompt`
            return None
        return text or None
