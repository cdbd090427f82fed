"""Chat templates: a list of messages -> the prompt text a chat model was trained on.

The template is Jinja, as Hugging Face's ``chat_template`` and GGUF's
``tokenizer.chat_template`` hold it, rendered in Jinja2's immutable sandbox (no
attribute access to Python internals, no mutation of the inputs): a template from a
downloaded file is data, never code. Variables: ``messages`` (dicts with ``role`` and
``content``), ``bos_token``, ``eos_token``, ``add_generation_prompt``, plus the
helpers transformers provides (``raise_exception``, ``strftime_now``).

Where the template comes from, first found: ``--chat-template FILE``, the weights'
``tokenizer.chat_template``, the spec's ``chat_template``.
"""

from __future__ import annotations

import datetime

from ..errors import MaxdeclError

ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatTemplateError(MaxdeclError):
    """A chat template that does not parse or render, or messages it cannot take."""


def check_messages(messages) -> list[dict]:
    """``messages`` as a list of ``{"role", "content"}`` with str content (OpenAI's
    list-of-parts content is joined); ChatTemplateError for anything else."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] must be an object with a string 'role'")
        if m["role"] not in ROLES:
            raise ChatTemplateError(f"messages[{i}].role {m['role']!r} is not one of "
                                    f"{', '.join(ROLES)}")
        content = m.get("content", "")
        if isinstance(content, list):            # [{"type": "text", "text": ...}, ...]
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            if any(not isinstance(t, str) for t in parts) or len(parts) != len(content):
                raise ChatTemplateError(f"messages[{i}].content: only text parts are supported")
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ChatTemplateError(f"messages[{i}].content must be a string")
        out.append({"role": m["role"], "content": content})
    return out


def _raise(message):
    raise ChatTemplateError(f"chat template: {message}")


class ChatTemplate:
    """A compiled chat template: ``render(messages, add_generation_prompt=True) -> str``."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("the chat template is empty")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(str(fmt))
        try:
            self._template = env.from_string(source)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template does not parse: {e}") from None
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (ChatTemplateError if the template fails)."""
        from jinja2 import TemplateError

        msgs = check_messages(messages)
        try:
            return self._template.render(messages=msgs, bos_token=self.bos_token,
                                         eos_token=self.eos_token,
                                         add_generation_prompt=add_generation_prompt)
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as e:
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
