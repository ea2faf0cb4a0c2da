"""Optional Bearer API-key auth, as a pure ASGI middleware in front of the ingress app.

Keys come from an env var and/or a secret file (re-read when its mtime changes, so a mounted
Kubernetes secret can rotate without a restart). They are never logged or echoed: the only
things logged are how many keys were loaded and from where.

Fail closed, everywhere:
* every connection scope is checked: HTTP and WebSocket alike; only the ASGI `lifespan` scope
  (start-up / shutdown, no client) passes unchecked;
* a key file that cannot be read fails the ingress at start-up with the reason
  (`check_auth_at_start`); if it becomes unreadable later (a rotation in progress, a permission
  change), the keys last read stay in force and a warning is logged: never a 500 per request, never
  an open door;
* the `Authorization` header is removed once checked, so the key never travels on to the engine
  replicas (Ray Serve LLM forwards the request headers to them).
"""

from __future__ import annotations

import hmac
import logging
import os

from serve_app.errors import error_response

log = logging.getLogger("specexit.serve.auth")


def _split(text: str) -> list[str]:
    keys = []
    for line in text.replace(",", "\n").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(line)
    return keys


class KeyFileError(RuntimeError):
    """The configured key file cannot be read (start-up only; later, the last keys read stay)."""


class KeyStore:
    def __init__(self, env_name: str | None, file: str | None):
        self.env_name, self.file = env_name, file
        self._file_keys: list[str] = []
        self._mtime: float | None = None
        self.read_errors = 0

    def load(self) -> int:
        """Read the keys now; raises KeyFileError naming the file and the reason. Returns how many."""
        if self.file:
            try:
                self._read_file(os.stat(self.file).st_mtime)
            except OSError as e:
                raise KeyFileError(f"auth: cannot read the API key file {self.file!r}: {e.strerror or e}") from None
        return len(self.keys())

    def _read_file(self, mtime: float) -> None:
        with open(self.file) as f:
            self._file_keys = _split(f.read())
        self._mtime = mtime
        log.info("auth: %d key(s) loaded from the key file", len(self._file_keys))

    def keys(self) -> list[str]:
        keys = _split(os.environ.get(self.env_name, "")) if self.env_name else []
        if self.file:
            try:
                mtime = os.stat(self.file).st_mtime
                if mtime != self._mtime:
                    self._read_file(mtime)
            except OSError as e:  # keep the last keys read: no 500 per request, no open door
                self.read_errors += 1
                if self.read_errors == 1 or self.read_errors % 1000 == 0:
                    log.warning(
                        "auth: key file unreadable (%s, %d time(s)); the %d key(s) read before stay in force",
                        e.strerror or type(e).__name__,
                        self.read_errors,
                        len(self._file_keys),
                    )
            keys += self._file_keys
        return keys

    def check(self, token: str) -> bool:
        # compare against every key (no early exit) in constant time per key
        ok = False
        for k in self.keys():
            ok |= hmac.compare_digest(token.encode(), k.encode())
        return ok


def check_auth_at_start(auth: dict) -> None:
    """At ingress start: with auth on, at least one key and a readable key file (else raise, so
    Serve reports the deployment failed with this message); with auth off, a warning."""
    if not auth.get("enabled"):
        log.warning(
            "auth is OFF: anyone who can reach this endpoint can use it (set auth.enabled: true "
            "and api_keys_env / api_keys_file)"
        )
        return
    n = KeyStore(auth.get("api_keys_env"), auth.get("api_keys_file")).load()
    if n == 0:
        raise RuntimeError(
            "auth is enabled but no API key was found (set the env var "
            f"{auth.get('api_keys_env')!r} or the file {auth.get('api_keys_file')!r})"
        )
    log.info("auth: %d API key(s) configured", n)


class BearerAuthMiddleware:
    """401 unless `Authorization: Bearer <key>` matches a configured key. `/-/*` (Serve's own
    health/route probes) stays open so load balancers and KubeRay probes need no key."""

    def __init__(self, app, *, env_name: str | None, file: str | None):
        self.app = app
        self.store = KeyStore(env_name, file)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        if scope["type"] == "http" and scope.get("path", "").startswith("/-/"):
            return await self.app(scope, receive, send)
        headers = list(scope.get("headers") or [])
        auth = dict(headers).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip() and self.store.check(token.strip()):
            # checked: the key goes no further (Ray Serve LLM forwards headers to the engine replicas)
            stripped = [(k, v) for k, v in headers if k.lower() != b"authorization"]
            return await self.app({**scope, "headers": stripped}, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})
        if scope["type"] != "http":  # an unknown scope type: refuse it
            raise RuntimeError(f"auth: unsupported ASGI scope {scope['type']!r} refused")
        msg = "missing API key: send 'Authorization: Bearer <key>'" if not auth else "invalid API key"
        resp = error_response(401, msg, "authentication_error", headers={"WWW-Authenticate": "Bearer"})
        await resp(scope, receive, send)
