"""`specdeploy serve`: an OpenAI-compatible HTTP server over one bundle (serve extra)."""
