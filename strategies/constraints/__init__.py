"""Structured outputs: a row's `response_format` compiled to a grammar (`grammars`), a matcher per row
that follows its emitted tokens, and the masks that keep the target's choices inside the grammar at
every slot where a token is chosen, plain steps and verify forwards alike (`masks`, `drafts`)."""
