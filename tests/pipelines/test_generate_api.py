

def test_tokens_of_several_rows_a_sequence_are_not_a_language_model():
    """``tokens`` ``[codebooks*batch, seq]`` (MusicGen's layout) is not driven by the
    generic loop: the model says so instead of failing on the first step's shape."""
    from types import SimpleNamespace as NS

    from maxdecl.model import _one_sequence_of_tokens

    for shape, ok in ((("seq",), True), (("batch", "seq"), True), ((1, "seq"), True),
                      (("3*batch", "seq"), False), (("batch", "k", "seq"), False)):
        graph = NS(inputs=[NS(name="tokens", type=NS(shape=shape))])
        assert _one_sequence_of_tokens(graph) is ok, shape
