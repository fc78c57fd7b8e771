"""What keeps a run alive: checkpoints (orbax, sealed and verified),
preemption, divergence (non-finite steps skipped or halted on, loss
spikes), distributed start-up and the metric writers. None of it knows an
objective or the config; the trainer and fine-tuning call it."""
