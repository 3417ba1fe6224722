"""What every strategy runs on: the model runner and its lean forward, the ragged KV cache, the prefix cache
of prompt blocks computed before, the batch with its prefill and plain steps, sampling and log-probabilities."""
