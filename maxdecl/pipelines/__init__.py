"""Generation pipelines: tokenizers, argument checks (``params``), sampling, stop strings,
the generation loop, the kernel compile timer, and the ``run`` and ``quantize`` commands
(faces: nothing in the library imports them)."""
