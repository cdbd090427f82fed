"""Generation pipelines: tokenizers, sampling, the generation loop, run and quantize."""
