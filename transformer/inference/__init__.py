"""Using a trained model: loading it without training, decoding, text in and out.

  loaded.py    a run from its workdir (config, tokenizer, parameters in the model's
               shardings; no optimizer, no Trainer), checkpoint selection and averaging
  decoding.py  KV-cached generation: greedy, sampling, beam search; decoder and enc-dec
  text.py      text -> ids -> length-sorted batches -> decoding -> text; sacreBLEU/chrF
  passkey.py   passkey retrieval: synthetic prompts (a key hidden in filler at a depth),
               scored as greedy decoding of the key in one teacher-forced pass

May import: config, sharding, model, data, workdir.
"""
