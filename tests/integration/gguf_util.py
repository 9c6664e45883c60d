"""Reading a GGUF's metadata through the gguf package (not luainfer's
parser), for tests that check what luainfer reports about a file."""


def gguf_field(reader, key):
    """The scalar or string value of key in a gguf.GGUFReader."""
    import gguf

    f = reader.fields[key]
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else int(v[0])
