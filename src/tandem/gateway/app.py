"""The gateway's HTTP application: every endpoint's routes on the HTTP edge.

The one place that names every endpoint (``gateway/endpoints/<name>/route.py``) and the
one pipeline they share (``pipeline/run.py``); the edge (``gateway/http``) adds error
handling and access control. A new endpoint is a folder and a line here
(docs/architecture.md, "Add an endpoint").
"""

from __future__ import annotations

from starlette.applications import Starlette

from tandem.gateway.endpoints.chat.route import chat_routes
from tandem.gateway.endpoints.completions.route import completion_routes
from tandem.gateway.endpoints.conversations.route import conversations_routes
from tandem.gateway.endpoints.messages.route import messages_routes
from tandem.gateway.endpoints.models.route import model_routes
from tandem.gateway.endpoints.responses.route import responses_routes
from tandem.gateway.endpoints.service.route import service_routes
from tandem.gateway.endpoints.tokenize.route import tokenize_routes
from tandem.gateway.http.edge import http_app
from tandem.gateway.pipeline.run import Pipeline
from tandem.gateway.state import GatewayState
from tandem.gateway.workers_admin import admin_routes


def build_app(state: GatewayState) -> Starlette:
    pipeline = Pipeline(state)
    routes = [
        *chat_routes(pipeline),
        *completion_routes(pipeline),
        *responses_routes(state, pipeline),
        *conversations_routes(state),
        *messages_routes(state, pipeline),
        *model_routes(state),
        *service_routes(state),
        *admin_routes(state),
        *tokenize_routes(state),
    ]
    return http_app(state.config, routes)
