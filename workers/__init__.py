"""The generator actor: model loading, row batching, and decoding a work unit with a strategy."""
