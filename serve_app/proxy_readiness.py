"""Serve's HTTP proxy, given time to start on a loaded machine.

Serve's controller asks a starting proxy actor whether it is ready with a 5 s timeout
(RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S), marks it unhealthy after 3 such checks fail in a row,
kills it and starts another one, while `serve.start` waits up to 60 s on the *first* proxy and so
raises ActorDiedError ("killed by `ray.kill` ... never ran"). On 2 busy cores (a vLLM engine
compiling beside it) a new worker process can take longer than 15 s to start and import Serve: CI
failed exactly so. With 20 s per check the controller gives the proxy the same 60 s `serve.start`
gives it.

The controller is a Ray worker and reads the variable when it imports Serve, so it has to be in the
environment of the process that starts the raylet: call this before `ray.init(address="local")`
or before `ray start` (its children inherit it). A value the user set wins.
"""

from __future__ import annotations

import os

PROXY_READY_ENV = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
PROXY_READY_S = 20  # x 3 checks = serve.start's own 60 s wait (ray.serve._private.constants.HTTP_PROXY_TIMEOUT)


def patient_proxy_readiness() -> None:
    """Set Serve's proxy readiness timeout for clusters this process starts (idempotent)."""
    os.environ.setdefault(PROXY_READY_ENV, str(PROXY_READY_S))
