"""Which engine replica this process is: Serve's replica id (the `replica` tag of its metrics, the name
of its exit-event folder, `specexit_stats()["replica"]`); the pid outside Serve (tests, scripts)."""

from __future__ import annotations

import os


def replica_tag() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # not in a Serve replica
        return str(os.getpid())
