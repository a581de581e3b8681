"""A module that runs a parallel torch operation when imported, as a library computing a table might.

After it, the importing process has started OpenMP's thread pool, and a fork of
it hangs in its first parallel region (tests/integration/test_fork_server.py).
"""

import torch

TABLE = torch.ones(1 << 20).tanh_()
