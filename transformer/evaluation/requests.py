"""Log-likelihood requests as token ids, and their packing into the rows a batch holds.

A request is (context ids, continuation ids); what it asks is log p(continuation |
context) and whether the continuation is the greedy one. `Encoding` makes them from
text exactly as lm-evaluation-harness 0.4.13's Hugging Face backend does (its
`TemplateLM.loglikelihood`, `_encode_pair`, `HFLM.tok_encode` and
`loglikelihood_rolling`, with its default settings), for both --mode=benchmark and
the harness model (harness.py): one encoder for both paths.

  - special tokens as the model's own tokenizer adds them: an imported Hugging Face
    tokenizer's post-processor (GPT-2's adds no bos, T5's a final </s>); a tokenizer
    of this project's own runs ([bos] first, as the run's documents start; an
    encoder-decoder's source ends with [eos], as its pairs do);
  - a context's trailing whitespace (`rstrip()`: spaces, newlines, tabs) moves to the
    continuation; a causal model's context + continuation is encoded whole and the
    context's ids split off, a seq2seq model's are encoded apart (the continuation
    without special tokens);
  - an empty context is the prefix token (the tokenizer's bos, else its eos), unless
    the continuation starts with it;
  - a text's rolling windows: every token once, each window predicted with the most
    context the row allows, the first after the prefix token.

`refusal` says which requests lm-eval's HF backend refuses (its assertions): a
context of no token, a continuation longer than the window. Their documents are
left out and counted, never scored in part.

Packing (`pack`, a decoder), so that short requests do not each pay for a whole row:
  - left truncation: a request longer than the context (`length` + 1 tokens, the last
    one only a target) keeps its last `length` + 1 tokens, as lm-eval does; it is
    counted (`PackedRequests.truncated`); the continuation is always scored whole;
  - shared inputs: a request whose input (its tokens but the last) is a prefix of
    another's is read from that one's segment: the logits at a position depend only on
    the tokens before it (causal attention), so the lettered choices of a
    multiple-choice prompt (" A", " B", ... after one context) and a document's repeats
    cost one segment. Its own last target gets a slot of its own at that position
    (`slots` targets a position, the first the host's);
  - segments: the remaining inputs are placed best-fit, longest first, into rows of
    `length` tokens with segment ids and positions from 0, the packed-document layout
    training rows have, so attention never crosses requests.
A prefix LM (a decoder whose objective feeds the batch field `prefix`) reads each
request's context as its bidirectional prefix (`pack(..., prefix=True)`: 1 on the
context tokens a segment keeps; inputs are shared only between requests of one
context, since every prefix token sees the whole prefix).
`pack_pairs` (an encoder-decoder, lm-eval's seq2seq backend): the context is the
encoder's input (its last `length` tokens), the continuation the decoder's target
after [bos]; pair k of a row has segment id k + 1 on both sides, the seq2seq
pipeline's layout.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Iterator, Sequence

import numpy as np

from transformer.data.tokenizers import hf_vocab
from transformer.data.tokenizers import vocabularies

Request = tuple[tuple[int, ...], tuple[int, ...]]  # (context ids, continuation ids).

# Why lm-eval 0.4.13's HF backend refuses a request (an assertion in its
# _loglikelihood_tokens), by key of the counts a result reports.
REFUSALS = {
    "empty_context": "the context encodes to no token",
    "continuation_longer_than_window": "the continuation has more tokens than the window",
}


class Encoding:
  """Text -> requests as lm-eval 0.4.13's HF backend makes them for one run (module
  docstring). `seq2seq`: an encoder-decoder (lm-eval's seq2seq backend)."""

  def __init__(self, tokenizer: Any, seq2seq: bool = False):
    self.tokenizer, self.seq2seq = tokenizer, seq2seq
    self.imported = isinstance(tokenizer, hf_vocab.HFTokenizer)
    if self.imported:
      # lm-eval's prefix_token_id: the tokenizer's bos, else its eos. An import's bos row
      # is config.json's bos for a decoder but the decoder's start token for an
      # encoder-decoder (T5, Marian), whose tokenizers have no bos: eos there.
      hf = int(tokenizer.internal_to_hf[vocabularies.EOS_ID if seq2seq
                                        else vocabularies.BOS_ID])
      if hf < 0:
        hf = int(tokenizer.internal_to_hf[vocabularies.EOS_ID])
      self.prefix_id = int(tokenizer.hf_to_internal[hf])
      self._prefix_text = tokenizer.token(self.prefix_id)
    else:
      self.prefix_id, self._prefix_text = vocabularies.BOS_ID, ""

  def _ids(self, text: str) -> list[int]:
    return [int(i) for i in self.tokenizer.encode(text)]

  def encode(self, text: str, special: bool | None = None) -> list[int]:
    """lm-eval's `tok_encode`: the ids of `text` with the tokenizer's special tokens
    (`special` None: unless the text starts with the prefix token's string)."""
    if special is None:
      special = not (self._prefix_text and text.startswith(self._prefix_text))
    if not special:
      return self._ids(text)
    if self.imported:
      return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=True)]
    ids = self._ids(text)
    return ids + [vocabularies.EOS_ID] if self.seq2seq else [vocabularies.BOS_ID] + ids

  def pair(self, context: str, continuation: str) -> Request:
    """lm-eval's `loglikelihood` split of one (context, continuation) of text."""
    if not context:
      ids = self.encode(continuation, special=False)
      if ids and ids[0] == self.prefix_id:
        return tuple(ids[:1]), tuple(ids[1:])
      return (self.prefix_id,), tuple(ids)
    spaces = len(context) - len(context.rstrip())
    if spaces:
      context, continuation = context[:-spaces], context[-spaces:] + continuation
    head = self.encode(context)
    if self.seq2seq:
      return tuple(head), tuple(self.encode(continuation, special=False))
    return tuple(head), tuple(self.encode(context + continuation)[len(head):])

  def rolling(self, text: str, length: int) -> list[Request]:
    """lm-eval's `loglikelihood_rolling` windows of `text` for a window of `length`
    tokens (get_rolling_token_windows with context_len 1, made disjoint): every token
    of `encode(text)` once, the first window after the prefix token."""
    tokens = self.encode(text)
    if not tokens:
      return []
    first = min(length, len(tokens))
    windows = [((self.prefix_id,), tuple(tokens[:first]))]
    predicted = first
    while predicted < len(tokens):
      size = min(len(tokens) - predicted, length)
      end = predicted + size
      context = tokens[end - length - 1:end - 1]
      windows.append((tuple(context[:len(context) - (size - 1)]), tuple(tokens[end - size:end])))
      predicted = end
    return windows

  def describe(self) -> dict[str, Any]:
    """What this run's requests start and end with, for its record and its first line."""
    plain = self._ids("a")
    full = self.encode("a", special=True)
    at = next((i for i in range(len(full) - len(plain) + 1)
               if full[i:i + len(plain)] == plain), 0)
    before, after = full[:at], full[at + len(plain):]
    source = ("as the imported tokenizer.json's post-processor adds them" if self.imported
              else "as this project's runs " + (
                  "end a source with [eos]" if self.seq2seq else "start a document with [bos]"))
    return {"backend": "seq2seq" if self.seq2seq else "causal", "bos": bool(before),
            "special_before": before, "special_after": after,
            "prefix_token": self.prefix_id, "rule": source}

  def sentence(self) -> str:
    """One line saying how this run's requests are encoded."""
    d = self.describe()
    bos = ("bos first" if d["bos"] else "no bos") + (
        f", ids {d['special_after']} after a text" if d["special_after"] else "")
    return (f"requests encoded as lm-eval 0.4.13's {d['backend']} HF backend does: {bos}, "
            f"{d['rule']}; an empty context is token {d['prefix_token']}")


def refusal(request: Request, length: int) -> str | None:
  """The REFUSALS key lm-eval's HF backend refuses `request` for with a window of
  `length` tokens, or None when it is scored."""
  context, continuation = request
  if not context:
    return "empty_context"
  if len(continuation) > length:
    return "continuation_longer_than_window"
  return None


@dataclasses.dataclass
class PackedRequests:
  """Requests laid out in rows of `length` tokens; per request where its scores are.

  `arrays`: the batch fields of the rows, [rows, length] each (a decoder's inputs,
  segment_ids, positions; an encoder-decoder's inputs, inputs_segment_ids,
  inputs_positions, decoder_inputs, targets_segment_ids, targets_positions) and
  targets [rows, length, slots] (slot 0: the segment's own next token; others:
  riders' last targets). Per request: its row, the scored positions [start, end) of
  that row, the slot of its last target, its continuation ids, and whether its
  context was truncated.
  """
  arrays: dict[str, np.ndarray]
  row: np.ndarray
  start: np.ndarray
  end: np.ndarray
  last_slot: np.ndarray
  continuations: list[np.ndarray]
  truncated: np.ndarray
  segments: int  # Segments placed (requests minus those read from another's).

  @property
  def num_rows(self) -> int:
    return self.arrays["targets"].shape[0]

  def batches(self, batch_size: int, share: tuple[int, int] = (0, 1)
              ) -> Iterator[dict[str, np.ndarray]]:
    """This process's rows of each global batch of `batch_size` rows (the last padded
    with empty rows): `share` = (index, count), the process's input shard."""
    index, count = share
    local = batch_size // count
    for first in range(0, self.num_rows, batch_size):
      rows = np.arange(first, first + batch_size)[index * local:(index + 1) * local]
      real = rows[rows < self.num_rows]
      batch = {}
      for key, array in self.arrays.items():
        part = np.zeros((len(rows),) + array.shape[1:], array.dtype)
        part[:len(real)] = array[real]
        batch[key] = part
      yield batch

  def scores(self, logp: np.ndarray, greedy_ids: np.ndarray, which: np.ndarray,
             first_row: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Requests `which`'s continuation log-likelihoods and whether each is greedy.

    `logp` [rows, length, slots]: log p(target slot) at each position and `greedy_ids`
    [rows, length] the argmax token there, for the rows from `first_row` on (a batch's).
    """
    loglik, greedy = np.zeros(len(which), np.float64), np.zeros(len(which), bool)
    for k, i in enumerate(which):
      row, start, end = self.row[i] - first_row, self.start[i], self.end[i]
      loglik[k] = (float(np.sum(logp[row, start:end - 1, 0], dtype=np.float64))
                   + float(logp[row, end - 1, self.last_slot[i]]))
      greedy[k] = bool(np.array_equal(greedy_ids[row, start:end], self.continuations[i]))
    return loglik, greedy


def _check_scorable(requests: Sequence[Request], length: int) -> None:
  """Never a request scored in part: the caller leaves refused ones out (`refusal`)."""
  for i, request in enumerate(requests):
    if not request[1]:
      raise ValueError(f"request {i} has no continuation token")
    why = refusal(request, length)
    if why:
      raise ValueError(f"request {i}: {REFUSALS[why]} ({length} tokens); lm-eval refuses "
                       "it and so does this scorer")


def pack(requests: Sequence[Request], length: int, slots: int = 8,
         max_segments: int = 0, prefix: bool = False) -> PackedRequests:
  """Lays a decoder's `requests` out in rows of `length` tokens (module docstring).

  `max_segments` > 0: at most that many segments a row (cuDNN's packed attention
  layout, model.attention_max_segments; 1: one a row). `prefix`: a prefix LM, which
  reads each request's (kept) context as its bidirectional prefix: `arrays["prefix"]`
  is 1 on those tokens, and only requests with the same context share a segment.

  Raises:
    ValueError: a request with no continuation token, or one lm-eval refuses
      (`refusal`; the caller names its document).
  """
  _check_scorable(requests, length)
  n = len(requests)
  inputs, conts, truncated = [], [], np.zeros(n, bool)
  for i, (context, continuation) in enumerate(requests):
    full = tuple(context) + tuple(continuation)
    if len(full) - 1 > length:
      full, truncated[i] = full[-(length + 1):], True
    inputs.append(full[:-1])
    conts.append(np.asarray(continuation, np.int32))
  # The context tokens a segment keeps (all of the input but the continuation's).
  prefixes = [len(x) - (len(c) - 1) for x, c in zip(inputs, conts)] if prefix else None
  host, last_slot, extra = _share_inputs(inputs, conts, slots, prefixes)
  hosts = sorted({h for h in host}, key=lambda h: (-len(inputs[h]), h))
  row_of, offset_of, num_rows = _best_fit([len(inputs[h]) for h in hosts], length,
                                           max_segments)
  shape = (num_rows, length)
  arrays = dict(inputs=np.zeros(shape, np.int32), segment_ids=np.zeros(shape, np.int32),
                positions=np.zeros(shape, np.int32),
                targets=np.zeros(shape + (slots,), np.int32))
  if prefix:
    arrays["prefix"] = np.zeros(shape, np.int32)
  placed: dict[int, tuple[int, int]] = {}
  next_segment = np.ones(num_rows, np.int32)
  for h, row, offset in zip(hosts, row_of, offset_of):
    ids = np.asarray(inputs[h], np.int32)
    span = slice(offset, offset + len(ids))
    arrays["inputs"][row, span] = ids
    arrays["segment_ids"][row, span] = next_segment[row]
    next_segment[row] += 1
    arrays["positions"][row, span] = np.arange(len(ids))
    if prefix:
      arrays["prefix"][row, offset:offset + prefixes[h]] = 1
    # The segment's own targets: the next input token, then its last continuation token.
    arrays["targets"][row, span, 0] = np.append(ids[1:], conts[h][-1])
    placed[h] = (row, offset)
  for (h, position), targets in extra.items():  # Riders' last targets, slots 1..
    row, offset = placed[h]
    arrays["targets"][row, offset + position, 1:1 + len(targets)] = targets
  row = np.asarray([placed[host[i]][0] for i in range(n)], np.int64)
  offset = np.asarray([placed[host[i]][1] for i in range(n)], np.int64)
  end = offset + np.asarray([len(x) for x in inputs], np.int64)
  start = end - np.asarray([len(c) for c in conts], np.int64)
  return PackedRequests(arrays=arrays, row=row, start=start, end=end,
                        last_slot=np.asarray(last_slot), continuations=conts,
                        truncated=truncated, segments=len(hosts))


def pack_pairs(requests: Sequence[Request], length: int, max_segments: int = 0
               ) -> PackedRequests:
  """Lays an encoder-decoder's `requests` out in rows of `length` tokens a side: the
  context (its last `length` tokens; truncation counted) on the encoder side, the
  continuation as the decoder's target after [bos] (module docstring). A pair takes
  the same span on both sides, the longer side's length, placed best-fit.

  Raises:
    ValueError: as `pack`.
  """
  _check_scorable(requests, length)
  n = len(requests)
  sources = [tuple(c)[-length:] for c, _ in requests]
  conts = [np.asarray(x, np.int32) for _, x in requests]
  truncated = np.asarray([len(c) > length for c, _ in requests], bool)
  order = sorted(range(n), key=lambda i: (-max(len(sources[i]), len(conts[i])), i))
  row_of, offset_of, num_rows = _best_fit(
      [max(len(sources[i]), len(conts[i])) for i in order], length, max_segments)
  shape = (num_rows, length)
  keys = ("inputs", "inputs_segment_ids", "inputs_positions", "decoder_inputs",
          "targets_segment_ids", "targets_positions")
  arrays = {key: np.zeros(shape, np.int32) for key in keys}
  arrays["targets"] = np.zeros(shape + (1,), np.int32)
  row, start = np.zeros(n, np.int64), np.zeros(n, np.int64)
  next_segment = np.ones(num_rows, np.int32)
  for i, r, offset in zip(order, row_of, offset_of):
    segment, next_segment[r] = next_segment[r], next_segment[r] + 1
    source, target = np.asarray(sources[i], np.int32), conts[i]
    span = slice(offset, offset + len(source))
    arrays["inputs"][r, span] = source
    arrays["inputs_segment_ids"][r, span] = segment
    arrays["inputs_positions"][r, span] = np.arange(len(source))
    span = slice(offset, offset + len(target))
    arrays["decoder_inputs"][r, span] = np.append(vocabularies.BOS_ID, target[:-1])
    arrays["targets_segment_ids"][r, span] = segment
    arrays["targets_positions"][r, span] = np.arange(len(target))
    arrays["targets"][r, span, 0] = target
    row[i], start[i] = r, offset
  end = start + np.asarray([len(c) for c in conts], np.int64)
  return PackedRequests(arrays=arrays, row=row, start=start, end=end,
                        last_slot=np.zeros(n, np.int64), continuations=conts,
                        truncated=truncated, segments=n)


def _share_inputs(inputs: list[tuple[int, ...]], conts: list[np.ndarray], slots: int,
                  prefixes: Sequence[int] | None = None
                  ) -> tuple[list[int], list[int], dict[tuple[int, int], list[int]]]:
  """Per request: the request whose segment it is read from (itself or a longer one
  whose input starts with its input), the slot of its last target, and the riders'
  targets by (host, position). `prefixes`: each input's bidirectional prefix length
  (a prefix LM): a rider's must equal its host's, since every prefix token sees the
  whole prefix.

  In sorted order a sequence's extensions follow it directly, so each input is a
  prefix of the next one's or of none (within one prefix length).
  """
  prefixes = prefixes or [0] * len(inputs)
  order = sorted(range(len(inputs)), key=lambda i: (prefixes[i], inputs[i]))
  host = list(range(len(inputs)))
  last_slot = [0] * len(inputs)
  extra: dict[tuple[int, int], list[int]] = {}
  for k in range(len(order) - 2, -1, -1):
    i, j = order[k], order[k + 1]
    if prefixes[i] != prefixes[j] or inputs[j][:len(inputs[i])] != inputs[i]:
      continue
    h = host[j]
    position = len(inputs[i]) - 1
    target = int(conts[i][-1])
    own = (int(inputs[h][position + 1]) if position + 1 < len(inputs[h])
           else int(conts[h][-1]))
    taken = extra.setdefault((h, position), [])
    if target == own:
      slot = 0
    elif target in taken:
      slot = 1 + taken.index(target)
    elif len(taken) < slots - 1:
      taken.append(target)
      slot = len(taken)
    else:
      continue  # Every slot of that position is taken: a segment of its own.
    host[i], last_slot[i] = h, slot
  return host, last_slot, extra


def _best_fit(lengths: Sequence[int], length: int, max_segments: int = 0
              ) -> tuple[list[int], list[int], int]:
  """Row and offset of each segment (longest first), each into the fullest row it fits
  (a row holds at most `max_segments` segments when > 0)."""
  free: list[tuple[int, int]] = []  # (room left, row) of rows that take more, sorted.
  used: list[int] = []
  count: list[int] = []
  rows, offsets = [], []
  for size in lengths:
    at = bisect.bisect_left(free, (size, -1))
    if at < len(free):
      room, row = free.pop(at)
    else:
      room, row = length, len(used)
      used.append(0)
      count.append(0)
    rows.append(row)
    offsets.append(used[row])
    used[row] += size
    count[row] += 1
    if room - size > 0 and not 0 < max_segments <= count[row]:
      bisect.insort(free, (room - size, row))
  return rows, offsets, len(used)
