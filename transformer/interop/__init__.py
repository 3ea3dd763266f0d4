"""Other libraries' formats in and out; today Hugging Face folders (hf/).

May import: config, sharding, model, data, inference, workdir.
"""
