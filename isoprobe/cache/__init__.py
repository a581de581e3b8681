"""The answer store (parent only): answers kept on disk, trusted only while what produced them is unchanged.

    store.py    the cache: its key, reading and writing entries
    trust.py    whether an entry can be the truth (its answer must follow from its own trials)
    sources.py  the user's files a probe ran or read, and whether they changed
    arguments.py  what a command's words name (files hashed, folders listed), for its key
    threads.py  the intra-op threads a CPU trial will run, predicted without torch (part of the key)

Its files are opened through ``system.files`` (a folder others can write, read without trusting it).
"""
