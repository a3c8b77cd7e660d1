"""Who may call the server: an API key (OpenAI's `Authorization: Bearer KEY`) and, when asked for,
CORS for browser pages served from other origins.

TLS is a reverse proxy's job (Caddy, nginx, Traefik): the server listens on loopback by default, and
a deployment that exposes it puts a proxy with certificates in front (docs/serving.md).
"""
from __future__ import annotations

import hmac
import json

OPEN_PATHS = ("/", "/health")  # the playground page (its calls carry the key) and liveness probes


class ApiKey:
    """ASGI middleware: 401 unless the request carries the key; OPTIONS (CORS preflight) passes."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and scope["method"] != "OPTIONS":
            scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.expected):
                await _unauthorized(send)
                return
        await self.app(scope, receive, send)


async def _unauthorized(send) -> None:
    body = json.dumps({"error": {
        "message": "missing or wrong API key: send the header 'Authorization: Bearer <key>' (the key "
                   "'serve' was started with: --api-key or SPECDEPLOY_API_KEY)",
        "type": "authentication_error", "param": None, "code": "invalid_api_key"}}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})


def wrap(app, api_key: str | None, cors_origins: tuple[str, ...]):
    """`app` behind the key check and, outside it, CORS (so a preflight gets its headers)."""
    if api_key:
        app = ApiKey(app, api_key)
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app = CORSMiddleware(app, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "OPTIONS"],
                             allow_headers=["Authorization", "Content-Type"])
    return app
