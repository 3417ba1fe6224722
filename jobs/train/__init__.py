"""Training jobs that build the shipped default model family: tokenizer, target LM, distilled draft.

`accelgen train tokenizer|lm|draft|eval CONFIG.yaml key=value…` (see `jobs.train.cli`). Each job
reads one typed config (`jobs.train.config`; `config_heads` and `config_fine_tune` for the jobs that
start from a trained target), and the model jobs share one resumable training loop
(`jobs.train.loop`), so checkpointing, determinism and progress reporting live in one place.
"""
