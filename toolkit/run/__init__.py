"""The run pipeline and what a run is made of: the pipeline itself, the built-in trainer, the parameter server, elastic training, preemption, checkpoints, data, schedules, metrics, quiet logs."""
