"""Model pipeline tests: maxdecl logits against Hugging Face transformers and GGUF.

Helpers live in modelhelp.py (imported by name). torch and transformers are needed
only here; the tests skip without them.
"""

import pytest


@pytest.fixture(autouse=True)
def _torch_setup():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
