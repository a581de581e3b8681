"""A framework's own loop as the trial: the user's trainer runs the steps, isoprobe's step report reads them.

runners.py   which runner a spec's model source needs, and the readings and cycle every runner reports
lightning_runner.py  Lightning's own ``fit`` as the trial (the user's LightningModule and datamodule)
hf_trainer_runner.py the Hugging Face ``Trainer``'s own ``train`` (and its evaluation) as the trial
"""
