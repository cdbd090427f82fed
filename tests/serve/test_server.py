"""The OpenAI-compatible server, through the real ``openai`` client and plain HTTP:
completions and chat, streamed and not, concurrency, errors, disconnects; greedy
outputs equal ``md.generate``'s for the same prompt."""

import json
import threading
from pathlib import Path

import httpx
import pytest

import maxdecl as md

openai = pytest.importorskip("openai")
SPECS = Path(__file__).resolve().parents[2] / "specs"


@pytest.fixture(scope="module")
def client(live_server):
    _, url = live_server
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)


def solo_text(prompt, n):
    return md.generate(SPECS / "llama3.yaml", None, prompt, max_new_tokens=n).text


def test_health_and_models(live_server, client):
    server, url = live_server
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    assert [m.id for m in client.models.list().data] == [server.model_name]


def test_completion_greedy_equals_generate(client, live_server):
    name = live_server[0].model_name
    out = client.completions.create(model=name, prompt="Once upon a time", max_tokens=8,
                                    temperature=0)
    assert out.choices[0].text == solo_text("Once upon a time", 8)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 8


def test_streamed_completion_is_the_same_text(client, live_server):
    name = live_server[0].model_name
    chunks = list(client.completions.create(model=name, prompt="Once upon a time",
                                            max_tokens=8, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == solo_text("Once upon a time", 8)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_completion_streamed_and_not(client, live_server):
    name = live_server[0].model_name
    msgs = [{"role": "user", "content": "Hi!"}]
    full = client.chat.completions.create(model=name, messages=msgs, max_tokens=6,
                                          temperature=0)
    text = full.choices[0].message.content
    parts = list(client.chat.completions.create(model=name, messages=msgs, max_tokens=6,
                                                temperature=0, stream=True))
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == text
    assert full.choices[0].finish_reason in ("stop", "length")


def test_stream_options_include_usage_ends_with_the_counts(client, live_server):
    """OpenAI's ``stream_options={"include_usage": True}``: every chunk has usage None
    but the last, which has no choices and the counts of the non-streamed answer."""
    name = live_server[0].model_name
    msgs = [{"role": "user", "content": "Hi!"}]
    full = client.chat.completions.create(model=name, messages=msgs, max_tokens=5,
                                          temperature=0)
    parts = list(client.chat.completions.create(model=name, messages=msgs, max_tokens=5,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
    assert all(p.usage is None for p in parts[:-1]) and parts[-1].choices == []
    assert parts[-1].usage.model_dump() == full.usage.model_dump()
    assert parts[-2].choices[0].finish_reason == full.choices[0].finish_reason
    plain = list(client.completions.create(model=name, prompt="The cat", max_tokens=3,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": False}))
    assert all(p.choices for p in plain) and all(p.usage is None for p in plain)


def test_concurrent_requests_each_get_their_solo_result(client, live_server):
    name = live_server[0].model_name
    prompts = ["a", "The cat", "1 2 3", "Once upon a time", "xyz"]
    results = {}

    def ask(p):
        results[p] = client.completions.create(model=name, prompt=p, max_tokens=6,
                                               temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {p: solo_text(p, 6) for p in prompts}


def test_stop_strings_end_the_text(client, live_server):
    name = live_server[0].model_name
    full = solo_text("Once upon a time", 12)
    stop = full[3:5]
    if not stop or full.find(stop) < 1:
        pytest.skip("no usable stop string in the random model's text")
    out = client.completions.create(model=name, prompt="Once upon a time", max_tokens=12,
                                    temperature=0, stop=[stop])
    assert out.choices[0].text == full[:full.find(stop)]
    assert out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"prompt": "x", "max_tokens": -1}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x", "max_tokens": "5"}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x", "temperature": -0.5}).encode(), 400, "temperature"),
    (json.dumps({"prompt": "x", "top_p": 0}).encode(), 400, "top_p"),
    (json.dumps({"prompt": 5}).encode(), 400, "prompt"),
    (json.dumps({"prompt": ""}).encode(), 400, "prompt"),
    (json.dumps({"prompt": "x", "model": "gpt-4"}).encode(), 404, "does not exist"),
    (json.dumps({"prompt": "x", "stop": 3}).encode(), 400, "stop"),
    (json.dumps({"prompt": "x", "n": 2}).encode(), 400, "n = 1"),
    (json.dumps({"prompt": "x", "max_tokens": 10 ** 6}).encode(), 400, "context"),
    (json.dumps({"prompt": [1, 2, 10 ** 9]}).encode(), 400, "token ids"),
    (json.dumps({"prompt": "x", "stream_options": {"include_usage": True}}).encode(), 400,
     "only allowed when 'stream' is true"),
    (json.dumps({"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}).encode(),
     400, "stream_options"),
])
def test_bad_requests_get_openai_errors(live_server, body, status, fragment):
    _, url = live_server
    r = httpx.post(f"{url}/v1/completions", content=body,
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status
    err = r.json()["error"]
    assert fragment in err["message"] and err["type"]


def test_bad_chat_messages_are_400(live_server):
    _, url = live_server
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "wizard"}]},
                   timeout=30)
    assert r.status_code == 400 and "role" in r.json()["error"]["message"]


def test_a_client_that_disconnects_cancels_its_sequence(live_server):
    server, url = live_server
    with httpx.stream("POST", f"{url}/v1/completions",
                      json={"prompt": "Once", "max_tokens": 5000, "temperature": 0,
                            "stream": True}, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break                        # one chunk, then hang up
    import time
    deadline = time.time() + 30
    while server.engine.runner.busy and time.time() < deadline:
        time.sleep(0.05)
    assert not server.engine.runner.busy, "the abandoned sequence still decodes"


def test_maxdecl_serve_starts_answers_and_stops_on_sigterm():
    import signal
    import subprocess
    import sys
    import time

    import socket

    with socket.socket() as sock:                 # a free port on the loopback
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "maxdecl", "serve", str(SPECS / "llama3.yaml"),
                             "--port", str(port), "--parallel", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                       json={"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0},
                       timeout=60)
        assert r.json()["choices"][0]["text"] == solo_text("Once upon a time", 4)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
