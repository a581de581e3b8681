"""The answer: the ``Result`` contract and every view rendered from it. Pure; both sides use the models.

result.py    the one JSON document ``isoprobe run`` prints, as a pydantic model: the root ``Result``, its
             version, size limit and exit codes, and every part's name re-exported
trial.py     one trial as the result records it: its readings, its exception, what its step ran with, its ranks
device.py    where the trials ran: the device and its capacity, the allocator, the host and GPUs, the gang
edge.py      how sure the maximum is: the spread's margin, marginal batches, the token budget's lengths, the
             edge under each allocator, the dataset's worst batch
insights.py  what the trials tell besides the edge: the memory line, where the memory goes, throughput, the estimate
recommendation.py  the recommended batch, its soaks, and the accumulation plan for a global batch
strict.py    the base of the documents' models: a field nobody declared is refused
outcomes.py  how a trial ended (the six outcomes), the stop reasons, the OOM classifier
steady.py    the steady-state rule a trial's peaks are judged by (the child and the parent apply it alike)
cycle.py     the script's cycle: a command trial that decides the maximum waits for its first evaluation pass
batch_check.py  did a command trial train at its batch: the trial's record, the rule across trials
rank_progress.py  how far each rank of a command got, and the words for a rank behind the others
output.py    progress lines on stderr, the table, the JSON on stdout
stop.py      the document of a stop the probe gave no result for (a bad spec, a ProbeError, an early signal)
assemble.py  the Result of a probe that ran its trials, assembled in one place from the pipeline's parts
shell.py     the result as shell variables (``--format env``)
plot.py      the picture of a probe (optional extra ``isoprobe[plot]``)
frontier.py  ``isoprobe frontier``'s document (FrontierResult) and its table
frontier_plot.py  the picture of a frontier: the maximum over the field's values
streams.py   where isoprobe's words go, and what happens when a destination cannot take them
"""
