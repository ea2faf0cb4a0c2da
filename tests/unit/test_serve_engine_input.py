"""#16 items 7 and 5 on the Serve app's own layers, no engine: a chat message without a `role` (the
Harmony message the fuzzer found, which the request schema accepts and the engine replica answered
with a 500) is refused in the ingress with 400; the engine replica counts requests that still carry an
`Authorization` header (must stay 0). The real endpoint: tests/integration/test_serve_app.py."""

import asyncio
import json
import types

import pytest
from ray.serve.llm.openai_api_models import ChatCompletionRequest

from serve_app.engine import SpecExitVLLMEngine
from serve_app.limits import message_violation

HARMONY = {"author": {"role": "user"}, "content": [], "!": []}
USER = {"role": "user", "content": "1 + 1"}


def test_the_harmony_message_the_fuzzer_found_is_accepted_by_the_schema_and_refused_here():
    body = ChatCompletionRequest(model="m", messages=[USER, HARMONY])  # what the ingress route parses
    assert not isinstance(body.messages[1], dict)  # a pydantic `Message`: Ray turns it into a dict without role
    msg = message_violation(body)
    assert msg.startswith("messages[1]: ") and "'role'" in msg and "Harmony" in msg
    as_dict = types.SimpleNamespace(messages=[USER, body.messages[1].model_dump()])  # after Ray's sanitizer
    assert message_violation(as_dict) == msg


@pytest.mark.parametrize(
    "messages", [[USER], [USER, {"role": "assistant", "content": "2", "junk": {"x": [1]}}], [{"role": "weird"}]]
)
def test_messages_with_a_role_pass(messages):
    """Extra keys and unusual roles are vLLM's to judge (it drops the keys, renders the role)."""
    assert message_violation(ChatCompletionRequest(model="m", messages=messages)) is None
    assert message_violation(types.SimpleNamespace(prompt="completions: no messages")) is None


def test_ingress_answers_400_before_any_engine_call():
    from serve_app.ingress import SpecExitIngress

    ing = SpecExitIngress({"m": object()}, {"m": object()})
    called = []

    async def never(**_):
        called.append(1)
        yield "x"

    ing._get_response = never
    r = asyncio.run(ing._process_llm_request(ChatCompletionRequest(model="m", messages=[HARMONY]), "chat"))
    assert r.status_code == 400 and "messages[0]" in json.loads(r.body)["error"]["message"] and not called


def test_requests_with_an_authorization_header_are_counted():
    eng = object.__new__(SpecExitVLLMEngine)  # no vLLM engine: only the request counter
    eng._requests = eng._requests_with_authorization = 0
    for headers in ({"x-request-id": "1"}, {"Authorization": "Bearer sk"}, {"authorization": "x"}, None):
        eng._count_request(types.SimpleNamespace(headers=headers) if headers is not None else None)
    assert (eng._requests, eng._requests_with_authorization) == (4, 2)


def test_an_embeddings_request_with_messages_reaches_the_replica_picklable(monkeypatch):
    """The fuzzer's other 500: pydantic leaves `content` of parsed messages as a lazy iterator, which
    cannot be pickled to the engine replica; stock Serve LLM makes chat requests picklable only."""
    import ray.cloudpickle as cloudpickle
    from pydantic import TypeAdapter
    from ray.serve.llm.ingress import OpenAiIngress
    from ray.serve.llm.openai_api_models import EmbeddingRequest

    from serve_app.ingress import SpecExitIngress

    body = TypeAdapter(EmbeddingRequest).validate_python(
        {
            "model": "m",
            "messages": [{"role": "user", "content": []}, {"role": "assistant", "content": "", "tool_calls": []}],
        }
    )
    with pytest.raises(TypeError, match="pickle"):
        cloudpickle.dumps(body)
    sent = []

    async def stock(self, *, body, call_method, raw_request=None):
        sent.append(cloudpickle.dumps(body))  # what the handle call does with it
        yield "ok"

    monkeypatch.setattr(OpenAiIngress, "_get_response", stock)
    ing = SpecExitIngress({"m": object()}, {"m": object()})

    async def first():
        return await ing._get_response(body=body, call_method="embeddings").__anext__()

    assert asyncio.run(first()) == "ok" and len(sent) == 1
