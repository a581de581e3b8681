"""The contract between the parent and a trial's process: typed requests in, typed events out.

Both sides import this package; it imports neither side (only ``spec`` and ``report``), and never torch.

    messages.py  the events, as pydantic models, and how they are written and read; names every model
    requests.py  the requests (a trial's, the environment check's) and the fork server's orders and replies
    command.py   the lines a command trial's shim writes from the user's processes, typed for the supervisor
    warm_command.py  a command started ahead: which commands can be, its plan, the words to it
    wiring.py    the names that wire a child to its parent: its module, arguments, environment variables
"""
