"""Run the server with uvicorn: loopback by default, clean exit 0 on SIGTERM / SIGINT."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import check_prefill_chunk
from ..constants import DEFAULT_PREFILL_CHUNK
from ..errors import ConfigError, require


@dataclass(frozen=True)
class ServeConfig:
    bundle: Path
    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int = 8
    provider: str = "cpu"
    backend: str = "onnxruntime"
    model_name: str | None = None
    shutdown_timeout_s: int = 10
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    api_key: str | None = None              # None: no key asked for
    cors_origins: tuple[str, ...] = ()      # browser origins allowed to call the API; () : CORS off
    prefix_reuse: bool = True               # keep the last sequence's KV rows for the next request

    def __post_init__(self):
        if self.api_key is not None and (not self.api_key.strip() or not self.api_key.isascii()
                                         or any(c.isspace() for c in self.api_key)):
            raise ConfigError("--api-key must be a non-empty key of ASCII characters without spaces")
        if not (0 <= self.port <= 65535):
            raise ConfigError(f"port={self.port} must be in 0..65535")
        if self.max_queue < 1:
            raise ConfigError(f"max_queue={self.max_queue} must be >= 1")
        check_prefill_chunk(self.prefill_chunk)


def check_port(host: str, port: int) -> None:
    """Refuse a port another process holds, in one line, before the bundle is loaded."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"could not listen on {host}:{port} ({exc.strerror}); pick another --port") from None


def serve(config: ServeConfig, ready: Callable[[], None] = lambda: None) -> None:
    """Load the bundle and serve until SIGTERM/SIGINT; in-flight work gets `shutdown_timeout_s`.

    `ready` is called once the bundle is loaded (the CLI announces the address then, not before
    an error about the bundle).
    """
    uvicorn = require("uvicorn", "serve", "serving")
    require("starlette", "serve", "serving")
    from ..runtime.engine import Engine
    from .app import Server

    check_port(config.host, config.port)
    engine = Engine(config.bundle, backend=config.backend, provider=config.provider,
                    prefill_chunk=config.prefill_chunk, prefix_reuse=config.prefix_reuse)
    name = config.model_name or engine.manifest.model.name
    server = Server(engine, name, config.max_queue, config.api_key, config.cors_origins)
    ready()

    class _Uvicorn(uvicorn.Server):
        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            self._captured_signals.clear()  # shut down cleanly and exit 0, do not re-raise

    uv = _Uvicorn(uvicorn.Config(server.app(), host=config.host, port=config.port, log_level="warning",
                                 timeout_graceful_shutdown=config.shutdown_timeout_s))
    try:
        uv.run()
    finally:
        server.worker.stop()
        engine.close()
    if not uv.started:
        raise ConfigError(f"could not listen on {config.host}:{config.port} (in use?); pick another --port")
