"""Other libraries' formats in and out; today Hugging Face folders (hf/).

May import: configuration, sharding, model, data, inference, workdir.
"""
