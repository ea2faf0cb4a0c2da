"""The engine replica's own guards (serve_app/engine.py), with a fake vLLM serving layer: an input error
raised while vLLM renders a request is vLLM's 400, not Ray's 500 (#16 item 7, found by the fuzzer), and
the replica counts requests that still carry an `Authorization` header (#16 item 5: must stay 0). The
real endpoint: tests/integration/test_serve_app.py (fuzz, engine never sees the header)."""

import asyncio
import types

import pytest
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

from serve_app.engine import SpecExitVLLMEngine


def _engine() -> SpecExitVLLMEngine:
    eng = object.__new__(SpecExitVLLMEngine)  # no vLLM engine: only the request-handling layer
    serving = types.SimpleNamespace(create_error_response=create_error_response)
    eng._oai_serving_chat = eng._oai_serving_completion = serving
    eng._requests = eng._requests_with_authorization = 0
    return eng


async def _items(fail_after: int, exc: Exception):
    for i in range(fail_after):
        yield f"data: chunk {i}\n\n"
    raise exc


def _run(eng, items, chat=True) -> list:
    async def collect():
        return [x async for x in eng._input_errors_as_400(items, chat)]

    return asyncio.run(collect())


def test_a_message_vllm_cannot_render_is_400_naming_the_error():
    """What a Harmony `Message` in `messages` does inside vLLM's chat parser."""
    out = _run(_engine(), _items(0, TypeError("'Message' object is not subscriptable")))
    (err,) = out
    assert err.error.code == 400 and err.error.type == "BadRequestError"
    assert "'role' and 'content'" in err.error.message and "TypeError: 'Message' object" in err.error.message
    (err,) = _run(_engine(), _items(0, OverflowError("int too big to convert")), chat=False)
    assert err.error.code == 400 and "OverflowError" in err.error.message and "'role'" not in err.error.message


@pytest.mark.parametrize("fail_after,exc", [(2, TypeError("bug mid-stream")), (0, RuntimeError("engine bug"))])
def test_errors_after_the_first_output_or_of_other_kinds_pass_unchanged(fail_after, exc):
    with pytest.raises(type(exc)):
        _run(_engine(), _items(fail_after, exc))


def test_requests_with_an_authorization_header_are_counted():
    eng = _engine()
    for headers in ({"x-request-id": "1"}, {"Authorization": "Bearer sk"}, {"authorization": "x"}, None):
        eng._count_request(types.SimpleNamespace(headers=headers) if headers is not None else None)
    assert (eng._requests, eng._requests_with_authorization) == (4, 2)
