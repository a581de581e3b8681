"""The question: what the user asks, as one validated ``Spec``. Pure (no processes, no torch); both sides use it.

model.py            the root ``Spec``, the rules across its sections; re-exports the section modules' names
model_section.py    the ``model`` section: which network to train, its six sources and their libraries
input_target.py     the ``input`` and ``target`` sections: the synthetic batch and what the loss compares
training.py         the ``optimizer`` and ``training`` sections: how one step runs
search_section.py   the ``search`` section: where the search starts and stops, and what one trial is
recommendation.py   the ``recommendation`` and ``plan`` sections: what the answer advises
size_fields.py      the size fields' types: '8GiB' read into bytes before the strict type check
base.py             the base of every section: unknown keys and wrong types are errors
distributed.py      the ``distributed`` section: the strategy the real job trains with
data.py             the ``data`` section: the user's dataset, and the rule that picks its worst batch
lightning.py        the ``lightning`` section: the Trainer arguments of model.lightning that change memory
load.py             a file, a dict or a ``Spec`` (with overrides) -> one validated ``Spec``
yaml_file.py        a spec file's bytes -> plain data, or one ``SpecError``
plain.py            data that was never YAML text, held to the file's rules
overrides.py        ``--set FIELD=VALUE``, the named flags, ``probe()``'s overrides
units.py            byte sizes as people write and read them
safe_read.py        reading a file a user named without hanging or filling memory
catalog.py          which torchvision model names exist, without importing torch
job.py              the real job's world size, from the variables torchrun and Slurm set
command.py          a spec whose trials run the job's own command: its argv at one batch, and what must hold
"""
