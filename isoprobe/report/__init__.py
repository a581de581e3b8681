"""The answer: the ``Result`` contract and every view rendered from it. Pure; both sides use the models.

    result.py    the one JSON document ``isoprobe run`` prints, as a pydantic model
    outcomes.py  how a trial ended (the six outcomes), the stop reasons, the OOM classifier
    steady.py    the steady-state rule a trial's peaks are judged by (the child and the parent apply it alike)
    output.py    progress lines on stderr, the table, the JSON on stdout
    shell.py     the result as shell variables (``--format env``)
    plot.py      the picture of a probe (optional extra ``isoprobe[plot]``)
    frontier.py  ``isoprobe frontier``'s document (FrontierResult) and its table
    frontier_plot.py  the picture of a frontier: the maximum over the field's values
    streams.py   where isoprobe's words go, and what happens when a destination cannot take them
"""
