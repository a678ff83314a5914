"""Tokens to text and back: the checkpoint's tokenizer (tokenizer.py) and each sequence's
incremental detokenizer (detokenizer.py)."""
