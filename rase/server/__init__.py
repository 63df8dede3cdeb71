"""The OpenAI-compatible HTTP server: create_app(engine) -> a FastAPI app (mountable)."""
from .app import create_app

__all__ = ["create_app"]
