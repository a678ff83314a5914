"""Structured outputs: what a request's output must match (params.py: a JSON schema, a regex,
a choice, a grammar), the request fields that ask for it (request.py) and the size limits
checked first (limits.py), grammars compiled in bounded worker processes (compiler.py), and
the per-sequence matchers whose token masks the sampler applies (grammar.py)."""
