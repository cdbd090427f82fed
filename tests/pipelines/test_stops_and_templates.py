"""Stop strings never leak into streamed text; chat templates render in a sandbox."""

import random

import pytest

from maxdecl.pipelines.chat_template import ChatTemplate, ChatTemplateError, check_messages
from maxdecl.pipelines.stops import StopStrings


def test_stop_string_ends_the_text_before_it():
    s = StopStrings(["\n\n", "END"])
    assert s.push("Hello\n") == "Hello"
    assert s.push("\nWorld") == "" and s.stopped
    assert s.text == "Hello"


@pytest.mark.parametrize("seed", range(20))
def test_streaming_never_emits_part_of_a_stop_string(seed):
    rng = random.Random(seed)
    stops = ["".join(rng.choice("ab\n") for _ in range(rng.randint(1, 3))) for _ in range(2)]
    text = "".join(rng.choice("abc\n") for _ in range(40))
    s = StopStrings(stops)
    out, i = "", 0
    while i < len(text) and not s.stopped:
        n = rng.randint(1, 4)
        out += s.push(text[i:i + n])
        i += n
    out += s.flush()
    first = min((k for k in (text.find(x) for x in stops) if k >= 0), default=len(text))
    assert out == text[:first]


def test_sandboxed_template_renders_and_refuses_internals():
    t = ChatTemplate("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}"
                     "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
                     bos_token="<s>")
    assert t.render([{"role": "user", "content": "hi"}]) == "<s>[user]hi[assistant]"
    evil = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        evil.render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="raise"):
        ChatTemplate("{{ raise_exception('raise: no system role') }}").render(
            [{"role": "user", "content": "x"}])


@pytest.mark.parametrize("bad", [[], "hi", [{"role": "wizard", "content": "x"}],
                                 [{"content": "x"}], [{"role": "user", "content": 5}]])
def test_bad_messages_are_clean_errors(bad):
    with pytest.raises(ChatTemplateError):
        check_messages(bad)


def test_text_parts_are_joined():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]}]
    assert check_messages(msgs) == [{"role": "user", "content": "ab"}]
