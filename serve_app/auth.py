"""Optional Bearer API-key auth, as a pure ASGI middleware in front of the ingress app.

Keys come from an env var and/or a secret file (re-read when its mtime changes, so a mounted
Kubernetes secret can rotate without a restart). They are never logged or echoed: the only
things logged are how many keys were loaded and from where.
"""

from __future__ import annotations

import hmac
import json
import logging
import os

log = logging.getLogger("specexit.serve.auth")


def _split(text: str) -> list[str]:
    keys = []
    for line in text.replace(",", "\n").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(line)
    return keys


class KeyStore:
    def __init__(self, env_name: str | None, file: str | None):
        self.env_name, self.file = env_name, file
        self._file_keys: list[str] = []
        self._mtime: float | None = None

    def keys(self) -> list[str]:
        keys = _split(os.environ.get(self.env_name, "")) if self.env_name else []
        if self.file:
            try:
                mtime = os.stat(self.file).st_mtime
            except FileNotFoundError:
                mtime = None
                self._file_keys = []
            if mtime is not None and mtime != self._mtime:
                with open(self.file) as f:
                    self._file_keys = _split(f.read())
                self._mtime = mtime
                log.info("auth: %d key(s) loaded from the key file", len(self._file_keys))
            keys += self._file_keys
        return keys

    def check(self, token: str) -> bool:
        # compare against every key (no early exit) in constant time per key
        ok = False
        for k in self.keys():
            ok |= hmac.compare_digest(token.encode(), k.encode())
        return ok


class BearerAuthMiddleware:
    """401 unless `Authorization: Bearer <key>` matches a configured key. `/-/*` (Serve's own
    health/route probes) stays open so load balancers and KubeRay probes need no key."""

    def __init__(self, app, *, env_name: str | None, file: str | None):
        self.app = app
        self.store = KeyStore(env_name, file)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path", "").startswith("/-/"):
            return await self.app(scope, receive, send)
        auth = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip() and self.store.check(token.strip()):
            return await self.app(scope, receive, send)
        msg = "missing API key: send 'Authorization: Bearer <key>'" if not auth else "invalid API key"
        body = json.dumps(
            {"error": {"message": msg, "type": "authentication_error", "param": None, "code": 401}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b"Bearer"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
