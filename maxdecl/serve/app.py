"""The OpenAI-compatible HTTP API (Starlette): what ``maxdecl serve`` runs.

``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions``; ``"stream": true`` answers with server-sent events in
OpenAI's chunk format, ending with ``data: [DONE]``. A bad request gets a 4xx with
``{"error": {"message", "type", "param", "code"}}``, never a 500 or a hang; a client
that disconnects cancels its sequence.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from ..errors import MaxdeclError
from .engine import Engine

MAX_TOKENS_DEFAULT = 16           # OpenAI's completions default
MAX_BODY = 1 << 22                # 4 MiB of JSON per request


class BadRequest(Exception):
    """A 4xx answer: status, message, OpenAI error type, offending param."""

    def __init__(self, message, status=400, param=None, code=None,
                 kind="invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind


def _error(e: BadRequest):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": str(e), "type": e.kind, "param": e.param,
                                   "code": e.code}}, status_code=e.status)


_SAMPLING = {          # OpenAI / llama-server field -> (check_sampling argument, default)
    "temperature": ("temperature", 1.0), "top_p": ("top_p", None), "top_k": ("top_k", None),
    "min_p": ("min_p", None), "repeat_penalty": ("repeat_penalty", 1.0),
    "presence_penalty": ("presence_penalty", 0.0),
    "frequency_penalty": ("frequency_penalty", 0.0), "seed": ("seed", 0),
}


def sampling_from(body: dict) -> dict:
    """The sampling fields of an OpenAI request, checked by the same rules as the CLI
    and the API (``pipelines.params``); BadRequest names the field."""
    from ..errors import InputError
    from ..pipelines import params as checks

    args = {}
    for key, (arg, default) in _SAMPLING.items():
        v = body.get(key, default)
        if v is None:
            v = default
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise BadRequest(f"'{key}' must be a number, got {json.dumps(v)[:40]}", param=key)
        args[arg] = v
    tokens_key = "max_tokens" if "max_tokens" in body or "max_completion_tokens" not in body \
        else "max_completion_tokens"
    try:
        out = checks.check_sampling(**args)
        raw = body.get(tokens_key)
        out["max_tokens"] = checks.check_max_new_tokens(MAX_TOKENS_DEFAULT if raw is None
                                                        else raw)
    except InputError as e:
        word = str(e).split(" ", 1)[0].strip("'")
        field = tokens_key if word == "max_new_tokens" else word
        raise BadRequest(str(e).replace("max_new_tokens", tokens_key), param=field) from None
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest("only n = 1 is supported", param="n")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 16 or \
            any(not isinstance(s, str) or len(s) > 1000 for s in stop):
        raise BadRequest("'stop' must be a string or a list of up to 16 strings", param="stop")
    out["stop"] = [s for s in stop if s]
    if not isinstance(body.get("stream", False), bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    out["include_usage"] = _include_usage(body)
    return out


def _include_usage(body: dict) -> bool:
    """``stream_options.include_usage`` (OpenAI: a last chunk with the token counts),
    checked: an object, and only with ``stream``."""
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not body.get("stream"):
        raise BadRequest("'stream_options' is only allowed when 'stream' is true",
                         param="stream_options")
    if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
        raise BadRequest("'stream_options' must be an object with a boolean 'include_usage'",
                         param="stream_options")
    return opts.get("include_usage", False)


class Server:
    """The app's state: the engine, the model's name, the tokenizer and chat template."""

    def __init__(self, engine: Engine, model_name: str, template=None, make_sampler=None):
        self.engine, self.model_name, self.template = engine, model_name, template
        self.make_sampler = make_sampler

    # -- request -> prompt ids ---------------------------------------------------------
    def prompt_ids(self, body: dict, chat: bool) -> list:
        tok = self.engine.tokenizer
        if chat:
            from ..pipelines.chat_template import ChatTemplateError

            if self.template is None:
                raise BadRequest("this model has no chat template (give one with "
                                 "--chat-template FILE)", param="messages")
            try:
                text = self.template.render(body.get("messages"), add_generation_prompt=True)
            except ChatTemplateError as e:
                raise BadRequest(str(e), param="messages") from None
            return tok.encode(text, add_bos=True)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise BadRequest("'prompt' is empty", param="prompt")
            return tok.encode(prompt, add_bos=True)
        vocab = getattr(tok, "vocab_size", None)
        if isinstance(prompt, list) and prompt and all(
                isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            if any(i < 0 or (vocab is not None and i >= vocab) for i in prompt):
                raise BadRequest(f"token ids must be in [0, {vocab})", param="prompt")
            return list(prompt)
        raise BadRequest("'prompt' must be a string, a list of token ids, or a list with one "
                         "of those", param="prompt")

    def check_model(self, body: dict) -> None:
        model = body.get("model", self.model_name)
        if model is not None and model != self.model_name:
            raise BadRequest(f"the model '{model}' does not exist (this server has "
                             f"'{self.model_name}')", status=404, param="model",
                             code="model_not_found")

    def submit(self, body: dict, chat: bool, emit):
        self.check_model(body)
        params = sampling_from(body)
        ids = self.prompt_ids(body, chat)
        sampler = self.make_sampler(params, ids)
        try:
            handle = self.engine.submit(ids, sampler, params["max_tokens"], params["stop"], emit)
        except MaxdeclError as e:
            raise BadRequest(str(e), param="max_tokens" if "context" in str(e) else "prompt",
                             code="context_length_exceeded" if "context" in str(e) else None)
        return handle, params


def build_app(server: Server):
    """The Starlette application of ``server``."""
    from starlette.applications import Starlette
    from starlette.requests import Request as HttpRequest
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def read_body(request: HttpRequest) -> dict:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            raise BadRequest(f"the request body is over {MAX_BODY} bytes", status=413)
        try:
            body = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise BadRequest(f"the request body is not valid JSON: {str(e)[:80]}") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def models(request):
        return JSONResponse({"object": "list", "data": [
            {"id": server.model_name, "object": "model", "created": 0, "owned_by": "maxdecl"}]})

    async def generate(request: HttpRequest, chat: bool):
        try:
            body = await read_body(request)
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()

            def emit(text, reason):
                loop.call_soon_threadsafe(events.put_nowait, (text, reason))

            handle, params = server.submit(body, chat, emit)
        except BadRequest as e:
            return _error(e)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        if body.get("stream"):
            return StreamingResponse(_sse(server, handle, events, rid, created, chat,
                                          params["include_usage"]),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        text, reason = "", None
        try:
            while reason is None:
                try:
                    piece, reason = await asyncio.wait_for(events.get(), timeout=0.5)
                    text += piece
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        handle.cancel()
                        return JSONResponse({}, status_code=499)
        finally:
            if reason is None:
                handle.cancel()
        if handle.error is not None:
            return _error(BadRequest(f"generation failed: {handle.error}", status=500,
                                     kind="server_error"))
        usage = _usage(handle)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            obj = "text_completion"
        return JSONResponse({"id": rid, "object": obj, "created": created,
                             "model": server.model_name, "choices": [choice], "usage": usage})

    async def completions(request):
        return await generate(request, chat=False)

    async def chat_completions(request):
        return await generate(request, chat=True)

    return Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ])


def _usage(handle) -> dict:
    """OpenAI's ``usage`` object of a finished request."""
    done = len(handle.request.ids)
    return {"prompt_tokens": handle.prompt_tokens, "completion_tokens": done,
            "total_tokens": handle.prompt_tokens + done}


async def _sse(server, handle, events, rid, created, chat, include_usage=False):
    """Server-sent events in OpenAI's chunk format; a disconnect cancels the sequence.
    With ``include_usage`` every chunk carries ``"usage": null`` and a last chunk with no
    choices carries the counts, as OpenAI's ``stream_options`` asks."""
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text, reason, first=False):
        if chat:
            delta = {"role": "assistant", "content": ""} if first else \
                ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return event([choice])

    def event(choices, usage=None):
        data = {"id": rid, "object": obj, "created": created, "model": server.model_name,
                "choices": choices}
        if include_usage:
            data["usage"] = usage
        return f"data: {json.dumps(data)}\n\n"

    reason = None
    try:
        if chat:
            yield chunk("", None, first=True)
        while reason is None:
            text, reason = await events.get()
            if text:
                yield chunk(text, None)
        yield chunk("", reason)
        if include_usage:
            yield event([], _usage(handle))
        yield "data: [DONE]\n\n"
    finally:
        if reason is None:
            handle.cancel()
