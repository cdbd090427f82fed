"""Generated request bodies, hostile and not: the server answers 200 or a 4xx with an
OpenAI error object, never a 500 or a hang (in-process ASGI client, seeded)."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxdecl.serve import build_app

testclient = pytest.importorskip("starlette.testclient")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
fields = st.fixed_dictionaries({}, optional={
    "prompt": st.one_of(values, st.text(max_size=30), st.lists(st.integers(-5, 600), max_size=6)),
    "messages": st.one_of(values, st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "x"]),
         "content": st.one_of(st.text(max_size=20), values)}), max_size=3)),
    "max_tokens": st.one_of(st.integers(-3, 6), values),
    "temperature": st.one_of(st.floats(-1, 3), values),
    "top_p": values, "top_k": values, "min_p": values, "seed": values, "stop": values,
    "stream": st.one_of(st.booleans(), values), "n": values, "model": values,
})


@pytest.fixture(scope="module")
def http(live_server):
    server, _ = live_server
    with testclient.TestClient(build_app(server)) as c:
        yield c


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=fields, chat=st.booleans(), raw=st.booleans())
def test_any_body_gets_200_or_a_4xx_error_object(http, body, chat, raw):
    url = "/v1/chat/completions" if chat else "/v1/completions"
    if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 4:
        body["max_tokens"] = 4                      # keep generation short
    content = json.dumps(body, allow_nan=True).encode()
    if raw:
        content = content[: len(content) // 2]      # truncated JSON
    r = http.post(url, content=content, headers={"Content-Type": "application/json"})
    assert r.status_code in (200, 400, 404, 413), (r.status_code, r.text[:300])
    if r.status_code != 200:
        err = r.json()["error"]
        assert err["message"] and err["type"] == "invalid_request_error"
