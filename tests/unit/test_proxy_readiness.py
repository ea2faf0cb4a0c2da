"""serve_app/proxy_readiness.py: Serve's proxy gets as long to start as `serve.start` waits for it."""

from serve_app.proxy_readiness import PROXY_READY_ENV, PROXY_READY_S, patient_proxy_readiness


def test_sets_the_default_and_keeps_a_users_value(monkeypatch):
    monkeypatch.delenv(PROXY_READY_ENV, raising=False)
    patient_proxy_readiness()
    import os

    assert os.environ[PROXY_READY_ENV] == str(PROXY_READY_S)
    monkeypatch.setenv(PROXY_READY_ENV, "7")
    patient_proxy_readiness()
    assert os.environ[PROXY_READY_ENV] == "7"


def test_the_controllers_checks_add_up_to_serve_starts_wait():
    # the pinned Serve: a proxy is killed after THRESHOLD failed readiness checks of TIMEOUT each, and
    # serve.start waits HTTP_PROXY_TIMEOUT on the first proxy; if Serve changes these, revisit the value
    from ray.serve._private import constants as c

    assert c.PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD * PROXY_READY_S == c.HTTP_PROXY_TIMEOUT
