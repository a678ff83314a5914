"""The model and what makes one: the Llama-family decoder (model.py) over paged attention's
portable torch path (attention.py, the reference and fallback the fast path plugs in
behind), the subset of config.json it needs (model_config.py), loading a Hugging Face
checkpoint (loader.py) or drawing random weights on the device (dummy_weights.py), and
 (make_model.py), which writes a random checkpoint with a tokenizer and a
family's chat template (chat_templates.py). progress.py draws the progress of these long
commands on stderr."""
