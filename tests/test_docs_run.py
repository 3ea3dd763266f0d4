"""The docs' commands and Python snippets, run as written on tiny settings (slow).

Every command of README.md and docs/*.md that tests/test_docs.py's NOT_RUN does not list
runs here as a subprocess, page by page and in each page's order, in one sandbox: a
folder with the repository's launch.py, configs/ and transformer/ linked in (the
commands' `runs/...` land there), `../shared/data` made of tiny files (Tiny
Shakespeare's input.txt, a Multi30k folder, an SST-2 folder), and the absolute paths
the docs use (`/tmp/...`, `/data/...`) moved under the sandbox. So a page's training
command makes the run its later commands evaluate, translate or plot. Training commands
get tiny_settings() appended. Each command must exit as the doc shows (0, or 2 where
its transcript shows a ConfigError) and leave what it promises (promised()).
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import doc_commands
from tiny import subprocess_env
from test_docs import COMMANDS, not_run_reason, runnable

ROOT = doc_commands.ROOT
pytestmark = [pytest.mark.slow, pytest.mark.long]  # long: one test, 34 min on 2 cores.

# Pages whose runs other pages read go first (README.md trains runs/gpt_small_local, which
# modes.md plots and python.md loads; results.md trains runs/transformer_base_multi30k
# and runs/shakespeare_rope256, which modes.md reads: test_docs.py's MADE_ON_ANOTHER_PAGE);
# the other pages follow in doc_commands.doc_files() order.
FIRST_PAGES = ("README.md", "docs/results.md")
# The docs' absolute paths, moved into the sandbox.
MOVED_PATHS = ("/tmp/", "/data/")
_WORDS = ("the a man woman dog cat child girl boy group of people two three is are sits "
          "stands runs plays walks on in at near with under beach street snow park water "
          "field grass red blue green white black shirt hat ball truck house").split()
# With endings: enough distinct pieces for TINY's 448-piece SentencePiece vocabularies.
_WORDS += [w + ending for w in _WORDS for ending in ("s", "ed", "ing", "ly", "er")]


def _sentences(n: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(_WORDS, size=rng.integers(4, 10))).capitalize() + "."
          for _ in range(n)]


def write_shared_data(shared: str) -> None:
  """Tiny stand-ins for ../shared/data: the files the docs' commands read."""
  os.makedirs(os.path.join(shared, "tiny_shakespeare"))
  with open(os.path.join(shared, "tiny_shakespeare", "input.txt"), "w", encoding="utf-8") as f:
    # Every capital, as the real text has (docs/modes.md's passkey uses A-J), first: the
    # character vocabulary is the training split's, the text's start.
    f.write("ALL:\nABCDEFGHIJKLMNOPQRSTUVWXYZ.\n\n"
            + "\n\n".join(f"ROMEO:\n{s}" for s in _sentences(600, 0)) + "\n")
  os.makedirs(os.path.join(shared, "multi30k"))
  for split, n in (("train", 300), ("val", 24), ("test_2016_flickr", 12)):
    english = _sentences(n, len(split))
    for language, lines in (("en", english), ("de", [s.upper() for s in english])):
      with open(os.path.join(shared, "multi30k", f"{split}.{language}"), "w",
                encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
  os.makedirs(os.path.join(shared, "sst2"))
  for split, n in (("train", 200), ("dev", 24)):
    rows = [f"{s}\t{int('dog' in s)}" for s in _sentences(n, len(split) + 10)]
    with open(os.path.join(shared, "sst2", f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("\n".join(["sentence\tlabel"] + rows) + "\n")


def write_corpus(folder: str) -> None:
  """A tiny jsonl corpus where docs/corpus.md's FineWeb folder would be."""
  os.makedirs(folder)
  with open(os.path.join(folder, "part-0.jsonl"), "w", encoding="utf-8") as f:
    # 8000 documents: docs/corpus.md's val_fraction=0.001 leaves a few for validation.
    for s in _sentences(8000, 7):
      f.write(json.dumps({"text": s}) + "\n")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> str:
  """The folder the commands run in (see the module docstring); returns its repo/ folder."""
  root = str(tmp_path_factory.mktemp("docs"))
  repo = os.path.join(root, "repo")
  os.makedirs(repo)
  for name in ("launch.py", "configs", "transformer", "benchmarks", "requirements.txt",
               "requirements-test.txt"):
    os.symlink(os.path.join(ROOT, name), os.path.join(repo, name))
  write_shared_data(os.path.join(root, "shared", "data"))
  write_corpus(os.path.join(root, "data", "fineweb-edu", "sample", "10BT"))
  os.makedirs(os.path.join(root, "tmp"))
  write_hub_folders(repo)
  return repo


# docs/huggingface.md's folders (fetched there with network) -> the tiny folders of the
# same families that tests/test_hf_import.py checks (tests/fixtures/hf).
HUB_FOLDERS = {"gpt2": "gpt2", "bert": "bert", "opus-mt-en-de": "marian"}


def write_hub_folders(repo: str) -> None:
  """hf/<name> as the doc's download would leave it, and the doc's my_text.txt."""
  os.makedirs(os.path.join(repo, "hf"))
  for name, fixture in HUB_FOLDERS.items():
    os.symlink(os.path.join(ROOT, "tests", "fixtures", "hf", fixture),
               os.path.join(repo, "hf", name))
  with open(os.path.join(repo, "my_text.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(_sentences(300, 3)) + "\n")


def _moved(arg: str, repo: str) -> str:
  """/tmp/x and /data/x inside the sandbox (beside repo/)."""
  root = os.path.dirname(repo)
  for prefix in MOVED_PATHS:
    arg = re.sub(rf"(^|=|,){re.escape(prefix)}", rf"\g<1>{root}{prefix}", arg)
  return arg


def _flag(argv, name: str, default=None):
  """The last --name=value of argv (absl: the last one wins)."""
  values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
  return values[-1] if values else default


# Training in seconds: each key's value at most this (a smaller value of the command's or
# the preset's stays). A SentencePiece vocabulary of 448 pieces from 20k lines: the
# offline corpus has 359 characters, and training 32768 on its 704k lines takes minutes.
# Steps and cadences give 3 checkpoints (2, 4, 6), as docs/modes.md's `--average_last=3`
# needs, and 2 evaluations; the model is 1-2 layers of width 32.
TINY = {"train.num_steps": 6, "optimizer.warmup_steps": 2, "train.eval_every": 3, "train.log_every": 1,
        "checkpoint.every": 2, "train.eval_batches": 2, "train.steps_per_call": 1,
        "train.bleu_examples": 2, "data.batch_size": 4, "model.d_model": 32,
        "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
        "model.num_layers": 2, "model.num_decoder_layers": 1, "data.spm_vocab_size": 448,
        "model.vocab_size": 448, "data.spm_train_sentences": 20000,
        "model.num_experts": 4, "decode.max_length_offset": 8}
# Flags of the reading modes, where a command gives them, kept small the same way (the
# tiny hub folders' context is 32 tokens: no room for 40 new ones).
TINY_FLAGS = {"passkey_trials": 1, "max_new_tokens": 8}


def _swept_keys(spec: str, repo: str) -> set[str]:
  """The config keys a --sweep value varies: `key=v1,v2;...` or a JSON file's grid/list."""
  if not spec.endswith(".json"):
    return {key.removeprefix("config.") for key in re.findall(r"(?:^|;)([\w.]+)=", spec)}
  with open(os.path.join(repo, spec), encoding="utf-8") as f:
    grid = json.load(f)
  return {key.removeprefix("config.") for run in (grid if isinstance(grid, list) else [grid])
          for key in run}


def tiny_settings(argv: list[str], repo: str) -> list[str]:
  """The flags appended to a command so that it runs in seconds on a CPU, in the sandbox.

  Any command with --config: the sandbox's TFDS data_dir (datasets, vocabularies and
  prepared corpora are built there, not in ~/tensorflow_datasets). Training (train,
  sweep) and compile (the model alone, COMPILE_KEEPS stay): each TINY key the config
  holds with a larger value; keys a --sweep varies stay the sweep's (a sweep refuses a
  --config.x that it also varies), and a run that starts from init_from keeps its
  source's model.
  """
  mode = _flag(argv, "mode", "train")
  extra = [f"--{k}={v}" for k, v in TINY_FLAGS.items() if _flag(argv, k) is not None]
  config_arg = _flag(argv, "config")
  if config_arg is None:  # A reading mode on its run's config, or --help.
    return extra
  extra.append(f"--config.data.data_dir={os.path.join(os.path.dirname(repo), 'tfds')}")
  if mode not in ("train", "sweep", "compile"):
    return extra
  path, _, arg = config_arg.partition(":")
  namespace: dict = {}
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    exec(compile(f.read(), path, "exec"), namespace)  # pylint: disable=exec-used
  config = namespace["get_config"](arg) if arg else namespace["get_config"]()
  varied = _swept_keys(_flag(argv, "sweep", ""), repo)
  for key, value in TINY.items():
    group, name = key.split(".")
    current = config[group].get(name)
    if (key in varied or isinstance(current, bool) or not isinstance(current, int)
        or (group == "model" and _flag(argv, "config.init_from"))
        or (mode == "compile" and key in COMPILE_KEEPS)):
      continue
    if current > value:
      extra.append(f"--config.{key}={value}")
  return extra


# A compile keeps its command's batch (it splits over the mesh the command names): only
# the model shrinks.
COMPILE_KEEPS = ("data.batch_size", "train.microbatches")


def _expected_error(command: doc_commands.Command) -> str | None:
  """`ConfigError` where the doc's transcript shows the command failing with one."""
  match = re.match(r"(\w+Error):", command.output[0]) if command.output else None
  return match.group(1) if match else None


def promised(command: doc_commands.Command, argv: list[str], redirect: str | None, repo: str,
             out: str) -> str | None:
  """What the command promises and did not leave (None: all there)."""
  mode = _flag(argv, "mode", "train")
  workdir = _flag(argv, "workdir")
  if workdir is None and _flag(argv, "config"):
    import launch  # pylint: disable=g-import-not-at-top
    workdir = launch.default_workdir(_flag(argv, "config"))
  where = os.path.join(repo, workdir) if workdir else None
  output = _flag(argv, "output")
  checks = {
      "train": lambda: os.path.isfile(os.path.join(where, "metrics.jsonl")),
      "sweep": lambda: os.path.isfile(os.path.join(where, "compare.md")),
      "compare": lambda: os.path.isfile(os.path.join(where, "compare.md")),
      "plot": lambda: glob.glob(os.path.join(where, "plots", "*.png")),
      "evaluate": lambda: "Wrote " in out,
      "benchmark": lambda: "Wrote " in out,
      "average": lambda: os.path.isdir(os.path.join(repo, output)),
      "keys": lambda: "model.d_model" in out,
  }
  if output and mode != "average" and not os.path.exists(os.path.join(repo, output)):
    return f"no --output {output}"
  if mode in ("translate", "generate") and not output and not out.strip():
    return "printed nothing"
  if redirect and not os.path.getsize(os.path.join(repo, redirect)):
    return f"{redirect} is empty"
  if command.argv[:2] == ("python", "launch.py") and "--help" not in argv and (
      mode in checks and not checks[mode]()):
    return f"--mode={mode} left no result"
  return None


def run_command(command: doc_commands.Command, repo: str, again: bool = False) -> str | None:
  """Runs one doc command in the sandbox; what went wrong, or None.

  `again`: the same command already ran in this sandbox (two pages show the same
  evaluation): it gets --overwrite, as a user rerunning it would be told to pass.
  """
  argv = [_moved(a, repo) for a in command.argv]
  if argv[:2] == ["python", "launch.py"]:
    argv = [sys.executable] + argv[1:] + tiny_settings(argv, repo)
    if again and _flag(argv, "mode") in ("evaluate", "translate", "generate", "classify",
                                         "passkey", "benchmark"):  # Those with --overwrite.
      argv.append("--overwrite")
  # The tests' XLA settings (LLVM at -O0, no fusion emitters: tests/conftest.py), as every
  # launch.py the tests start has them (tiny.subprocess_env): the same commands, compiled
  # in less time, on one CPU device.
  env = subprocess_env()
  env.update(command.env)
  redirect = _moved(command.stdout, repo) if command.stdout else None
  stdout = open(os.path.join(repo, redirect), "w", encoding="utf-8") if redirect \
      else subprocess.PIPE
  with stdout if redirect else open(os.devnull, encoding="utf-8"):
    result = subprocess.run(argv, cwd=repo, env=env, input=command.stdin,
                            stdout=stdout, stderr=subprocess.PIPE, text=True,
                            timeout=600, check=False)
  out = (result.stdout or "") + result.stderr
  error = _expected_error(command)
  if error:
    if result.returncode != 2 or f"{error}:" not in out:
      return f"exit {result.returncode}, expected 2 with {error}: {out[-1500:]}"
    return None
  if result.returncode:
    return f"exit {result.returncode}: {out[-3000:]}"
  return promised(command, argv, redirect, repo, out)


def _pages() -> list[str]:
  pages = doc_commands.doc_files()
  return list(FIRST_PAGES) + [p for p in pages if p not in FIRST_PAGES]


def test_every_doc_command_runs_as_written(sandbox):
  """Every command not in NOT_RUN, page by page in order (a page's runs feed its later
  commands); all failures reported together, each with its file:line."""
  failures, ran = [], set()
  for page in _pages():
    commands = sorted((c for c in COMMANDS if c.path == page), key=lambda c: c.line)
    for command in commands:
      if not_run_reason(command) is not None:
        continue
      assert runnable(command), command.where  # test_docs.py holds this too.
      problem = run_command(command, sandbox, again=command.text in ran)
      ran.add(command.text)
      if problem:
        failures.append(f"{command.where}: `{command.text}`: {problem}")
  assert not failures, "\n\n".join(failures)
  assert len(ran) >= 30
