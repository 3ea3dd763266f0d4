"""Log-likelihood requests as token ids, and their packing into the rows a batch holds.

A request is (context ids, continuation ids); what it asks is log p(continuation |
context) and whether the continuation is the greedy one. Text becomes ids as
lm-evaluation-harness's causal models make them (`encode_pair`: a context's trailing
spaces move to the continuation; the whole is encoded and the context's ids split
off), after [bos], as every training document here starts.

Packing (`pack`), so that short requests do not each pay for a whole row:
  - left truncation: a request longer than the context (`length` + 1 tokens, the last
    one only a target) keeps its last `length` + 1 tokens, as lm-eval does; it is
    counted (`PackedRequests.truncated`);
  - shared inputs: a request whose input (its tokens but the last) is a prefix of
    another's is read from that one's segment: the logits at a position depend only on
    the tokens before it (causal attention), so the lettered choices of a
    multiple-choice prompt (" A", " B", ... after one context) and a document's repeats
    cost one segment. Its own last target gets a slot of its own at that position
    (`slots` targets a position, the first the host's);
  - segments: the remaining inputs are placed best-fit, longest first, into rows of
    `length` tokens with segment ids and positions from 0, the packed-document layout
    training rows have, so attention never crosses requests.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Iterator, Sequence

import numpy as np

from transformer.data.tokenizers import vocabularies

Request = tuple[tuple[int, ...], tuple[int, ...]]  # (context ids, continuation ids).


def encode_pair(tokenizer: vocabularies.Tokenizer, context: str,
                continuation: str) -> Request:
  """([bos] + context ids, continuation ids), split as lm-eval's TemplateLM splits them.

  Trailing spaces of the context move to the continuation; context + continuation is
  encoded whole and the context's own ids split off, so a tokenizer that merges across
  the boundary scores the continuation as it would be written.
  """
  spaces = len(context) - len(context.rstrip(" "))
  if spaces:
    context, continuation = context[:-spaces], context[-spaces:] + continuation
  whole = [int(i) for i in tokenizer.encode(context + continuation)]
  head = [int(i) for i in tokenizer.encode(context)] if context else []
  return (vocabularies.BOS_ID, *head), tuple(whole[len(head):])


def rolling_windows(ids: Sequence[int], length: int) -> list[Request]:
  """A text's requests for its whole log-likelihood: every token once, each window of
  `length` tokens predicted with the most context the row allows (lm-eval's
  loglikelihood_rolling); the first predicts after [bos]."""
  tokens = (vocabularies.BOS_ID, *map(int, ids))
  windows = []
  for start in range(0, len(tokens) - 1, length):
    continuation = tokens[start + 1:start + 1 + length]
    # Inputs are context + continuation but its last token: `length` of them at most.
    context = tokens[max(0, start + 1 - (length + 1 - len(continuation))):start + 1]
    windows.append((context, continuation))
  return windows


@dataclasses.dataclass
class PackedRequests:
  """Requests laid out in rows of `length` tokens; per request where its scores are.

  Row arrays: inputs, segment_ids, positions [rows, length] and targets [rows, length,
  slots] (slot 0: the segment's own next token; others: riders' last targets).
  Per request: its row, the scored positions [start, end) of that row, the slot of
  its last target, its continuation ids as scored (after truncation), and whether it
  was truncated.
  """
  inputs: np.ndarray
  segment_ids: np.ndarray
  positions: np.ndarray
  targets: np.ndarray
  row: np.ndarray
  start: np.ndarray
  end: np.ndarray
  last_slot: np.ndarray
  continuations: list[np.ndarray]
  truncated: np.ndarray
  segments: int  # Segments placed (requests minus those read from another's).

  @property
  def num_rows(self) -> int:
    return self.inputs.shape[0]

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
      for key in ("inputs", "segment_ids", "positions", "targets"):
        array = getattr(self, key)
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


def pack(requests: Sequence[Request], length: int, slots: int = 8,
         max_segments: int = 0) -> PackedRequests:
  """Lays `requests` out in rows of `length` tokens (module docstring).

  `max_segments` > 0: at most that many segments a row (cuDNN's packed attention
  layout, model.attention_max_segments; 1: one a row).

  Raises:
    ValueError: a request with no continuation token (the caller names its document).
  """
  n = len(requests)
  inputs, conts, truncated = [], [], np.zeros(n, bool)
  for i, (context, continuation) in enumerate(requests):
    if not continuation:
      raise ValueError(f"request {i} has no continuation token")
    full = tuple(context) + tuple(continuation)
    if len(full) - 1 > length:
      full, truncated[i] = full[-(length + 1):], True
    cont = min(len(continuation), len(full) - 1)
    inputs.append(full[:-1])
    conts.append(np.asarray(full[-cont:], np.int32))
  host, last_slot, extra = _share_inputs(inputs, conts, slots)
  hosts = sorted({h for h in host}, key=lambda h: (-len(inputs[h]), h))
  row_of, offset_of, num_rows = _best_fit([len(inputs[h]) for h in hosts], length,
                                           max_segments)
  shape = (num_rows, length)
  arrays = dict(inputs=np.zeros(shape, np.int32), segment_ids=np.zeros(shape, np.int32),
                positions=np.zeros(shape, np.int32),
                targets=np.zeros(shape + (slots,), np.int32))
  placed: dict[int, tuple[int, int]] = {}
  next_segment = np.ones(num_rows, np.int32)
  for h, row, offset in zip(hosts, row_of, offset_of):
    ids = np.asarray(inputs[h], np.int32)
    span = slice(offset, offset + len(ids))
    arrays["inputs"][row, span] = ids
    arrays["segment_ids"][row, span] = next_segment[row]
    next_segment[row] += 1
    arrays["positions"][row, span] = np.arange(len(ids))
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
  return PackedRequests(row=row, start=start, end=end, last_slot=np.asarray(last_slot),
                        continuations=conts, truncated=truncated, segments=len(hosts),
                        **arrays)


def _share_inputs(inputs: list[tuple[int, ...]], conts: list[np.ndarray], slots: int
                  ) -> tuple[list[int], list[int], dict[tuple[int, int], list[int]]]:
  """Per request: the request whose segment it is read from (itself or a longer one
  whose input starts with its input), the slot of its last target, and the riders'
  targets by (host, position).

  In sorted order a sequence's extensions follow it directly, so each input is a
  prefix of the next one's or of none.
  """
  order = sorted(range(len(inputs)), key=lambda i: inputs[i])
  host = list(range(len(inputs)))
  last_slot = [0] * len(inputs)
  extra: dict[tuple[int, int], list[int]] = {}
  for k in range(len(order) - 2, -1, -1):
    i, j = order[k], order[k + 1]
    if inputs[j][:len(inputs[i])] != inputs[i]:
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
