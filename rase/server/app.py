"""create_app(engine): the HTTP surface over one Engine, composed of routers (OpenAI's, Ollama's,
the chat page) behind the guard middleware; no module-level state."""
from __future__ import annotations

from dataclasses import replace

from fastapi import FastAPI
from fastapi.responses import Response

from .anthropic import router as anthropic_router
from .defaults import ServeDefaults
from .guard import GuardConfig, install_guards
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .metrics import Metrics
from .ollama import router as ollama_router
from .openai import router as openai_router
from .openapi import document
from .responses import router as responses_router
from .web import router as web_router


def create_app(engine, api_key: str | None = None, guard: GuardConfig | None = None,
               defaults: ServeDefaults | None = None) -> FastAPI:
    """guard: body limit, allowed Host names, CORS origins (rase serve passes the loopback
    names when bound to loopback); api_key alone is GuardConfig(api_key=...). defaults: the
    reasoning format of requests that do not say."""
    app = FastAPI(title="rase", version=__import__("rase").__version__)
    app.state.engine = engine
    app.state.metrics = metrics = Metrics(engine)
    config = guard or GuardConfig()
    install_guards(app, replace(config, api_key=api_key) if api_key else config, metrics)
    document(app, engine)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=METRICS_TYPE)

    @app.get("/health")
    async def health():
        return {"status": "ok", "version": app.version, **engine.stats}

    defaults = defaults or ServeDefaults()
    app.include_router(openai_router(engine, metrics, defaults))
    app.include_router(responses_router(engine, metrics))  # reasoning: its own items / blocks
    app.include_router(anthropic_router(engine, metrics))
    app.include_router(ollama_router(engine))
    app.include_router(web_router())
    return app
