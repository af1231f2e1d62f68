"""`neuronxcc.nki.typing` / `nki.typing` (through openneuron.nki.alias()): the shape annotations
NKI's examples write on tiles, `src: nt.tensor[128, 512] = nl.load(src_tensor)`, and 0.x's
`nt.mutable_tensor` on parameters. Annotations only: Python does
not evaluate a local variable's annotation, and `tensor[...]` checks nothing when it is."""


class _TensorAnnotation:
    """`tensor[128, 512]`: itself, whatever the subscript."""

    def __getitem__(self, shape):
        return self

    def __repr__(self):
        return "nki.typing.tensor"


tensor = _TensorAnnotation()
mutable_tensor = tensor  # 0.x: a parameter the kernel writes (nki-library's annotation)
