"""A vendored fork of tqdm (test material for tests/commands/vendored_first.py; not the installed package).

The same name as the installed ``tqdm``, and the calls a training loop makes of it (``tqdm(iterable, desc=...,
total=..., mininterval=...)``, ``update``, ``set_postfix``, ``close``, ``tqdm.write``, ``trange``), with one change
of the fork's: the progress bar keeps the last ``keep`` items it yielded (2 by default, a preview of the recent
batches for a dashboard), so a loop over batches holds that many more batches than with the installed tqdm. The
script that vendors it puts this folder first on ``sys.path``; what it imports decides how much memory a batch
needs.
"""

import sys
import time
from collections import deque

__version__ = "4.70.1+vendored.keep"
__all__ = ["tqdm", "trange", "__version__"]

VENDORED = True


class tqdm:
    """An iterable wrapper that prints a progress line now and then and keeps the last ``keep`` items."""

    def __init__(self, iterable=None, desc=None, total=None, file=None, mininterval=0.1, disable=False, keep=2,
                 **_ignored):
        self.iterable, self.desc, self.total, self.disable = iterable, desc or "", total, disable
        self.file = file if file is not None else sys.stderr
        self.mininterval = mininterval
        self.n = 0
        self.postfix = ""
        self.recent = deque(maxlen=keep)
        self._last_print = time.monotonic()

    def __iter__(self):
        for item in self.iterable:
            self.recent.append(item)
            yield item
            self.update(1)

    def __len__(self):
        return self.total if self.total is not None else len(self.iterable)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def update(self, n=1):
        self.n += n
        now = time.monotonic()
        if not self.disable and now - self._last_print >= self.mininterval:
            self._last_print = now
            total = f"/{self.total}" if self.total is not None else ""
            self.file.write(f"\r{self.desc}: {self.n}{total} {self.postfix}")
            self.file.flush()

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        items = dict(ordered_dict or {}, **kwargs)
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def close(self):
        self.recent.clear()
        if not self.disable:
            self.file.write("\n")
            self.file.flush()

    @classmethod
    def write(cls, s, file=None, end="\n"):
        out = file if file is not None else sys.stdout
        out.write(s + end)
        out.flush()


def trange(*args, **kwargs):
    return tqdm(range(*args), **kwargs)
